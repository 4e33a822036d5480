"""The end of one attempt, wherever its handler ran (a handler thread, the event loop, a
handler process): judge what it did, free its slot, and hand the outcome to the completer.
One path for all three, so they cannot drift apart."""

from __future__ import annotations

import logging
import time

from consumer import outcomes
from consumer.lease import let_go
from consumer.outcomes import Backoff, Raised
from consumer.pipeline import Pipeline, Work
from shared.runtime import metrics
from shared.runtime.logs import emit

log = logging.getLogger("tock.consumer")


def finish(pipe: Pipeline, work: Work, raised: Raised | None, run_seconds: float,
           backoff: Backoff) -> None:
    """Record what the handler did (`raised` None: it returned). The slot is freed here and
    only here, when the handler has really stopped: a stuck handler keeps its slot."""
    item = work.item
    result = None
    try:
        if item.handler_returned():
            metrics.STUCK_HANDLERS.labels(item.context.kind).dec()
            emit(log, "stuck_handler_returned", logging.WARNING, job_id=item.job_id,
                 attempt=item.attempt, worker=pipe.worker_id,
                 over_deadline_s=round(time.monotonic() - item.started
                                       - item.timeout_seconds, 1))
        if raised is not None and raised.abandon:
            emit(log, "job_abandoned", logging.WARNING, job_id=item.job_id,
                 attempt=item.attempt, worker=pipe.worker_id)
            if let_go(pipe, item):  # else the lease keeper detaches it at its next tick
                pipe.tracker.forget(item)
        else:
            result = outcomes.outcome_of(item, raised, run_seconds, backoff)
    finally:
        pipe.slots.release()
    if result is not None:
        pipe.done.put(result)
