"""Run handlers: `concurrency` threads take claimed jobs from the work queue, run the
handler, and queue the outcome for the completer. A handler's slot is free again as soon
as it returns; writing the outcome and deleting the message happen in the completer.

Handlers are isolated: whatever a handler raises (any `BaseException`: `SystemExit`,
`KeyboardInterrupt`, an exception whose `__str__` raises...) becomes a recorded failed
attempt, and the thread goes on to the next job. Only `Abandon` walks away on purpose."""

from __future__ import annotations

import logging
import queue as queues
import time
from datetime import datetime

from consumer import outcomes
from consumer.outcomes import Finished, TimedOut
from consumer.pipeline import Pipeline, Work
from consumer.tasks import Abandon
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
        self.threads = pipe.settings.concurrency
        settings = pipe.settings
        self.backoff = outcomes.Backoff(settings.backoff_base_seconds,
                                        settings.backoff_cap_seconds,
                                        settings.unknown_kind_backoff_seconds)
        self._unknown_logged: dict[str, float] = {}

    def run_once(self, now: datetime | None = None) -> int:
        """Run the next claimed job, if one comes within a moment; returns 1 if it did."""
        try:
            work = self.pipe.work.get(timeout=TAKE_WAIT_SECONDS)
        except queues.Empty:
            return 0
        self.run(work)
        return 1

    def run(self, work: Work) -> None:
        """Run one claimed job's handler and queue its outcome."""
        try:
            result = self._outcome(work)
        finally:
            self.pipe.slots.release()
        if result is not None:
            self.pipe.done.put(result)

    def _outcome(self, work: Work) -> Finished | None:
        pipe, item = self.pipe, work.item
        if work.task is None:
            self._log_unknown(item.context.kind)
            return outcomes.no_handler(item, pipe.registry.kinds(), self.backoff)
        started = time.monotonic()
        try:
            work.task.handler(work.payload, item.context)
        except Abandon:
            item.abandoned = True
            emit(log, "job_abandoned", logging.WARNING, job_id=item.job_id,
                 attempt=item.attempt, worker=pipe.worker_id)
            pipe.tracker.forget(item)
            return None
        except BaseException as exc:  # isolation: nothing a handler raises escapes
            return outcomes.failed(item, exc, time.monotonic() - started, self.backoff)
        elapsed = time.monotonic() - started
        if item.timed_out:
            return outcomes.failed(item, TimedOut("returned after its deadline"), elapsed,
                                   self.backoff)
        return outcomes.succeeded(item, elapsed)

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
