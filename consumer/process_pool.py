"""Handler processes (`--isolation process`, or the kinds that ask with `@task(...,
isolation="process")`): a pool of `concurrency` child processes, each running one job at
a time, so a handler that ignores its deadline can be killed.

    executor thread ── take a child ── send the job ── wait for: its result
                                                                 its death (exit code)
                                                                 ctx.cancelled ─► stop order,
                                                                   then SIGKILL after the grace

The parent keeps everything that matters for the guarantees: the lease, the heartbeats,
the outcome (fenced, through the same completer) and the message. A child that is killed
or dies is replaced at once (the replacement starts while the outcome is recorded), and
its attempt is recorded as `timed_out` (past its deadline) or as a failure naming the exit
("handler process died: exit -9 (SIGKILL)").

Children come from a fork server (spawn where there is none) that has loaded only tock's
own modules; each child imports the task modules itself, so nothing a task module opens at
import (a connection pool, a thread) is shared between processes.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import signal
import threading
import time
from dataclasses import fields
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess

from consumer import child
from consumer.inflight import InFlight
from consumer.outcomes import Raised
from consumer.pipeline import Work
from shared.runtime import metrics
from shared.runtime.logs import emit

log = logging.getLogger("tock.consumer")

START_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.05
"""How soon a stop (deadline, lost lease, release) reaches a running child."""
JOIN_SECONDS = 5.0


class HandlerProcessFailed(RuntimeError):
    """A handler process could not start (its task modules do not import there, or it did
    not report ready in time)."""


def _context() -> ForkServerContext | SpawnContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["consumer.child"])
        return ctx
    return multiprocessing.get_context("spawn")


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"exit {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit {code}"


class HandlerProcess:
    """One child and the two pipes to it (orders in, results out)."""

    def __init__(self, ctx: ForkServerContext | SpawnContext, start: child.Start, index: int,
                 closing: threading.Event) -> None:
        self._ctx, self._start, self._index, self._closing = ctx, start, index, closing
        self.process: BaseProcess | None = None
        self._orders: Connection | None = None
        self._results: Connection | None = None
        self._ready = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def spawn(self) -> None:
        """Start a child; returns at once (`ensure_ready` waits for it)."""
        orders_r, orders_w = self._ctx.Pipe(duplex=False)
        results_r, results_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=child.main, args=(orders_r, results_w, self._start),
                                 name=f"tock-handler-{self._index}", daemon=True)
        try:
            proc.start()
        except OSError as exc:  # out of processes, memory or file descriptors
            for conn in (orders_r, orders_w, results_r, results_w):
                conn.close()
            raise HandlerProcessFailed(f"a handler process could not start: {exc}") from None
        finally:
            orders_r.close()  # so that each side sees EOF when the other goes
            results_w.close()
        self.process, self._orders, self._results, self._ready = proc, orders_w, results_r, False

    def ensure_ready(self) -> None:
        """A live child that said ready: started, or replaced if it died while idle."""
        if self.process is not None and self._ready:
            if self.process.is_alive():
                return
            self._replaced("died", None, "idle handler process died: "
                                         f"{_exit_text(self.process.exitcode)}")
        if self.process is None:
            self.spawn()
        assert self._results is not None
        message: tuple[object, ...] = ("silent",)
        try:
            if self._results.poll(START_TIMEOUT_SECONDS):
                message = self._results.recv()
        except (EOFError, OSError):
            message = ("broken", "it exited before it was ready")
        if message[0] != "ready":
            why = message[1] if message[0] == "broken" else (
                f"no word from it within {START_TIMEOUT_SECONDS:g} s")
            self.close()
            raise HandlerProcessFailed(f"a handler process could not start: {why}")
        self._ready = True

    def run(self, work: Work, grace_seconds: float) -> Raised | None:
        """Run the job in the child and wait for what its handler did."""
        item = work.item
        assert work.task is not None
        context = {f.name: getattr(item.context, f.name) for f in fields(item.context)
                   if f.name != "cancelled"}
        try:
            data = pickle.dumps(child.Order(work.task.handler, work.task.is_async,
                                            work.payload, context))
        except Exception as exc:  # a lambda or a nested function: not importable by name
            return Raised(f"the handler of kind {item.context.kind!r} cannot be sent to a "
                          f"handler process ({type(exc).__name__}: {exc}); process-isolated "
                          "handlers must be module-level functions")
        self.ensure_ready()
        assert self.process is not None and self._orders and self._results
        try:
            self._orders.send(("run", item.job_id, data))
        except OSError:
            return self._died(item)
        orders, results, sentinel = self._orders, self._results, self.process.sentinel
        stop_sent: float | None = None
        while True:
            try:  # the pipes are closed under us when the consumer stops: that is a death
                ready = wait([results, sentinel], POLL_SECONDS)
                message = results.recv() if results in ready else None
            except (EOFError, OSError):
                return self._died(item)
            if message is not None:
                if message[0] == "done" and message[1] == item.job_id:
                    raised: Raised | None = message[2]
                    return raised
                continue
            if ready:
                return self._died(item)
            if not item.context.cancelled.is_set():
                continue
            if stop_sent is None:
                stop_sent = time.monotonic()
                try:
                    orders.send(("stop", item.job_id, item.stop_reason or "stop"))
                except OSError:
                    return self._died(item)
            elif time.monotonic() - stop_sent >= grace_seconds:
                return self._killed(item, grace_seconds)

    def _killed(self, item: InFlight, grace_seconds: float) -> Raised:
        why = item.stop_reason or "told to stop"
        pid = self.pid
        self.kill()
        text = (f"handler process killed (SIGKILL): still running {grace_seconds:g} s after "
                f"it was told to stop ({why})")
        self._replaced("killed", item, text, pid)
        return Raised(text)

    def _died(self, item: InFlight) -> Raised:
        pid = self.pid
        if self.process is not None:
            self.process.join(JOIN_SECONDS)
        code = None if self.process is None else self.process.exitcode
        text = f"handler process died: {_exit_text(code)}"
        self._replaced("died", item, text, pid)
        return Raised(text)

    def _replaced(self, reason: str, item: InFlight | None, text: str,
                  pid: int | None = None) -> None:
        if self._closing.is_set():
            return  # the consumer is stopping: nothing to replace, nothing to report
        metrics.HANDLER_PROCESSES_REPLACED.labels(reason).inc()
        emit(log, f"handler_process_{reason}", logging.ERROR, pid=pid or self.pid,
             job_id=None if item is None else item.job_id,
             kind=None if item is None else item.context.kind, error=text)
        self.close()
        try:
            self.spawn()  # the replacement imports while this attempt is recorded
        except HandlerProcessFailed as exc:  # the next job tries again (and says so)
            emit(log, "handler_process_failed", logging.ERROR, error=str(exc))

    def kill(self) -> None:
        """SIGKILL the child (a no-op if it is gone) and reap it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(JOIN_SECONDS)

    def end(self) -> None:
        """Make the child exit at once, busy or not: its orders pipe closes, and its reader
        thread ends the process. Safe while an executor thread waits on it (it then sees a
        death, and does not replace the child while the pool is closing)."""
        if self._orders is not None:
            self._orders.close()

    def close(self) -> None:
        """End the child, reap it (SIGKILL if it lingers) and close the pipes."""
        self.end()
        if self._results is not None:
            self._results.close()
        self._orders = self._results = None
        if self.process is not None:
            self.process.join(0.5)
            self.kill()
            if self.process.exitcode is not None:
                self.process.close()
        self.process, self._ready = None, False


class ProcessPool:
    """`size` handler processes; an executor thread takes one for each job it runs."""

    def __init__(self, size: int, start: child.Start) -> None:
        self._closing = threading.Event()
        ctx = _context()
        self._all = [HandlerProcess(ctx, start, i, self._closing) for i in range(size)]
        self._idle: queue.SimpleQueue[HandlerProcess] = queue.SimpleQueue()
        for proc in self._all:
            self._idle.put(proc)

    def pids(self) -> list[int]:
        return [p.pid for p in self._all if p.pid is not None]

    def start(self) -> None:
        """Start every child and wait until each is ready; `HandlerProcessFailed` if one
        cannot start (a task module that fails to import in a fresh process)."""
        idle = [p for p in self._all if p.process is None]
        for proc in idle:
            proc.spawn()
        for proc in idle:
            proc.ensure_ready()

    def run(self, work: Work, grace_seconds: float) -> Raised | None:
        """Run the job on an idle child (there is one per executor thread)."""
        if self._closing.is_set():
            return Raised("the consumer stopped before the handler could start")
        proc = self._idle.get()
        try:
            return proc.run(work, grace_seconds)
        finally:
            if self._closing.is_set():
                proc.close()
            self._idle.put(proc)

    def close(self) -> None:
        """End every child, busy ones too (by now their jobs were released); the idle ones
        are reaped here, the busy ones by the executor thread that waits on them."""
        self._closing.set()
        for proc in self._all:
            proc.end()
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
