"""Keep leases alive, on two timers that never wait for each other:

    LeaseKeeper        every heartbeat_seconds: one statement refreshes this worker's row
                       and its lease, which every job it holds hangs off (the authority),
                       and says which leases it still holds; every tick it signals
                       handlers past their deadline
    VisibilityKeeper   every heartbeat_seconds: ChangeMessageVisibilityBatch for the
                       messages of the jobs whose lease holds, so SQS does not redeliver them

A hung or failing SQS call therefore never delays a database heartbeat. A lost lease
(cancelled, or expired and taken over) or a passed deadline tells the handler to stop
(`InFlight.stop`: `ctx.cancelled`, an async task cancelled, a handler process told and then
killed); after a lost lease its result will be discarded by the completer's fence.

A handler still running a lease past its deadline is *stuck*: only a handler thread or an
async task can be (a handler process is killed first). Its job is detached so that it is
recovered elsewhere; the handler keeps its slot here and its concurrency-limit slot in the
database (a lingering row, written by the next beat) until it returns, counted meanwhile
by the `tock_stuck_handlers` gauge.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime

from consumer.inflight import InFlight
from consumer.pipeline import Pipeline
from consumer.worker_id import WorkerIdTaker
from shared.core.errors import GivingUp, QueueMissing, Retryable, TransportError
from shared.core.states import JobState
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.transport.base import MAX_BATCH, EntryFailure

log = logging.getLogger("tock.consumer")


class SlotsStuck(GivingUp):
    """Every handler slot has been held by a stuck handler for TOCK_STUCK_EXIT_SECONDS: the
    consumer cannot take work and cannot free a thread, so it stops (exit non-zero) for its
    orchestrator to restart it."""

TICK_SECONDS = 0.2
"""How often deadlines are checked; heartbeats go out every heartbeat_seconds."""
UNTRACKED_AFTER_LEASES = 2
"""A running job of this worker's that it does not hold is let go once its claim is this
many leases old (LeaseKeeper._release_untracked)."""


class LeaseKeeper(Loop):
    name = "heartbeat"
    idle_seconds = TICK_SECONDS
    # Most ticks only check deadlines; only a beat that reached Postgres is a success,
    # so readiness says how long ago the last one was, not the last tick.
    explicit_success = True

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        self.ready_within_seconds = max(3 * pipe.settings.heartbeat_seconds, 1.0)
        # Sub-second leases need ticks well inside a heartbeat period.
        self.idle_seconds = min(TICK_SECONDS, pipe.settings.heartbeat_seconds / 4)
        self._next_beat = time.monotonic() + pipe.settings.heartbeat_seconds
        self._all_stuck_since: float | None = None
        self.worker_id = WorkerIdTaker(pipe)

    def run_once(self, now: datetime | None = None) -> int:
        self.check_timeouts()
        self.check_all_stuck()
        if time.monotonic() >= self._next_beat:
            self._next_beat = time.monotonic() + self.pipe.settings.heartbeat_seconds
            try:
                self.beat(now)
            except Retryable:
                self.pipe.database_away = True  # the receivers wait for it too
                raise
        return 0

    def beat(self, now: datetime | None = None) -> tuple[int, int]:
        """Extend every lease this process holds (one fenced UPDATE) and refresh the worker
        row; returns (kept, lost). Takes the worker id first if start could not."""
        pipe = self.pipe
        if pipe.worker_id_pending and self.worker_id.attempt() is not None:
            return 0, 0  # another process holds the id: nothing to beat for yet
        items = pipe.tracker.heartbeating()
        running = [i.lease for i in pipe.tracker.handlers()]
        when = now if now is not None else pipe.clock()
        kept = pipe.store.heartbeat(pipe.announcement(), [i.lease for i in items],
                                    pipe.settings.lease_seconds, when, running=running)
        self.mark_ok()
        self._release_untracked(when)
        # A job whose outcome is being written in the meantime is not lost: it is done.
        lost = [i for i in items if i.job_id not in kept and not i.completing]
        cancelled = pipe.store.cancelled_claims([i.lease for i in lost])
        claims_lost = self._claims_lost([i for i in lost if i.job_id not in cancelled])
        for item in lost:
            item.lease_lost = True
            item.stop("lease lost")
            metrics.LEASES_LOST.inc()
            _log_lost(item, pipe.worker_id, cancelled=item.job_id in cancelled,
                      claim_lost=item.job_id in claims_lost)
        self._record_lingering()
        return len(kept), len(lost)

    def _claims_lost(self, lost: list[InFlight]) -> set[int]:
        """Of leases lost otherwise than by a cancel, those whose claim itself was lost (a
        database crash took its asynchronous commit): the job still carries the token this
        worker claimed it with, dispatched again or claimed anew from the same message.
        A lease that expired and was rescued has a new token."""
        if not lost:
            return set()
        try:
            states = self.pipe.store.job_states([i.job_id for i in lost])
        except Retryable:
            return set()  # cannot tell: said as a lease taken over
        # Dispatched again, or running from the same message on another worker. A lease
        # that expired leaves the job retrying (its token is replaced at its next dispatch).
        return {i.job_id for i in lost if i.job_id in states
                and states[i.job_id][0] in (JobState.DISPATCHED, JobState.RUNNING)
                and states[i.job_id][1] == i.lease.token}

    def _record_lingering(self) -> None:
        """Handlers still running here for jobs this worker lost or let go keep their
        concurrency slots (lingering_sql) until a beat finds them returned. A cancel has
        written its own row already; this covers a stuck handler's job, detached to be
        recovered elsewhere, and a lease taken over."""
        pipe = self.pipe
        lingering = [(i.lease, "stuck" if i.stuck else "lease_lost")
                     for i in pipe.tracker.handlers() if i.lease_lost or (i.detached and i.stuck)]
        pipe.store.record_lingering(pipe.worker_id, lingering)

    def _release_untracked(self, now: datetime | None) -> None:
        """Let go of the jobs this worker owns in the database but does not hold (see
        sql.RELEASE_UNTRACKED): its live lease would keep them running for ever. A claim
        counts once it is UNTRACKED_AFTER_LEASES leases old, far past the moment between
        its commit and its entry in the tracker."""
        pipe = self.pipe
        lease = pipe.settings.lease_seconds
        released = pipe.store.release_untracked(
            pipe.worker_id, [i.job_id for i in pipe.tracker.items()],
            UNTRACKED_AFTER_LEASES * lease, lease, now)
        for job_id, attempt in released:
            emit(log, "untracked_job_released", logging.WARNING, job_id=job_id,
                 attempt=attempt, worker=pipe.worker_id,
                 detail="running on this worker in the database, but not held here (a "
                        "claim's reply or an outcome was lost with a database connection, "
                        "or an earlier process with this worker id stopped holding it); "
                        "its lease is left to expire and the timer retries it")

    def stuck_slots(self) -> int:
        """Handler slots held by handlers stuck past their deadline."""
        return sum(1 for item in self.pipe.tracker.handlers() if item.stuck)

    def check_all_stuck(self, now: float | None = None) -> None:
        """`SlotsStuck` once every slot has been held by a stuck handler for
        stuck_exit_seconds (0: never): no job can run here again until one returns."""
        now = time.monotonic() if now is None else now
        if self.stuck_slots() < self.pipe.settings.concurrency:
            self._all_stuck_since = None
            return
        if self._all_stuck_since is None:
            self._all_stuck_since = now
            emit(log, "all_slots_stuck", logging.ERROR, worker=self.pipe.worker_id,
                 slots=self.pipe.settings.concurrency,
                 exit_in_s=self.pipe.settings.stuck_exit_seconds or None,
                 detail="every handler slot is held by a handler stuck past its deadline: "
                        "this consumer takes no work until one returns")
        limit = self.pipe.settings.stuck_exit_seconds
        if limit and now - self._all_stuck_since >= limit:
            raise SlotsStuck(
                f"every handler slot ({self.pipe.settings.concurrency}) has been held by a "
                f"handler stuck past its deadline for {now - self._all_stuck_since:.0f} s "
                f"(TOCK_STUCK_EXIT_SECONDS={limit:g}): stopping so the process is "
                "restarted; their jobs were recovered elsewhere")

    def unready(self, now: float) -> str | None:
        """Not ready while its heartbeat is late (Loop.unready), or while every slot is
        held by a stuck handler: such a consumer takes no work."""
        why = super().unready(now)
        if why is None and self._all_stuck_since is not None:
            why = (f"every handler slot ({self.pipe.settings.concurrency}) is held by a "
                   f"handler stuck past its deadline for {now - self._all_stuck_since:.0f} s")
        return why

    def check_timeouts(self) -> None:
        """Signal handlers past their deadline; stop heartbeating ones stuck far past it, so
        their lease expires and the timer recovers the job as if this worker had died."""
        now = time.monotonic()
        for item in self.pipe.tracker.items():
            over = now - item.started - item.timeout_seconds
            # A handler that returned in time is not timed out by a slow write of its
            # outcome (a row lock, a stalled Postgres or SQS delete) after it.
            if over > 0 and not item.timed_out and not item.handler_done:
                item.timed_out = True
                item.stop("deadline passed")
                emit(log, "job_timeout", logging.WARNING, job_id=item.job_id,
                     attempt=item.attempt, timeout_s=item.timeout_seconds)
            if item.detached or item.released:
                continue
            if over > self.pipe.settings.lease_seconds and not item.handler_done:
                self._detach(item)
            elif item.abandoned and let_go(self.pipe, item) and item.handler_done:
                # Given up elsewhere (Abandon, an outcome Postgres refused) while the
                # database was away: detached now, so let it go.
                self.pipe.tracker.forget(item)

    def _detach(self, item: InFlight) -> None:
        """A handler ignoring its deadline by more than a lease: its job stops following
        this worker's lease and expires one lease from now, so the timer recovers it as if
        this worker had died (a thread cannot be killed; its slot is freed only when the
        handler returns, since only then is it safe to run another job on it)."""
        pipe = self.pipe
        if not let_go(pipe, item):
            return  # tried again on the next tick
        if item.mark_stuck():
            metrics.STUCK_HANDLERS.labels(item.context.kind).inc()
        emit(log, "handler_stuck", logging.ERROR, job_id=item.job_id, attempt=item.attempt,
             kind=item.context.kind, worker=pipe.worker_id,
             detail="handler ignored its deadline; lease left to expire, so the job is "
                    "recovered elsewhere; its thread and slot stay busy until it returns")


def _log_lost(item: InFlight, worker: str, *, cancelled: bool, claim_lost: bool) -> None:
    """A claim a heartbeat found lost. An operator's cancel is expected, so INFO under its
    own event; any other loss is WARNING: the lease expired and the job was taken over, or
    the claim itself did not survive a database restart (`cause`)."""
    if cancelled:
        emit(log, "cancelled_by_operator", logging.INFO, job_id=item.job_id,
             attempt=item.attempt, worker=worker,
             detail="the handler is told to stop (ctx.cancelled); its result is dropped")
    elif claim_lost:
        emit(log, "lease_lost", logging.WARNING, job_id=item.job_id, attempt=item.attempt,
             worker=worker, cause="claim_lost",
             detail="the claim did not survive a database restart; the job runs again "
                    "(this attempt number again); result will be dropped")
    else:
        emit(log, "lease_lost", logging.WARNING, job_id=item.job_id, attempt=item.attempt,
             worker=worker, cause="taken_over",
             detail="expired and taken over; result will be dropped")


def let_go(pipe: Pipeline, item: InFlight) -> bool:
    """Give a job up as a dead worker would: no more heartbeats for it, and its lease
    detached from this worker's (which stays alive for the other jobs), so it expires one
    lease from now and the timer recovers it. False if the database could not be reached:
    the lease keeper tries again at its next tick."""
    item.abandoned = True
    try:
        pipe.store.detach_lease(item.lease, pipe.worker_id, pipe.settings.lease_seconds,
                                pipe.clock())
    except Retryable:
        return False
    item.detached = True
    return True


class VisibilityKeeper(Loop):
    name = "visibility"

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        self.idle_seconds = pipe.settings.heartbeat_seconds
        self.pass_bound_seconds = pipe.sqs_pass_bound()

    def run_once(self, now: datetime | None = None) -> int:
        self.extend()
        return 0

    def extend(self) -> int:
        """Extend the visibility of every message whose job's lease holds; returns how
        many extensions SQS refused. The database lease stays the authority: a message
        that reappears anyway claims nothing."""
        pipe = self.pipe
        by_queue: dict[str, list[InFlight]] = defaultdict(list)
        for item in pipe.tracker.heartbeating():
            if not item.message_gone:
                by_queue[item.queue].append(item)
        refused = 0
        for q, items in by_queue.items():
            receipts = [item.receipt for item in items]
            for i in range(0, len(receipts), MAX_BATCH):
                asked = time.monotonic()
                try:
                    failures = pipe.transport.change_visibility_batch(
                        q, receipts[i:i + MAX_BATCH], pipe.settings.visibility_timeout_seconds)
                except TransportError as exc:
                    metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc()
                    if not isinstance(exc, QueueMissing):  # the transport reports that
                        emit(log, "visibility_extend_failed", logging.WARNING, queue=q,
                             error=str(exc))
                    refused += len(receipts[i:i + MAX_BATCH])
                    if pipe.hung(asked):
                        # SQS is not answering: every other call would hang as long, and
                        # the pass must end within its bound. The next beat tries again.
                        return refused
                    continue
                # A job whose outcome was written meanwhile has had its message deleted:
                # SQS refuses that receipt, and nothing is wrong.
                chunk = items[i:i + MAX_BATCH]
                failures = [f for f in failures if _still_held(pipe, chunk, f.entry_id)]
                gone = [f for f in failures if _message_gone(f)
                        and f.entry_id.isdigit() and int(f.entry_id) < len(chunk)]
                if gone:
                    failures = [f for f in failures if f not in gone]
                    _stop_extending(pipe, q, [chunk[int(f.entry_id)] for f in gone])
                if failures:
                    refused += len(failures)
                    metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc(len(failures))
                    # The code first: the message (receipt handle shortened) can be long.
                    emit(log, "visibility_extend_failed", logging.WARNING, queue=q,
                         entries=len(failures), code=failures[0].code,
                         error=failures[0].message)
        return refused


GONE_CODES = frozenset({"ReceiptHandleIsInvalid", "MessageNotInflight"})
"""Codes of a refused extension whose message is no more (besides the "does not exist"
text of SQS's InvalidParameterValue)."""


def _message_gone(failure: EntryFailure) -> bool:
    """Whether SQS refused an extension because the message no longer exists."""
    return failure.code in GONE_CODES or "does not exist" in failure.message


def _stop_extending(pipe: Pipeline, queue: str, items: list[InFlight]) -> None:
    """Extend these messages no more: asking again every heartbeat would fail the same way
    (a WARNING each time, for a job that runs on under its database lease)."""
    for item in items:
        item.message_gone = True
    emit(log, "visibility_extend_stopped", logging.INFO, queue=queue,
         job_ids=[i.job_id for i in items],
         detail="SQS says the message no longer exists (a redelivered copy was deleted, or "
                "its queue was deleted and made again); "
                "the job runs on under its database lease")


def _still_held(pipe: Pipeline, chunk: list[InFlight], entry_id: str) -> bool:
    """Whether the job of a refused entry (its id: its index in the call) is still held
    and its outcome not being written: else the refusal is the delete's doing."""
    try:
        item = chunk[int(entry_id)]
    except (ValueError, IndexError):
        return True  # not an id we sent: report it
    return pipe.tracker.holds(item) and item.heartbeating
