"""Run handlers: `concurrency` threads take claimed jobs from the work queue, then queue
the outcome for the completer. A plain handler runs in the executor thread itself; an
`async def` handler is handed to the event loop (`consumer/async_executor.py`) and the
thread moves on. Either way a job holds its handler slot until its handler has really
stopped; writing the outcome and deleting the message happen in the completer.

Handlers are isolated: whatever a handler raises (any `BaseException`: `SystemExit`,
`KeyboardInterrupt`, an exception whose `__str__` raises...) becomes a recorded failed
attempt, and the thread goes on to the next job. Only `Abandon` walks away on purpose."""

from __future__ import annotations

import logging
import queue as queues
import time
from datetime import datetime

from consumer import outcomes
from consumer.async_executor import AsyncRunner
from consumer.attempt import finish
from consumer.outcomes import Raised
from consumer.pipeline import Pipeline, Work
from consumer.tasks import call_sync
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop

log = logging.getLogger("tock.consumer")

TAKE_WAIT_SECONDS = 0.2
UNKNOWN_LOG_SECONDS = 60.0


class Executor(Loop):
    """The handler threads. A pass runs one handler, however long it takes, so the pass
    has no time bound; stuck handlers are the lease keeper's business."""

    name = "execute"
    pass_bound_seconds = None

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        settings = pipe.settings
        self.threads = settings.concurrency
        self.backoff = outcomes.Backoff(settings.backoff_base_seconds,
                                        settings.backoff_cap_seconds,
                                        settings.unknown_kind_backoff_seconds)
        self._unknown_logged: dict[str, float] = {}
        self.async_runner = AsyncRunner(pipe, self.backoff)

    def close(self) -> None:
        """After the loops stopped: stop the event loop."""
        self.async_runner.close()

    def run_once(self, now: datetime | None = None) -> int:
        """Run (or start) the next claimed job, if one comes within a moment; returns 1 if
        it did."""
        try:
            work = self.pipe.work.get(timeout=TAKE_WAIT_SECONDS)
        except queues.Empty:
            return 0
        if work.task is not None and work.task.is_async:
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
        elif work.task.is_async:
            self.async_runner.run_blocking(work)
        else:
            started = time.monotonic()
            raised = None
            try:
                call_sync(work.task.handler, work.payload, work.item.context)
            except BaseException as exc:  # isolation: nothing a handler raises escapes
                raised = Raised.of(exc)
            finish(self.pipe, work, raised, time.monotonic() - started, self.backoff)

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
