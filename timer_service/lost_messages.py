"""Jobs whose SQS message was lost: sent again, on evidence.

A dispatched job nobody claimed for `dispatch_timeout_seconds` is sent again only on
evidence that its message is gone: its SQS queue holds fewer messages than it has
dispatched jobs. The messages waiting (visible) are the dispatched jobs'; those in flight
are first the running jobs' (each holds its message until its outcome is written), and
only what is in flight beyond one per running job may be a dispatched job's (received,
its claim under way, or deferred). So a lost message is found while the queue is busy
too: counting every message in flight as a dispatched job's let each running job hide one
lost message for as long as work flowed. A running job whose message was deleted as a
redelivered copy makes the count a little high, at worst one extra message for a job
already older than the timeout (never a second run: the resend changes the token). A
long backlog therefore resends nothing, however old; a purged or recreated queue, or
messages moved to the dead-letter queue, resend as many of the oldest stuck jobs as
messages are missing. A recreated queue is evidence of its own: every job dispatched well
before its creation time lost its message.

Its own loop (not the lease rescue's): it asks SQS, which can hang for ATTEMPTS x the
call timeout per call, and expired leases must be rescued meanwhile. A pass that finds
SQS not answering (a call that failed after its timeout) stops there: the other queues'
counts would hang as long and tell as little, so a pass is bounded by one queue's calls,
not by the number of queues.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from shared.core.errors import QueueMissing, TransportError
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.job_store import JobStore
from shared.transport.base import Transport
from shared.transport.sqs import ATTEMPTS

log = logging.getLogger("tock.timer.rescue")

CREATED_SLACK = timedelta(seconds=60)
"""A job dispatched this long before its queue's creation time went with the old queue for
sure: a dispatch's sends, retries included, end well within it (its claim's `now()` is
`dispatched_at`, and a sender that finds the queue missing creates it first)."""


class LostMessages(Loop):
    """Counts each queue with stuck jobs every few seconds (a full batch goes on at once)."""

    name = "redispatch"

    def __init__(self, store: JobStore, transport: Transport, *, batch_size: int,
                 dispatch_timeout_seconds: float, interval_seconds: float,
                 call_timeout_seconds: float) -> None:
        super().__init__()
        self.store = store
        self.transport = transport
        self.batch_size = batch_size
        self.dispatch_timeout = dispatch_timeout_seconds
        # Counting a queue's jobs costs more than the lease scan: at most every few seconds.
        self.idle_seconds = max(interval_seconds, min(10.0, dispatch_timeout_seconds / 2))
        # A pass: at most two SQS calls into an SQS that does not answer (then it stops),
        # each ATTEMPTS x the call timeout, and its statements.
        self.pass_bound_seconds = 2 * ATTEMPTS * call_timeout_seconds + 60
        self.call_timeout = call_timeout_seconds

    def run_once(self, now: datetime | None = None) -> int:
        """Re-dispatch jobs whose message was lost; 0 unless a batch was full (more are
        lost: a purged queue, a restarted SQS), so that the next pass comes at once."""
        return int(self.redispatch_stuck(now) >= self.batch_size)

    def redispatch_stuck(self, now: datetime | None = None) -> int:
        """Make dispatched jobs whose message is gone due again (see the module docstring);
        returns how many."""
        total = 0
        for queue, stuck in self.store.stuck_queues(self.dispatch_timeout, now).items():
            asked = time.monotonic()
            missing = self._missing_messages(queue)
            if missing is None and time.monotonic() - asked >= self.call_timeout:
                # SQS does not answer: the next queues' counts would hang as long. (One
                # queue it refuses at once, say access denied, does not stop the others.)
                break
            if not missing:
                continue
            ids = self.store.redispatch_stuck(queue, self.dispatch_timeout,
                                              min(missing, stuck, self.batch_size), now)
            if ids:
                total += len(ids)
                metrics.REDISPATCHED.inc(len(ids))
                emit(log, "redispatch_lost", logging.WARNING, queue=queue, jobs=len(ids),
                     missing_messages=missing, job_ids=ids[:20])
        return total

    def _missing_messages(self, queue: str) -> int | None:
        """How many messages `queue` lacks; None when SQS cannot tell (no evidence, no
        resend).
        See the module's docstring for the arithmetic."""
        dispatched, running = self.store.queue_expected(queue)
        created = None
        try:
            waiting, in_flight = self.transport.counts(queue)
            created = self.transport.created_at(queue)
        except QueueMissing:
            waiting = in_flight = 0  # the queue is gone, and every message with it
        except TransportError as exc:
            emit(log, "queue_depth_unknown", logging.WARNING, queue=queue, error=str(exc))
            return None
        missing = max(dispatched - waiting - max(in_flight - running, 0), 0)
        if created is not None:
            # Made again (a restarted LocalStack, a queue deleted and created): what was
            # sent well before went with the old queue. A job dispatched just before may
            # have been sent just after (the timer creates a missing queue as it sends):
            # those the count above judges.
            missing = max(missing, self.store.dispatched_before(
                queue, created - CREATED_SLACK))
        return missing
