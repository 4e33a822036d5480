"""Loops under a Supervisor, the probes and stopping: liveness and readiness tell the truth
(a pass past its bound, a thread that exited, the age of the last success), and a stop ends
idle threads promptly. No services; time moves through an injected clock, never through
fixed sleeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from shared.runtime.supervisor import Loop, Supervisor
from tests.support.wait import wait_for
from tests.unit.fake_clock import FakeClock


def _started(loop: Loop, stop_afterwards: Callable[[Supervisor], None],
             clock: FakeClock | None = None) -> tuple[Supervisor, FakeClock]:
    """A supervisor on a fake clock watching `loop`, started, and stopped after the test."""
    clock = clock or FakeClock()
    sup = Supervisor("test", clock=clock)
    sup.watch(loop)
    stop_afterwards(sup)
    sup.start()
    return sup, clock


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
    sup, clock = _started(loop, stop_afterwards, FakeClock(offset=-100.0))
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

    sup, clock = _started(Slow(), stop_afterwards)
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


def test_a_probe_while_a_loop_is_starting_its_threads_does_not_see_an_exited_thread(
        stop_afterwards, monkeypatch):
    """A liveness probe between a loop thread being created and started saw a thread that
    was not alive and said it had exited: a 503 at start-up, which the orchestrator would
    answer by killing a healthy process."""

    class Idle(Loop):
        name = "idle"
        idle_seconds = 30.0

        def run_once(self, now=None):
            return 0

    loop = Idle()
    sup = Supervisor("test")
    sup.watch(loop)
    stop_afterwards(sup)
    seen: list[tuple[bool, str]] = []
    start = threading.Thread.start

    def probing_start(thread: threading.Thread) -> None:
        seen.append(sup.live())  # what a probe arriving just now would be told
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", probing_start)
    sup.start()
    monkeypatch.undo()
    assert seen and all(ok for ok, _ in seen), seen
    assert sup.live()[0], sup.live()


def test_a_pass_past_its_stall_time_is_logged_once_then_its_end(stop_afterwards, caplog):
    gates = [threading.Event() for _ in range(3)]
    entered = [threading.Event() for _ in range(3)]
    passes: list[int] = []

    class Hung(Loop):
        name = "hung"
        pass_bound_seconds = None
        stall_log_seconds = 10.0

        def run_once(self, now=None):
            n = min(len(passes), 2)
            passes.append(n)
            entered[n].set()
            gates[n].wait(30)
            return 1

    loop = Hung()
    caplog.set_level("INFO", logger="tock.supervisor")
    sup, clock = _started(loop, stop_afterwards)
    assert entered[0].wait(10)
    sup.report_stalls()
    assert "loop_stalled" not in caplog.text  # not yet 10 s
    clock.advance(11.0)
    sup.report_stalls()
    sup.report_stalls()
    assert caplog.text.count("loop_stalled") == 1  # once per pass, however often asked
    gates[0].set()
    assert entered[1].wait(10)  # the next pass, stuck too: a new stall, logged again
    assert "loop_resumed" in caplog.text
    clock.advance(11.0)
    sup.report_stalls()
    assert caplog.text.count("loop_stalled") == 2
    gates[1].set()
    gates[2].set()
    loop.stop()
    assert loop.join(5)



def test_each_stalled_thread_of_a_loop_is_named_in_its_line(stop_afterwards, caplog):
    """A loop of two threads, both stuck: two `loop_stalled` lines, told apart by thread
    (they were identical, which read as one line logged twice)."""
    entered = threading.Semaphore(0)
    release = threading.Event()

    class Pair(Loop):
        name = "pair"
        threads = 2
        pass_bound_seconds = None
        stall_log_seconds = 10.0

        def run_once(self, now=None):
            entered.release()
            release.wait(30)
            return 1

    loop = Pair()
    caplog.set_level("INFO", logger="tock.supervisor")
    sup, clock = _started(loop, stop_afterwards)
    assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
    clock.advance(11.0)
    sup.report_stalls()
    threads = sorted(r.fields["thread"] for r in caplog.records  # type: ignore[attr-defined]
                     if r.getMessage() == "loop_stalled")
    assert threads == [0, 1]
    release.set()
    wait_for(lambda: caplog.text.count("loop_resumed") == 2, timeout=10,
             message="both passes ended")
    loop.stop()
    assert loop.join(5)


def test_a_loop_whose_passes_may_run_long_is_never_logged_as_stalled(stop_afterwards, caplog):
    entered, release = threading.Event(), threading.Event()

    class Handler(Loop):
        name = "handler"
        pass_bound_seconds = None
        stall_log_seconds = None

        def run_once(self, now=None):
            entered.set()
            release.wait(30)
            return 0

    loop = Handler()
    sup, clock = _started(loop, stop_afterwards)
    assert entered.wait(10)
    clock.advance(3600.0)
    sup.report_stalls()
    assert "loop_stalled" not in caplog.text
    release.set()
    loop.stop()
    assert loop.join(5)


def test_a_vacuum_within_its_statement_timeout_is_not_logged_as_a_stall(stop_afterwards,
                                                                         caplog):
    """The statistics loop's VACUUM may rightly run up to its statement timeout (60 s):
    a WARNING saying Postgres or SQS hung would send an operator chasing nothing."""
    from shared.store.statistics_store import VACUUM_TIMEOUT_MS
    from timer_service.statistics import Statistics

    entered, release = threading.Event(), threading.Event()

    class Store:
        def stale(self):
            return False

        def dead_rows(self):
            return 50_000, 10, True

        def vacuum(self):
            entered.set()
            release.wait(30)

    loop = Statistics(Store(), interval_seconds=3600)  # type: ignore[arg-type]
    caplog.set_level("INFO", logger="tock.supervisor")
    sup, clock = _started(loop, stop_afterwards)
    assert entered.wait(10)
    clock.advance(VACUUM_TIMEOUT_MS / 1000 - 1)
    sup.report_stalls()
    assert "loop_stalled" not in caplog.text
    clock.advance(30.0)  # past its own timeout: something else is wrong, and it is said
    sup.report_stalls()
    assert "loop_stalled" in caplog.text
    release.set()
    loop.stop()
    assert loop.join(5)
