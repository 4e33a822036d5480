"""What the loops of one consumer process share: its settings and identity, the stores and
the transport, the handler slots, the table of jobs in flight, and the two queues between
the loops.

    claimer ──work──► executor ──done──► completer
       └─ reserves slots ──┘ frees them      writes outcomes, then deletes messages
    lease keeper / visibility keeper: every job in the tracker
"""

from __future__ import annotations

import functools
import logging
import os
import queue as queues
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from consumer.inflight import InFlight, Slots, Tracker
from consumer.outcomes import Finished
from consumer.tasks import Registry, Task
from shared.core.errors import TransportError
from shared.core.reports import Worker
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.settings import ConsumerSettings
from shared.runtime.supervisor import DEFAULT_PASS_BOUND_SECONDS
from shared.store.job_store import JobStore
from shared.transport.base import MAX_BATCH, Transport
from shared.transport.sqs import ATTEMPTS

log = logging.getLogger("tock.consumer")

Clock = Callable[[], datetime | None]
"""The database's "now" for leases: None means the database clock (production)."""


class Work(NamedTuple):
    """A claimed job for the executor."""

    item: InFlight
    payload: Any
    task: Task | None


class Tidy(NamedTuple):
    """Messages to delete (or make visible again) once their outcomes are committed."""

    queue: str
    receipts: list[str]
    visible: bool = False


DELETE_CALLS_AT_ONCE = 4
"""DeleteMessageBatch calls the deleter makes at once: one after another, one thread fell
behind the outcomes at ~800 jobs/s on LocalStack (a third of a run's messages still
undeleted when its last job finished, ~2 s of deletes)."""


@dataclass
class Pipeline:
    settings: ConsumerSettings
    registry: Registry
    transport: Transport
    store: JobStore
    """Durable commits: outcomes, heartbeats, the worker row."""
    claim_store: JobStore
    """Claims commit asynchronously: a claim lost in a database crash leaves the job
    dispatched and its message undeleted, so it is claimed again or re-dispatched."""
    clock: Clock = lambda: None
    worker_id: str = field(default_factory=lambda: (
        f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"))
    slots: Slots = field(init=False)
    tracker: Tracker = field(default_factory=Tracker)
    # SimpleQueue, not Queue: each job passes through `work` and `done`, and the C queue
    # wakes a waiting thread for a few microseconds less CPU than Queue's Condition does.
    work: queues.SimpleQueue[Work] = field(default_factory=queues.SimpleQueue)
    done: queues.SimpleQueue[Finished] = field(default_factory=queues.SimpleQueue)
    tidy: queues.SimpleQueue[Tidy] = field(default_factory=queues.SimpleQueue)
    """Committed outcomes' messages, for the deleter loop (consumer/deleter.py)."""
    deleting: bool = False
    """The deleter loop runs: `after_commit` hands it the messages; else (a consumer driven
    step by step) they are deleted at once."""
    async_blocked_for: Callable[[], float] = lambda: 0.0
    """How long the event loop of async handlers has been blocked now (AsyncRunner), so
    the receivers leave async jobs to other consumers meanwhile."""
    database_away: bool = False
    """A claim or a heartbeat just failed for want of Postgres: the receivers ask it before
    they receive again (consumer/claimer.py), so no receive is spent on a claim that
    cannot run."""
    worker_id_pending: bool = False
    """Postgres was away when the consumer started, so it has not taken its worker id yet
    (consumer/worker_id.py): the heartbeat loop takes it, and nothing is claimed until
    then, as another live process may hold the id."""

    def __post_init__(self) -> None:
        self.slots = Slots(self.settings.concurrency)
        if self.settings.worker_id:
            self.worker_id = self.settings.worker_id

    @property
    def max_tracked(self) -> int:
        """Past this many jobs in flight (outcomes waiting to be written), stop receiving.
        Wide enough that the completer writes full batches while claims go on (4x the
        concurrency stalled the claimers a fifth of the time in the in-memory benchmark:
        8x gave 5-18% more jobs/s); a database that cannot keep up still stops receipts."""
        return 8 * self.settings.concurrency + 10 * MAX_BATCH

    def delete(self, queue: str, receipts: list[str],
               calls: Callable[[Callable[[list[str]], bool], list[list[str]]], list[bool]]
               | None = None) -> None:
        """Delete messages, 10 per call; a failure is counted and logged (such a message
        comes back later and claims nothing). After a call SQS left unanswered the rest
        are not tried: each would hang as long, holding up the outcomes behind them.
        `calls` makes a wave of calls at once (the deleter's pool, `DELETE_CALLS_AT_ONCE`
        per wave); without it, one after another."""
        chunks = [receipts[i:i + MAX_BATCH] for i in range(0, len(receipts), MAX_BATCH)]
        wave = DELETE_CALLS_AT_ONCE if calls else 1
        for w in range(0, len(chunks), wave):
            asked = time.monotonic()
            some = chunks[w:w + wave]
            hung = (calls(functools.partial(self._delete_chunk, queue), some) if len(some) > 1
                    and calls else [self._delete_chunk(queue, chunk) for chunk in some])
            if any(hung):
                rest = sum(len(c) for c in chunks[w + wave:])
                if rest:
                    emit(log, "delete_failed", logging.WARNING, queue=queue,
                         error="SQS did not answer", **self._left(asked, rest))
                return

    def _delete_chunk(self, queue: str, receipts: list[str]) -> bool:
        """One DeleteMessageBatch; True if it failed only after its timeout (`hung`)."""
        asked = time.monotonic()
        try:
            failures = self.transport.delete_batch(queue, receipts)
        except TransportError as exc:
            metrics.SQS_ERRORS.labels("DeleteMessageBatch").inc()
            emit(log, "delete_failed", logging.WARNING, queue=queue, error=str(exc))
            return self.hung(asked)
        if failures:
            metrics.SQS_ERRORS.labels("DeleteMessageBatch").inc(len(failures))
        return False

    def make_visible(self, queue: str, receipts: list[str], after_seconds: int = 0) -> None:
        """Let messages be received again after `after_seconds` (0: at once). A failure is
        logged: they come back after their visibility timeout anyway (and after a call SQS
        left unanswered, the rest are left to that)."""
        for i in range(0, len(receipts), MAX_BATCH):
            asked = time.monotonic()
            try:
                self.transport.change_visibility_batch(queue, receipts[i:i + MAX_BATCH],
                                                       after_seconds)
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc()
                emit(log, "visibility_change_failed", logging.WARNING, queue=queue,
                     error=str(exc), **self._left(asked, len(receipts) - i - MAX_BATCH))
                if self.hung(asked):
                    return

    def sqs_pass_bound(self) -> float:
        """The liveness bound of a loop whose pass makes SQS calls that stop at the first
        one SQS leaves unanswered (`hung`): that call's ATTEMPTS x the call timeout, with
        room for its statements. An SQS that hangs must not fail liveness: a restart
        cures nothing there."""
        return max(DEFAULT_PASS_BOUND_SECONDS,
                   ATTEMPTS * self.settings.sqs_call_timeout_seconds + 60)

    def after_commit(self, queue: str, receipts: list[str], *, visible: bool = False) -> None:
        """The messages of outcomes just committed: deleted (`visible`: made visible again)
        by the deleter loop, or here when it does not run."""
        if not receipts:
            return
        if self.deleting:
            self.tidy.put(Tidy(queue, receipts, visible))
        elif visible:
            self.make_visible(queue, receipts)
        else:
            self.delete(queue, receipts)

    def hung(self, asked: float) -> bool:
        """Whether an SQS call made at `asked` (monotonic) failed only after its timeout:
        SQS is not answering, and the next call would wait as long."""
        return time.monotonic() - asked >= self.settings.sqs_call_timeout_seconds

    def _left(self, asked: float, rest: int) -> dict[str, Any]:
        """Log fields for the messages a hung call leaves untried."""
        if rest <= 0 or not self.hung(asked):
            return {}
        return {"not_tried": rest, "detail": "SQS did not answer: the rest are not tried "
                "now (their messages come back after the visibility timeout)"}

    def announcement(self) -> Worker:
        return Worker(
            id=self.worker_id, host=socket.gethostname(), pid=os.getpid(),
            queues=self.settings.queues, kinds=self.registry.kinds(),
            concurrency=self.settings.concurrency,
            # Busy slots, not the tracker's jobs: a job stays tracked until its outcome is
            # written, while its slot already runs the next one (7 "busy" of 6).
            in_flight=self.slots.busy)
