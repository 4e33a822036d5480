"""Loops under a Supervisor: expected errors are waited out, anything else stops the process,
and the liveness and readiness probes tell the truth. No services; time moves through an
injected clock, never through fixed sleeps."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from shared.core.errors import Retryable, TransportError
from shared.runtime import supervisor as supervisor_module
from shared.runtime.supervisor import Loop, Supervisor
from tests.support.wait import wait_for

LOGGER = "tock.supervisor"


class FakeClock:
    """time.monotonic() shifted by an offset the test moves (Loop records pass starts and
    successes with time.monotonic(), so the two clocks must agree)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def fast_backoff(monkeypatch):
    """Retry after a millisecond instead of 0.1 s doubling to 1 s."""
    monkeypatch.setattr(supervisor_module, "MIN_BACKOFF_SECONDS", 0.001)
    monkeypatch.setattr(supervisor_module, "MAX_BACKOFF_SECONDS", 0.002)


@pytest.fixture
def stop_afterwards():
    """Supervisors to stop at the end of the test, whatever happened."""
    started: list[Supervisor] = []
    yield started.append
    for sup in started:
        sup.stop(timeout=5)


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


def test_liveness_fails_when_a_pass_runs_past_its_bound(stop_afterwards):
    entered, release = threading.Event(), threading.Event()

    class Stuck(Loop):
        name = "stuck"
        pass_bound_seconds = 0.05

        def run_once(self, now=None):
            entered.set()
            release.wait(30)
            return 0

    loop = Stuck()
    # Start well in the past so the real time the test takes cannot exceed the bound.
    clock = FakeClock(offset=-100.0)
    sup = Supervisor("test", clock=clock)
    sup.watch(loop)
    stop_afterwards(sup)
    sup.start()
    assert entered.wait(10)
    try:
        assert sup.live()[0], sup.live()
        clock.advance(101.0)  # the pass has now run for more than a second
        ok, reason = sup.live()
        assert not ok
        assert reason.startswith("loop stuck: a pass has run for")
        assert not sup.ready()[0]
        assert sup.fatal is None  # not live, but not a crash
    finally:
        release.set()
    loop.stop()
    assert loop.join(5)


def test_a_loop_without_a_pass_bound_is_never_too_slow(stop_afterwards):
    entered, release = threading.Event(), threading.Event()

    class Slow(Loop):
        name = "slow"
        pass_bound_seconds = None

        def run_once(self, now=None):
            entered.set()
            release.wait(30)
            return 0

    clock = FakeClock()
    sup = Supervisor("test", clock=clock)
    sup.watch(Slow())
    stop_afterwards(sup)
    sup.start()
    assert entered.wait(10)
    try:
        clock.advance(10**6)
        assert sup.live()[0], sup.live()
    finally:
        release.set()


class IdleLoop(Loop):
    name = "idler"
    idle_seconds = 3600.0

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0
        self.passed = threading.Event()
        self._lock = threading.Lock()

    def run_once(self, now=None):
        with self._lock:
            self.passes += 1
        self.passed.set()
        return 0


def test_liveness_fails_when_a_thread_exited_without_a_stop():
    loop = IdleLoop()
    sup = Supervisor("test")
    sup.watch(loop)
    loop.start(sup)
    assert loop.passed.wait(10)
    assert loop.problem(time.monotonic()) is None
    # Make the thread end as if it had died, then pretend nobody asked it to stop.
    loop._stop.set()
    assert loop.join(5)
    loop._stop.clear()
    problem = loop.problem(time.monotonic())
    assert problem == "loop idler: thread tock-idler-0 has exited"
    assert sup.live() == (False, problem)
    loop._stop.set()  # once stopping, an ended thread is expected
    assert loop.problem(time.monotonic()) is None


def test_readiness_follows_the_last_success():
    class Gate(Loop):
        name = "gate"
        ready_within_seconds = 5.0

    loop = Gate()
    clock = FakeClock()
    sup = Supervisor("test", clock=clock)
    sup.watch(loop)
    assert sup.live()[0], sup.live()
    assert sup.ready() == (False, "no successful gate pass yet")
    loop.mark_ok()
    ok, reason = sup.ready()
    assert ok, reason
    assert reason.startswith("last successful pass: gate ")
    clock.advance(4.0)
    assert sup.ready()[0], sup.ready()
    clock.advance(2.0)
    ok, reason = sup.ready()
    assert not ok
    assert reason.startswith("last successful gate pass ")
    assert "(limit 5 s)" in reason
    assert sup.live()[0]  # an old success makes the process unready, not dead
    clock.offset = 0.0
    loop.mark_ok()
    assert sup.ready()[0], sup.ready()


def test_loops_that_do_not_gate_readiness_are_ignored():
    sup = Supervisor("test")
    sup.watch(IdleLoop())
    assert sup.ready() == (True, "ready")


@pytest.mark.parametrize("threads", [1, 3])
def test_stop_ends_idle_threads_promptly(threads):
    loop = IdleLoop()
    loop.threads = threads
    sup = Supervisor("test")
    sup.watch(loop)
    sup.start()
    wait_for(lambda: loop.passes >= threads, timeout=10, message="a pass on every thread")
    assert len(loop._threads) == threads
    assert all(t.is_alive() for t in loop._threads)
    began = time.monotonic()
    sup.stop(timeout=5)
    assert loop.join(0)
    assert not any(t.is_alive() for t in loop._threads)
    assert time.monotonic() - began < 5
    assert loop.passes == threads  # idling, no extra passes after the stop
    assert loop.problem(time.monotonic()) is None
