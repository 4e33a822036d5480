"""The end of one attempt, wherever its handler ran (a handler thread, the event loop, a
handler process): judge what it did, free its slot, and hand the outcome to the completer.
One path for all three, so they cannot drift apart."""

from __future__ import annotations

import logging

from consumer import outcomes
from consumer.outcomes import Backoff, Raised
from consumer.pipeline import Pipeline, Work
from shared.runtime.logs import emit

log = logging.getLogger("tock.consumer")


def finish(pipe: Pipeline, work: Work, raised: Raised | None, run_seconds: float,
           backoff: Backoff) -> None:
    """Record what the handler did (`raised` None: it returned). The slot is freed here and
    only here, when the handler has really stopped."""
    item = work.item
    result = None
    try:
        if raised is not None and raised.abandon:
            item.abandoned = True
            emit(log, "job_abandoned", logging.WARNING, job_id=item.job_id,
                 attempt=item.attempt, worker=pipe.worker_id)
            pipe.tracker.forget(item)
        else:
            result = outcomes.outcome_of(item, raised, run_seconds, backoff)
    finally:
        pipe.slots.release()
    if result is not None:
        pipe.done.put(result)
