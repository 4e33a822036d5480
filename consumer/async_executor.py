"""Run `async def` handlers: one asyncio event loop per consumer process, on its own thread,
supervised like every other loop.

    claimer ──work──► executor thread ──submit──► event loop (thread tock-async-0)
                                                    one task per job ──► completer

An async job holds its handler slot from claim until its task is done, exactly as a
thread handler does; the executor thread that handed it over is free at once, so the
slots, not the threads, bound how many jobs run. Where tock sets `ctx.cancelled` for a
thread handler (deadline, lost lease, shutdown release), it also cancels the job's task
(`asyncio.Task.cancel()`); the CancelledError that ends it is judged like any exception:
`timed_out` after the deadline, discarded after a lost lease or a release.

The loop runs in slices of SLICE_SECONDS, so a handler that blocks the loop (a synchronous
call inside `async def`) shows: an `event_loop_blocked` line per slice that overran, and
past `pass_bound_seconds` the process is no longer live (/healthz), as with any stuck loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from consumer.attempt import finish
from consumer.inflight import InFlight
from consumer.outcomes import Backoff, Raised
from consumer.pipeline import Pipeline, Work
from consumer.tasks import Handler
from shared.core.text import describe
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop

log = logging.getLogger("tock.consumer")

SLICE_SECONDS = 0.2
BLOCKED_LOG_SECONDS = 1.0
"""A slice this much longer than planned means a handler blocked the loop: say so."""
BLOCKED_BOUND_SECONDS = 60.0
CLOSE_WAIT_SECONDS = 2.0


class NotStarted(Exception):
    """The job was told to stop (its deadline passed, its lease was lost) before the event
    loop got to start its handler: another handler held the loop."""


async def _guarded(handler: Handler, payload: Any, item: InFlight) -> BaseException | None:
    """Await the handler; whatever it raises is returned, not raised. A task that raises
    KeyboardInterrupt or SystemExit would otherwise take the event loop down with it.
    A job told to stop before its first step is not started at all: its attempt says so
    rather than blame a handler that never ran."""
    ctx = item.context
    if ctx.cancelled.is_set():
        return NotStarted(f"the handler never ran: told to stop ({item.stop_reason}) before "
                          "the event loop was free to start it (another handler blocked "
                          "the loop)")
    try:
        await handler(payload, ctx)
    except BaseException as exc:  # isolation: nothing a handler raises escapes
        return exc
    return None


def _cancel(task: asyncio.Task[Any], reason: str) -> None:
    if not task.done():
        task.cancel(f"tock cancelled the handler: {reason}")


class AsyncRunner(Loop):
    """The event loop thread. A pass runs the loop for one slice."""

    name = "async"
    pass_bound_seconds = BLOCKED_BOUND_SECONDS

    def __init__(self, pipe: Pipeline, backoff: Backoff) -> None:
        super().__init__()
        self.pipe = pipe
        self.backoff = backoff
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self._tasks: set[asyncio.Task[BaseException | None]] = set()
        """Strong references: the loop itself keeps only weak ones to its tasks."""
        self._slice_began: float | None = None

    def run_once(self, now: datetime | None = None) -> int:
        """Run the event loop for one slice (callbacks and tasks of every async job)."""
        began = self._slice_began = time.monotonic()
        timer = self.loop.call_later(SLICE_SECONDS, self.loop.stop)
        try:
            self.loop.run_forever()
        except (KeyboardInterrupt, SystemExit) as exc:
            # asyncio re-raises these two out of run_forever when a task or callback raises
            # them. A job's own task cannot (`_guarded`), so this came from code a handler
            # started on the loop (a stray task, a call_soon callback): the handler's fault,
            # not the loop's. Signals reach only the main thread, so it is no real Ctrl-C.
            # Report it and go on: crashing would take every async job down with it.
            emit(log, "event_loop_error", logging.ERROR, worker=self.pipe.worker_id,
                 error="a task or callback started by an async handler raised "
                       f"{type(exc).__name__}; ignored (the loop goes on)",
                 exception=describe(exc))
        finally:
            timer.cancel()
            self._slice_began = None
        over = time.monotonic() - began - SLICE_SECONDS
        if over > BLOCKED_LOG_SECONDS:
            emit(log, "event_loop_blocked", logging.WARNING, blocked_s=round(over, 1),
                 worker=self.pipe.worker_id, running=len(self._tasks),
                 detail="an async handler ran blocking code on the event loop, or the "
                        "process was paused (SIGSTOP, a starved CPU); every async job "
                        "waited, and none could be cancelled meanwhile")
        return 1  # the slice was the wait: no idle sleep on top

    def stop(self) -> None:
        """Ask the loop thread to end: its slice is cut short at once."""
        super().stop()
        if not self.loop.is_closed() and any(t.is_alive() for t in self._threads):
            self.loop.call_soon_threadsafe(self.loop.stop)

    def blocked_for(self) -> float:
        """How long the event loop's current slice has overrun (0 if it has not): a
        handler blocking the loop now, seen from another thread while it lasts."""
        began = self._slice_began
        if began is None:
            return 0.0
        return max(time.monotonic() - began - SLICE_SECONDS, 0.0)

    @property
    def running(self) -> int:
        """Async jobs whose task has not finished."""
        return len(self._tasks)

    def submit(self, work: Work) -> None:
        """Start the job on the event loop; returns at once (the outcome follows later)."""
        self.loop.call_soon_threadsafe(self._start, work, None)

    def run_blocking(self, work: Work) -> None:
        """Run the job and wait for its outcome to be queued: on the loop thread when it
        runs, else on a short-lived thread (tests driving the consumer one step at a time)."""
        if self._threads and all(t.is_alive() for t in self._threads) and not self.stopping:
            done = threading.Event()
            self.loop.call_soon_threadsafe(self._start, work, done.set)
            done.wait()
            return
        # On a thread of its own: the caller's thread may already run a loop (Playwright's
        # sync API does, and so does a notebook), and one thread runs one loop at a time.
        def drive() -> None:
            finished = self.loop.create_future()
            self._start(work, lambda: finished.set_result(None))
            self.loop.run_until_complete(finished)

        driver = threading.Thread(target=drive, name="tock-async-step")
        driver.start()
        driver.join()

    def _start(self, work: Work, then: Callable[[], None] | None) -> None:
        item = work.item
        assert work.task is not None
        started = time.monotonic()
        task = self.loop.create_task(_guarded(work.task.handler, work.payload, item),
                                     name=f"tock-job-{item.job_id}")
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(work, t, started, then))
        loop = self.loop

        def cancel(reason: str) -> None:  # called from the lease keeper or shutdown threads
            loop.call_soon_threadsafe(_cancel, task, reason)

        item.on_stop(cancel)

    def _finished(self, work: Work, task: asyncio.Task[BaseException | None], started: float,
                  then: Callable[[], None] | None) -> None:
        self._tasks.discard(task)
        try:
            exc = task.result()
        except BaseException as cancelled:  # cancelled before its first step
            exc = cancelled
        try:
            finish(self.pipe, work, None if exc is None else Raised.of(exc),
                   time.monotonic() - started, self.backoff)
        finally:
            if then is not None:
                then()

    def close(self) -> None:
        """Stop the loop thread, cancel what still runs (handlers that ignored their
        cancellation), give them a moment, and close the loop. A loop thread still busy
        (a handler blocking it) is left alone: it is a daemon thread."""
        self.stop()
        if not self.join(CLOSE_WAIT_SECONDS) or self.loop.is_closed():
            return
        pending = list(self._tasks)
        for task in pending:
            _cancel(task, "the consumer is stopping")
        if pending:
            # A stop() that came after the thread's last slice may end this wait early.
            with contextlib.suppress(RuntimeError):
                self.loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_WAIT_SECONDS))
        self.loop.close()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Errors the loop meets outside any job's task (a handler's own stray tasks)."""
        exc = context.get("exception")
        emit(log, "event_loop_error", logging.ERROR, worker=self.pipe.worker_id,
             error=context.get("message", ""),
             exception=None if exc is None else f"{type(exc).__name__}: {exc}")
