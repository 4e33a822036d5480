"""The inside of a handler process (process isolation): import the task modules, say
ready, then run one job at a time as the parent orders and report what the handler did.

    parent ── ("run", job id, pickled Order) ──► reader thread ─► main thread runs it
           ── ("stop", job id, reason) ───────► reader thread: sets ctx.cancelled
                                                (and cancels an async handler's task)
    parent ◄── ("ready", pid) | ("broken", error) | ("done", job id, Raised | None) ──

Only plain data crosses: the payload (JSON), the context's fields, and the handler by
reference (pickle names its module and qualified name; the child imports it). The
parent's end closing (or the parent dying) ends this process at once (`os._exit`), even
mid-handler: the parent has released the job or will never report it.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import pickle
import queue
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from consumer.outcomes import Raised
from consumer.tasks import Handler, TaskContext, call_sync
from shared.core.text import describe
from shared.runtime.logs import configure


@dataclass(frozen=True)
class Start:
    """What a handler process needs before its first job."""

    modules: tuple[str, ...]
    """The --tasks modules and those of every process-isolated handler, imported at start."""
    log_format: str = "json"
    log_level: str = "INFO"


@dataclass(frozen=True)
class Order:
    """One job to run."""

    handler: Handler
    is_async: bool
    payload: Any
    context: dict[str, Any]
    """TaskContext's fields but `cancelled` (the child makes its own Event)."""


class _Current:
    """The job this process runs now, so a stop order reaches only that job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job_id: int | None = None
        self._cancelled = threading.Event()
        self._reason = ""
        self._task: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def begin(self, job_id: int) -> threading.Event:
        with self._lock:
            self._job_id, self._cancelled, self._task = job_id, threading.Event(), None
            return self._cancelled

    def stop(self, job_id: int, reason: str) -> None:
        with self._lock:
            if job_id != self._job_id:
                return  # an order that crossed the previous job's result: too late
            self._reason = reason
            self._cancelled.set()
            task = self._task
        if task is not None:
            task[0].call_soon_threadsafe(task[1].cancel, f"tock cancelled the handler: {reason}")

    def attach(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """The async handler's task, to cancel on a stop order (at once if one came)."""
        with self._lock:
            self._task = (loop, task)
            stopped = self._cancelled.is_set()
        if stopped:
            task.cancel(f"tock cancelled the handler: {self._reason}")


def main(jobs: Connection, results: Connection, start: Start) -> None:
    """The handler process's entry point (multiprocessing target)."""
    # The parent owns shutdown: a SIGTERM or Ctrl-C meant for the whole process group must
    # not kill a running handler behind its back (the parent releases, then kills).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure(start.log_format, start.log_level, "consumer-handler")
    try:
        for module in start.modules:
            importlib.import_module(module)
    except BaseException as exc:  # reported to the parent, which refuses to start
        _send(results, ("broken", f"cannot import task module: {describe(exc)}"))
        return
    _send(results, ("ready", os.getpid()))
    current = _Current()
    inbox: queue.SimpleQueue[tuple[int, bytes, threading.Event]] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(jobs, inbox, current), daemon=True,
                     name="tock-orders").start()
    while True:
        job_id, data, cancelled = inbox.get()
        _send(results, ("done", job_id, _run(data, cancelled, current)))


def _send(results: Connection, message: tuple[object, ...]) -> None:
    try:
        results.send(message)
    except OSError:  # the parent closed the pool (or died): nobody to tell, nothing to do
        _leave()


def _leave() -> None:
    sys.stderr.flush()
    os._exit(0)


def _read(jobs: Connection, inbox: queue.SimpleQueue[tuple[int, bytes, threading.Event]],
          current: _Current) -> None:
    while True:
        try:
            order = jobs.recv()
        except (EOFError, OSError):
            _leave()  # the parent closed the pool or is gone
        if order[0] == "run":
            inbox.put((order[1], order[2], current.begin(order[1])))
        elif order[0] == "stop":
            current.stop(order[1], order[2])


def _run(data: bytes, cancelled: threading.Event, current: _Current) -> Raised | None:
    """Run one job's handler; what it raised, as plain data (None: it returned)."""
    try:
        order: Order = pickle.loads(data)
    except BaseException as exc:  # e.g. its module cannot be imported here
        return Raised(f"the handler process could not load the job: {describe(exc)}")
    ctx = TaskContext(**order.context, cancelled=cancelled)
    try:
        if order.is_async:
            asyncio.run(_awaited(order.handler, order.payload, ctx, current))
        else:
            call_sync(order.handler, order.payload, ctx)
    except BaseException as exc:  # isolation: whatever the handler raised is its outcome
        return Raised.of(exc)
    return None


async def _awaited(handler: Handler, payload: Any, ctx: TaskContext, current: _Current
                   ) -> None:
    task = asyncio.current_task()
    assert task is not None
    current.attach(asyncio.get_running_loop(), task)
    await handler(payload, ctx)
