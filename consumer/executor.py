"""Run handlers: `concurrency` threads take claimed jobs from the work queue and run them
where their kind's isolation says (`@task(..., isolation=)`, else the consumer's
`--isolation`), then queue the outcome for the completer:

    thread (the default)   a plain handler runs in the executor thread itself; an
                           `async def` handler is handed to the event loop
                           (`consumer/async_executor.py`) and the thread moves on
    process                the thread hands the job to a handler process of its own
                           (`consumer/process_pool.py`) and waits for it

One consumer can mix both: each job goes where its kind says.

Either way a job holds its handler slot until its handler has really stopped; writing the
outcome and deleting the message happen in the completer.

Handlers are isolated: whatever a handler raises (any `BaseException`: `SystemExit`,
`KeyboardInterrupt`, an exception whose `__str__` raises...) becomes a recorded failed
attempt, and the thread goes on to the next job. Only `Abandon` walks away on purpose."""

from __future__ import annotations

import logging
import pickle
import queue as queues
import time
from collections.abc import Sequence
from datetime import datetime

from consumer import child, outcomes
from consumer.async_executor import AsyncRunner
from consumer.attempt import finish
from consumer.outcomes import Raised
from consumer.pipeline import Pipeline, Work
from consumer.process_pool import HandlerProcessFailed, ProcessPool
from consumer.tasks import Task, call_sync
from shared.core.errors import ConfigError
from shared.runtime.logs import emit
from shared.runtime.settings import ConsumerSettings
from shared.runtime.supervisor import Loop

log = logging.getLogger("tock.consumer")

TAKE_WAIT_SECONDS = 0.2
UNKNOWN_LOG_SECONDS = 60.0


def check_sendable(isolated: Sequence[Task]) -> None:
    """`ConfigError` naming the first process-isolated handler that cannot be sent to a
    handler process (pickled by name)."""
    for task in isolated:
        try:
            pickle.dumps(task.handler)
        except Exception as exc:  # a lambda, a nested function, a local class
            raise ConfigError(
                f"the handler of kind {task.kind!r} ({task.handler!r}) cannot be sent to "
                f"a handler process ({type(exc).__name__}); process-isolated handlers "
                "must be importable by name (module-level functions)") from None


class Executor(Loop):
    """The handler threads. A pass runs one handler, however long it takes, so the pass
    has no time bound; stuck handlers are the lease keeper's business."""

    name = "execute"
    pass_bound_seconds = None
    stall_log_seconds = None

    def __init__(self, pipe: Pipeline, task_modules: Sequence[str] = ()) -> None:
        super().__init__()
        self.pipe = pipe
        settings = pipe.settings
        self.threads = settings.concurrency
        self.backoff = outcomes.Backoff(settings.backoff_base_seconds,
                                        settings.backoff_cap_seconds,
                                        settings.unknown_kind_backoff_seconds)
        self._unknown_logged: dict[str, float] = {}
        self.async_runner: AsyncRunner | None = None
        self.pool: ProcessPool | None = None
        self._task_modules = tuple(task_modules)
        self.kill_grace_seconds = settings.kill_grace_seconds
        self.isolation = settings.isolation
        """The consumer's setting: where kinds that do not say run."""
        # The event loop runs async handlers in threads: with thread isolation as the
        # default it is always there (as before), else only if some kind asks for threads.
        if self.isolation == "thread" or any(t.isolation == "thread"
                                             for t in pipe.registry.tasks()):
            self.async_runner = AsyncRunner(pipe, self.backoff)

    def prepare(self) -> None:
        """Before the loops start: if any kind runs in handler processes, check the kill
        grace against the lease, start every handler process and wait until each has
        imported the task modules (`ConfigError` if one cannot, or if a process-isolated
        handler cannot be named to them)."""
        isolated = self.pipe.registry.process_isolated(self.isolation)
        if not isolated:
            return
        # Loading the settings checked this for --isolation process; only here is it known
        # whether a kind asks for processes in a consumer that defaults to threads.
        problem = self.pipe.settings.kill_grace_problem(
            "isolation=process" if self.isolation == "process"
            else f"process-isolated kind(s) {[t.kind for t in isolated]}")
        if problem:
            raise ConsumerSettings.refused(problem)
        check_sendable(isolated)
        try:
            self._processes().start()
        except HandlerProcessFailed as exc:
            raise ConfigError(str(exc)) from None

    def close(self) -> None:
        """After the loops stopped: stop the event loop, end the handler processes."""
        if self.async_runner is not None:
            self.async_runner.close()
        if self.pool is not None:
            self.pool.close()

    def run_once(self, now: datetime | None = None) -> int:
        """Run (or start) the next claimed job, if one comes within a moment; returns 1 if
        it did."""
        try:
            work = self.pipe.work.get(timeout=TAKE_WAIT_SECONDS)
        except queues.Empty:
            return 0
        task = work.task
        if self.async_runner is not None and task is not None and task.is_async \
                and not self._in_child(task):
            self.async_runner.submit(work)
        else:
            self.run(work)
        return 1

    def run(self, work: Work) -> None:
        """Run one claimed job's handler and queue its outcome; returns when it is queued."""
        if work.task is None:
            self._log_unknown(work.item.context.kind)
            try:
                result = outcomes.no_handler(work.item, self.pipe.registry.kinds(),
                                             self.backoff)
            finally:
                self.pipe.slots.release()
            self.pipe.done.put(result)
        elif self._in_child(work.task):
            self._in_process(work)
        elif work.task.is_async:
            if self.async_runner is None:  # see __init__: no kind asked for threads then
                finish(self.pipe, work, Raised(
                    f"kind {work.task.kind!r} (async, isolation='thread') was registered "
                    "after this consumer was built with --isolation process, so it has no "
                    "event loop: register it before"), 0.0, self.backoff)
                return
            self.async_runner.run_blocking(work)
        else:
            started = time.monotonic()
            raised = None
            try:
                call_sync(work.task.handler, work.payload, work.item.context)
            except BaseException as exc:  # isolation: nothing a handler raises escapes
                raised = Raised.of(exc)
            finish(self.pipe, work, raised, time.monotonic() - started, self.backoff)

    def _in_process(self, work: Work) -> None:
        started = time.monotonic()
        try:
            raised = self._processes().run(work, self.kill_grace_seconds)
        except HandlerProcessFailed:
            # Nothing ran: give the job back, and stop this process (its orchestrator
            # restarts it) rather than fail every job that comes.
            work.item.released = True
            self.pipe.done.put(outcomes.released(work.item))
            self.pipe.slots.release()
            raise
        finish(self.pipe, work, raised, time.monotonic() - started, self.backoff)

    def _in_child(self, task: Task) -> bool:
        return task.runs_in(self.isolation) == "process"

    def _processes(self) -> ProcessPool:
        if self.pool is None:
            settings = self.pipe.settings
            # Children import --tasks and the modules of the handlers they may run, not
            # those of thread-only kinds (which need not import outside the consumer).
            isolated = self.pipe.registry.process_isolated(self.isolation)
            modules = [*self._task_modules, *sorted(
                {getattr(t.handler, "__module__", None) or "" for t in isolated}
                - {"", "__main__"})]
            # One child per executor thread, as with --isolation process: a job never waits
            # for a free child (its deadline runs from the claim), whatever the mix of kinds.
            self.pool = ProcessPool(settings.concurrency, child.Start(
                tuple(dict.fromkeys(modules)), settings.log_format, settings.log_level))
        return self.pool

    def _log_unknown(self, kind: str) -> None:
        """Say which kinds this consumer lacks, once a minute per kind."""
        now = time.monotonic()
        if now - self._unknown_logged.get(kind, -UNKNOWN_LOG_SECONDS) < UNKNOWN_LOG_SECONDS:
            return
        self._unknown_logged[kind] = now
        emit(log, "unknown_kind", logging.WARNING, kind=kind, worker=self.pipe.worker_id,
             known=self.pipe.registry.kinds(),
             detail="jobs of this kind are retried with backoff; deploy a consumer with "
                    "its handler, or check the job's queue")
