"""Every long-running loop of a process has one shape (`Loop`) and runs under one
`Supervisor`, so that no thread dies unnoticed and the health probes tell the truth.

    loop.run_once(now)    one pass; returns how much work it did (tests call it directly)
    loop.start()/stop()   the pass on its own thread(s), until stopped

What a loop thread does with an error a pass raises:
- `Retryable` (the store's verdict: connection lost, deadlock, timeout) or `TransportError`
  (SQS): logged, then the pass runs again after a backoff (0.1 s doubling to 1 s, reset by
  the first success). Repeats of the same error are collapsed into one line every 30 s.
- anything else (a bug, a `DatabaseBug`, even `KeyboardInterrupt` in a thread): logged
  with its traceback as `loop_crashed`, and the supervisor stops the process, which exits
  non-zero so that ECS or Kubernetes restart it. Recovering in place from an error nobody
  anticipated would hide it.
- `GivingUp`: the loop found the process cannot work again until it restarts; the same
  stop, logged as `loop_gave_up` with its reason and no traceback.

Liveness (`Supervisor.live`) fails when a loop thread has exited, a loop crashed, or a
pass has run longer than its loop's `pass_bound_seconds`. Readiness (`Supervisor.ready`)
fails while a loop with `ready_within_seconds` has not succeeded that recently. A pass
running past its loop's `stall_log_seconds` is logged once (`loop_stalled`, then
`loop_resumed` when it ends; `Supervisor.report_stalls`, called every second by the
process), so a Postgres or SQS that hangs without an error shows in the logs too.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.errors import ConfigError, GivingUp, Retryable, TransportError
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import emit

log = logging.getLogger("tock.supervisor")

MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 1.0
"""Short on purpose: after an outage every loop is working again within about a second of
the service coming back."""
REPEAT_LOG_SECONDS = 30.0

EXPECTED = (Retryable, TransportError)
"""Errors a loop waits out and retries."""


@dataclass
class _Beat:
    """What one loop thread last did, by the monotonic clock."""

    started: float | None = None
    """Start of the pass in progress; None between passes."""
    finished: float | None = None
    succeeded: float | None = None
    stalled: float | None = None
    """The start of the pass last logged as stalled."""


DEFAULT_PASS_BOUND_SECONDS = 120.0
"""A loop's pass running longer fails liveness, unless the loop sets a bound of its own."""


class Loop:
    """Base of every long-running loop. Subclasses set the class attributes and implement
    `run_once`; a pass that returns 0 (nothing to do) is followed by `idle_seconds` of
    sleep, which `stop()` cuts short."""

    name = "loop"
    threads = 1
    idle_seconds = 0.0
    pass_bound_seconds: float | None = DEFAULT_PASS_BOUND_SECONDS
    """A pass running longer than this makes the process not live (None: no bound)."""
    ready_within_seconds: float | None = None
    """The process is ready only while this loop succeeded this recently (None: ignored)."""
    stall_log_seconds: float | None = 10.0
    """A pass running longer than this is logged once, long before `pass_bound_seconds`
    fails liveness (None: never, for a loop whose passes may rightly run long)."""
    explicit_success = False
    """True: a pass is a success only if it calls `mark_ok()` (for a loop most of whose
    passes only check a clock, so that neither its readiness nor a `loop_recovered` line
    can come from a pass that never reached what it depends on)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._beats: list[_Beat] = []
        self._failures = _FailureLog()
        self.supervisor: Supervisor | None = None
        self.crashed: BaseException | None = None

    def run_once(self, now: datetime | None = None) -> int:
        """One pass; returns how much it did. `now` pins the database clock (tests)."""
        raise NotImplementedError

    # --- threads ----------------------------------------------------------------------------

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Run passes on `threads` daemon threads until `stop()`."""
        self.supervisor = supervisor
        self._stop.clear()
        for index in range(self.threads):
            beat = _Beat()
            thread = threading.Thread(target=self._main, args=(beat,), daemon=True,
                                      name=f"tock-{self.name}-{index}")
            self._beats.append(beat)
            thread.start()
            # Listed once started: a liveness probe that ran between the two saw a listed
            # thread that was not alive yet and said the loop had exited (a flaky 503 at
            # start-up, once the timer had more loops to start after it was ready).
            self._threads.append(thread)

    def stop(self) -> None:
        """Ask the threads to finish their current pass and end."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the threads to end; False if one is still running after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        return not any(t.is_alive() for t in self._threads)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True (at once) when the loop is asked to stop."""
        return self._stop.wait(max(seconds, 0.0))

    def idle(self) -> None:
        """Between a pass that found nothing to do and the next: sleep `idle_seconds`
        (loops that can be woken, like the dispatcher on NOTIFY, override this)."""
        if self.idle_seconds:
            self.wait(self.idle_seconds)

    def mark_ok(self) -> None:
        """Record a success that happened outside a pass (e.g. a start-up announcement)."""
        now = time.monotonic()
        for beat in self._beats or [self._spare()]:
            beat.succeeded = now

    def _spare(self) -> _Beat:
        beat = _Beat()
        self._beats.append(beat)
        return beat

    def _main(self, beat: _Beat) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                started = beat.started = time.monotonic()
                did = self.run_once()
                now = time.monotonic()
                beat.started, beat.finished = None, now
                self._resumed(beat, started, now)
                if not self.explicit_success:
                    beat.succeeded = now
                if backoff and beat.succeeded is not None and beat.succeeded >= started:
                    self._failures.recovered(self.name)
                    backoff = 0.0
                if not did:
                    self.idle()
            except EXPECTED as exc:
                beat.started, beat.finished = None, time.monotonic()
                self._resumed(beat, started, beat.finished)
                backoff = min(max(backoff * 2, MIN_BACKOFF_SECONDS), MAX_BACKOFF_SECONDS)
                self._failures.report(self.name, exc, backoff)
                self.wait(backoff)
            except BaseException as exc:  # any other error is a bug: stop the process
                beat.started, beat.finished = None, time.monotonic()
                self.crashed = exc
                if isinstance(exc, GivingUp):
                    emit(log, "loop_gave_up", logging.CRITICAL, loop=self.name,
                         reason=str(exc))
                else:
                    emit(log, "loop_crashed", logging.CRITICAL, loop=self.name,
                         error=_describe(exc),
                         traceback="".join(traceback.format_exception(exc)))
                if self.supervisor is not None:
                    self.supervisor.crash(self, exc)
                return

    def _resumed(self, beat: _Beat, started: float, now: float) -> None:
        if beat.stalled == started:
            emit(log, "loop_resumed", loop=self.name, **self._thread_of(beat),
                 after_s=round(now - started, 1))

    def _thread_of(self, beat: _Beat) -> dict[str, Any]:
        """`thread=N` for a loop of several threads (which one of them), else nothing."""
        return {"thread": self._beats.index(beat)} if len(self._beats) > 1 else {}

    def stalls(self, now: float) -> list[tuple[dict[str, Any], float]]:
        """Each pass running past `stall_log_seconds` and not yet reported (which thread,
        as log fields, and how long it has run); each is reported once."""
        limit = self.stall_log_seconds
        if limit is None:
            return []
        found = []
        for beat in self._beats:
            started = beat.started
            if started is not None and now - started > limit and beat.stalled != started:
                beat.stalled = started
                found.append((self._thread_of(beat), now - started))
        return found

    # --- probes -------------------------------------------------------------------------------

    def problem(self, now: float) -> str | None:
        """Why this loop makes the process not live, or None."""
        if self.crashed is not None:
            return _ended(self.name, self.crashed)
        if not self.stopping:
            for thread in self._threads:
                if not thread.is_alive():
                    return f"loop {self.name}: thread {thread.name} has exited"
        bound = self.pass_bound_seconds
        for beat in self._beats:
            if bound is not None and beat.started is not None and now - beat.started > bound:
                return (f"loop {self.name}: a pass has run for {now - beat.started:.1f} s "
                        f"(bound {bound:g} s)")
        return None

    def unready(self, now: float) -> str | None:
        """Why this loop makes the process not ready, or None."""
        within = self.ready_within_seconds
        if within is None:
            return None
        times = [b.succeeded for b in self._beats if b.succeeded is not None]
        if not times:
            return f"no successful {self.name} pass yet"
        age = now - max(times)
        if age > within:
            return f"last successful {self.name} pass {age:.1f} s ago (limit {within:.0f} s)"
        return None

    def last_success_age(self, now: float) -> float | None:
        times = [b.succeeded for b in self._beats if b.succeeded is not None]
        return now - max(times) if times else None


class Supervisor:
    """The loops of one process. A crash in any of them stops the process (`stop_flag`),
    and `exit_code` tells the process to exit non-zero."""

    def __init__(self, process: str, stop_flag: StopFlag | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.process = process
        self.stop_flag = stop_flag or StopFlag()
        self.clock = clock
        self.loops: list[Loop] = []
        self.fatal: str | None = None
        self.fatal_is_config = False

    def watch(self, *loops: Loop) -> None:
        """Make these loops part of the process (its probes cover them from now on)."""
        self.loops.extend(loops)

    def start(self) -> None:
        """Start every loop watched."""
        for loop in self.loops:
            loop.start(self)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every loop to stop, then wait up to `timeout` for their threads."""
        for loop in self.loops:
            loop.stop()
        for loop in self.loops:
            loop.join(timeout)

    def report_stalls(self) -> None:
        """Log each loop pass that has run past its loop's `stall_log_seconds`, once."""
        now = self.clock()
        for loop in self.loops:
            for thread, seconds in loop.stalls(now):
                emit(log, "loop_stalled", logging.WARNING, process=self.process,
                     loop=loop.name, **thread, running_s=round(seconds, 1),
                     bound_s=loop.pass_bound_seconds,
                     detail="a pass is waiting on something that does not answer (Postgres, "
                            "SQS or CloudWatch hung, a network cut without an error, or a "
                            "lock another session holds on a row or table it writes: see "
                            "pg_locks and pg_stat_activity), or an async handler blocks the "
                            "event loop; past the bound the process is not live and is "
                            "restarted")

    def crash(self, loop: Loop, exc: BaseException) -> None:
        """A loop died of an unexpected error: stop everything, exit non-zero."""
        if self.fatal is None:
            self.fatal = _ended(loop.name, exc)
            self.fatal_is_config = isinstance(exc, ConfigError)
            emit(log, "process_stopping", logging.CRITICAL, process=self.process,
                 reason=self.fatal)
        self.stop_flag.set()

    @property
    def exit_code(self) -> int:
        """0; 2 if a loop found settings that cannot work (as every entry point's
        ConfigError); else 70 (EX_SOFTWARE) after a crash."""
        if not self.fatal:
            return 0
        return 2 if self.fatal_is_config else 70

    def live(self) -> tuple[bool, str]:
        """(ok, reason): every loop thread alive, no pass past its bound, no crash. An
        orderly stop stays live: its drain is bounded (the consumer's grace and last
        writes), and a liveness probe that failed it would have the process killed before
        it released its jobs."""
        now = self.clock()
        if self.fatal:
            return False, self.fatal
        for loop in self.loops:
            problem = loop.problem(now)
            if problem:
                return False, problem
        if self.stop_flag.is_set():
            return True, f"{self.process} is stopping (finishing its work; not ready)"
        return True, f"{self.process}: {len(self.loops)} loops running"

    def ready(self) -> tuple[bool, str]:
        """(ok, reason): live, not stopping, and every loop that gates readiness
        succeeded recently."""
        ok, reason = self.live()
        if not ok:
            return ok, reason
        if self.stop_flag.is_set():
            return False, f"{self.process} is stopping"
        now = self.clock()
        for loop in self.loops:
            why = loop.unready(now)
            if why:
                return False, why
        ages = [(loop.name, loop.last_success_age(now)) for loop in self.loops
                if loop.ready_within_seconds is not None]
        said = ", ".join(f"{n} {a:.1f} s ago" for n, a in ages if a is not None)
        return True, f"last successful pass: {said}" if said else "ready"


class _FailureLog:
    """One line per new error; repeats of the same error once every REPEAT_LOG_SECONDS."""

    def __init__(self) -> None:
        self._last_text: str | None = None
        self._last_logged = 0.0
        self._repeats = 0

    def report(self, loop: str, exc: BaseException, retry_in: float) -> None:
        text = _describe(exc)
        now = time.monotonic()
        if text == self._last_text and now - self._last_logged < REPEAT_LOG_SECONDS:
            self._repeats += 1
            return
        emit(log, "loop_failed", logging.ERROR, loop=loop, error=text,
             retry_in_seconds=round(retry_in, 2), repeats=self._repeats)
        self._last_text, self._last_logged, self._repeats = text, now, 0

    def recovered(self, loop: str) -> None:
        if self._last_text is not None:
            emit(log, "loop_recovered", loop=loop, after_error=self._last_text,
                 repeats=self._repeats)
        self._last_text, self._repeats = None, 0


def _ended(loop: str, exc: BaseException) -> str:
    """Why a loop ended its process, for the probes and the stop line."""
    if isinstance(exc, GivingUp):
        return f"loop {loop} stopped the process: {exc}"
    return f"loop {loop} crashed: {_describe(exc)}"


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ raises still gets a name
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
