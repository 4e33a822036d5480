"""Loops under a Supervisor, and their errors: expected errors are waited out (logged once,
and again only when the error changes), anything else crashes the loop and stops the
process. No services; time moves through an injected clock, never through fixed sleeps."""

from __future__ import annotations

import logging
import threading

import pytest

from shared.core.errors import Retryable, TransportError
from shared.runtime import supervisor as supervisor_module
from shared.runtime.supervisor import Loop, Supervisor
from tests.support.wait import wait_for
from tests.unit.fake_clock import FakeClock

LOGGER = "tock.supervisor"


@pytest.fixture
def fast_backoff(monkeypatch):
    """Retry after a millisecond instead of 0.1 s doubling to 1 s."""
    monkeypatch.setattr(supervisor_module, "MIN_BACKOFF_SECONDS", 0.001)
    monkeypatch.setattr(supervisor_module, "MAX_BACKOFF_SECONDS", 0.002)


def events(caplog, name):
    return [r for r in caplog.records if r.name == LOGGER and r.getMessage() == name]


class FlakyLoop(Loop):
    """Raises the same expected error until `healthy` is set, then succeeds (and idles)."""

    name = "flaky"
    idle_seconds = 3600.0
    ready_within_seconds = 60.0

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.healthy = threading.Event()
        self.failures = 0
        self.successes = 0

    def run_once(self, now=None):
        if not self.healthy.is_set():
            self.failures += 1
            raise self.error
        self.successes += 1
        return 0


@pytest.mark.parametrize("error", [Retryable("connection lost"),
                                   TransportError("SQS unreachable")],
                         ids=["Retryable", "TransportError"])
def test_expected_errors_are_retried_logged_once_and_recovered(
        error, caplog, fast_backoff, stop_afterwards):
    caplog.set_level(logging.INFO, logger=LOGGER)
    loop = FlakyLoop(error)
    sup = Supervisor("test", clock=FakeClock())
    sup.watch(loop)
    stop_afterwards(sup)
    sup.start()

    wait_for(lambda: loop.failures >= 5, timeout=10, message="five failed passes")
    assert all(t.is_alive() for t in loop._threads)
    assert loop.crashed is None
    assert sup.live()[0], sup.live()
    ok, reason = sup.ready()
    assert not ok
    assert reason == "no successful flaky pass yet"
    failed = events(caplog, "loop_failed")
    assert len(failed) == 1, [r.fields for r in failed]
    assert failed[0].levelno == logging.ERROR
    assert failed[0].fields["loop"] == "flaky"
    assert type(error).__name__ in failed[0].fields["error"]

    loop.healthy.set()
    wait_for(lambda: events(caplog, "loop_recovered"), timeout=10, message="loop_recovered")
    recovered = events(caplog, "loop_recovered")
    assert len(recovered) == 1
    assert recovered[0].fields["loop"] == "flaky"
    assert recovered[0].fields["after_error"] == failed[0].fields["error"]
    assert recovered[0].fields["repeats"] == loop.failures - 1
    assert len(events(caplog, "loop_failed")) == 1
    assert loop.successes == 1  # then idles
    assert all(t.is_alive() for t in loop._threads)
    assert sup.live()[0], sup.live()
    ok, reason = sup.ready()
    assert ok, reason
    assert "flaky" in reason
    assert sup.fatal is None
    assert sup.exit_code == 0
    assert not sup.stop_flag.is_set()


def test_a_different_error_is_logged_again(caplog, fast_backoff, stop_afterwards):
    caplog.set_level(logging.INFO, logger=LOGGER)
    messages = iter(["first outage", "first outage", "second outage", "second outage"])
    done = threading.Event()

    class Changing(Loop):
        name = "changing"
        idle_seconds = 3600.0

        def run_once(self, now=None):
            text = next(messages, None)
            if text is None:
                done.set()
                return 0
            raise Retryable(text)

    loop = Changing()
    sup = Supervisor("test")
    sup.watch(loop)
    stop_afterwards(sup)
    sup.start()
    assert done.wait(10)
    assert [r.fields["error"] for r in events(caplog, "loop_failed")] == [
        "Retryable: first outage", "Retryable: second outage"]
    wait_for(lambda: events(caplog, "loop_recovered"), timeout=10, message="loop_recovered")
    assert events(caplog, "loop_recovered")[0].fields["after_error"] == "Retryable: second outage"


class CrashingLoop(Loop):
    name = "crasher"

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def run_once(self, now=None):
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt("boom"),
                                   SystemExit("boom")],
                         ids=["RuntimeError", "KeyboardInterrupt", "SystemExit"])
def test_an_unexpected_error_crashes_the_loop_and_stops_the_process(
        error, caplog, stop_afterwards):
    caplog.set_level(logging.INFO, logger=LOGGER)
    loop = CrashingLoop(error)
    other = FlakyLoop(Retryable("unused"))
    other.healthy.set()
    sup = Supervisor("test")
    sup.watch(other, loop)
    stop_afterwards(sup)
    sup.start()

    wait_for(lambda: sup.fatal, timeout=10, message="the supervisor to record the crash")
    assert loop.join(5)
    assert loop.crashed is error
    crashed = events(caplog, "loop_crashed")
    assert len(crashed) == 1
    assert crashed[0].levelno == logging.CRITICAL
    fields = crashed[0].fields
    assert fields["loop"] == "crasher"
    assert fields["error"] == f"{type(error).__name__}: boom"
    assert "Traceback (most recent call last)" in fields["traceback"]
    assert f"{type(error).__name__}: boom" in fields["traceback"]
    assert "run_once" in fields["traceback"]
    assert len(events(caplog, "process_stopping")) == 1

    assert sup.stop_flag.is_set()
    assert sup.exit_code == 70
    assert "crasher" in sup.fatal
    ok, reason = sup.live()
    assert not ok
    assert "crasher" in reason
    assert type(error).__name__ in reason
    assert not sup.ready()[0]


def test_a_second_crash_keeps_the_first_reason(stop_afterwards):
    first, second = CrashingLoop(RuntimeError("first")), CrashingLoop(RuntimeError("second"))
    first.name, second.name = "one", "two"
    sup = Supervisor("test")
    sup.watch(first, second)
    stop_afterwards(sup)
    sup.start()
    wait_for(lambda: first.crashed and second.crashed, timeout=10, message="both crashes")
    assert first.join(5)
    assert second.join(5)
    assert sup.fatal in ("loop one crashed: RuntimeError: first",
                         "loop two crashed: RuntimeError: second")
    assert sup.exit_code == 70


def test_a_loop_of_explicit_successes_recovers_only_when_it_reaches_its_dependency(
        caplog, fast_backoff, stop_afterwards):
    """Like the lease keeper, whose ticks mostly only check a clock: after a failure, a pass
    that never reached the database is neither logged as a recovery nor counted for
    readiness; the first pass that does (and calls mark_ok) is."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    script = iter(["fail", "tick", "tick"])
    ticks = threading.Semaphore(0)
    reach = threading.Event()

    class Keeper(Loop):
        name = "keeper"
        explicit_success = True
        ready_within_seconds = 5.0

        def run_once(self, now=None):
            step = next(script, "beat")
            if step == "fail":
                raise Retryable("database down")
            if step == "tick":
                ticks.release()
                return 1
            reach.wait(30)  # a beat: only once the test has looked
            if not self.stopping:
                self.mark_ok()
            return 0

        def idle(self):
            self.wait(3600)

    loop = Keeper()
    sup = Supervisor("test", clock=FakeClock())
    sup.watch(loop)
    stop_afterwards(sup)
    sup.start()
    assert ticks.acquire(timeout=10) and ticks.acquire(timeout=10)
    assert events(caplog, "loop_failed") and not events(caplog, "loop_recovered")
    assert sup.ready() == (False, "no successful keeper pass yet")
    reach.set()
    wait_for(lambda: events(caplog, "loop_recovered"), timeout=10, message="loop_recovered")
    assert sup.ready()[0], sup.ready()
    loop.stop()
    reach.set()
