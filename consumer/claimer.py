"""Receive and claim: long-poll one SQS queue, then claim every message's job with one
fenced statement (job id AND dispatch token AND state 'dispatched'), and hand the claimed
jobs to the executor. Slots are reserved before receiving; beyond them a receiver holds
only the small prefetch buffer described below, whose messages are not claimed yet.

A message whose claim matches nothing (forged, stale, replayed, unknown job, malformed)
changes nothing and is deleted, with a `message_dropped` line naming the typed reason.

A message that arrives before its dispatch commits is deferred (made visible again a
moment later), but only until SQS has handed it out `defer_limit` times: each receive
counts towards the queue's maxReceiveCount, past which SQS would move it to the
dead-letter queue although its job may yet run. It is deleted instead
(`deferred_message_deleted`), which loses nothing: a dispatch that commits later leaves
the job `dispatched` with no message, which the timer's rescuer sends again after the
dispatch timeout (the queue then holds fewer messages than dispatched jobs), and a
dispatch that rolls back makes the job due again with a new token.

A receiver receives a little more than its free slots (consumer/prefetch.py): the rest
wait unclaimed in the queue's prefetch buffer and are taken in a fair order (priority,
then the tenant with the fewest recent starts) as slots free up, so a tenant's messages
sent behind another's backlog need not wait for SQS to hand out all of it. Those messages
are claimed only when taken; on stop (or with the database away) they are handed back at
once, and a killed process's come back after the visibility timeout.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from consumer.inflight import InFlight
from consumer.pipeline import Pipeline, Work
from consumer.prefetch import CAP_PER_SLOT, Prefetch
from consumer.tasks import CancelFlag, TaskContext
from shared.core.errors import (
    DataRejected,
    InvalidMessage,
    JobNotFound,
    LockTimeout,
    Retryable,
    StaleMessage,
    TockError,
    TransportError,
)
from shared.core.messages import JobMessage, decode
from shared.core.states import JobState
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.rows import Claim, ClaimedJob, Lease
from shared.transport.base import MAX_BATCH, MAX_WAIT_SECONDS, Received
from shared.transport.sqs import ATTEMPTS

log = logging.getLogger("tock.consumer")

DROP_ERRORS: dict[str, type[TockError]] = {
    "malformed": InvalidMessage,
    "unknown_job": JobNotFound,
    "stale_token": StaleMessage,
    "not_dispatched": StaleMessage,
    "duplicate": StaleMessage,
    "rejected": InvalidMessage,
}
"""The typed error behind each reason a message claims nothing."""
REDELIVERIES = frozenset({"not_dispatched", "duplicate", "stale_token"})
"""Reasons that are a copy of a message whose job has moved on, logged at INFO, not
WARNING: a second copy of the current dispatch's message (SQS delivers a standard queue's
messages at least once, and a send retried after a timeout SQS had in fact taken sends one
twice), or the message of an earlier dispatch (a send that timed out, though SQS took it:
the dispatch rolled back and the job went out again with a new token; after an SQS
partition, hundreds). The others (malformed, an unknown job, refused: not tock's messages)
stay warnings; the `tock_messages_dropped_total` counter has every reason."""

RETRY_LATER_SECONDS = 1
"""Visibility given to a deferred message: it comes back after this long."""
ASYNC_BLOCKED_SECONDS = 1.0
"""An event loop blocked this long takes no more async jobs (Claimer._leave_async)."""
ASYNC_DEFER_SECONDS = 5
"""Visibility given to an async job's message left for another consumer."""
ASYNC_SIT_OUT_MARGIN_SECONDS = 1.0
"""After leaving async jobs' messages, a claimer whose loop is still blocked receives
nothing until they are visible again and this long more: the others get them first."""
ASYNC_DEFER_LOG_SECONDS = 10.0
MAX_DEFERRED_RECEIVES = 5
"""A message still waiting for its dispatch commit when received this many times (or
TOCK_DEAD_LETTER_AFTER times, if fewer) is deleted rather than deferred again: 5 receives
are about 15 s of an uncommitted dispatch, far past a slow send."""
PREFETCH_GIVE_BACK_SECONDS = 10.0
"""A prefetched message unclaimed this long (or half the visibility timeout, if less:
handlers slowed down) is handed back to SQS for another consumer, well before its
visibility runs out."""

Drop = tuple[Received, str, str]
"""(message, reason, detail)."""
Parsed = tuple[Received, JobMessage]
Rejected = tuple[Received, JobMessage, str]


class Claimer(Loop):
    """Receives from one queue on two threads."""

    name = "claim"
    threads = 2

    def __init__(self, pipe: Pipeline, queue: str) -> None:
        super().__init__()
        self.pipe = pipe
        self.queue = queue
        self.name = f"claim-{queue}"
        settings = pipe.settings
        # A pass is one long poll plus a claim that may wait for a dispatch commit, then the
        # deletes of what claimed nothing. Into an SQS that does not answer, the long poll
        # takes ATTEMPTS x its read timeout (call timeout + MAX_WAIT_SECONDS, whatever the
        # wait asked) and any other call ATTEMPTS x the call timeout: a partition must not
        # fail liveness (the bound was wait + 3 x call timeout + 60: 92 s by default, while
        # a hung receive took 4 x 30 s).
        self.pass_bound_seconds = (
            ATTEMPTS * (settings.sqs_call_timeout_seconds + MAX_WAIT_SECONDS)
            + ATTEMPTS * settings.sqs_call_timeout_seconds + 60)
        # Not ready while its queue cannot be received from (SQS away, the queue missing):
        # a pass is one long poll, which ends within the wait and a call's timeout.
        self.ready_within_seconds = (settings.receive_wait_seconds
                                     + settings.sqs_call_timeout_seconds + 5)
        self.stall_log_seconds = self.ready_within_seconds
        # At most the DLQ's maxReceiveCount (of queues tock creates): a message deferred
        # at that count would go to the DLQ at its next receive.
        self.defer_limit = min(MAX_DEFERRED_RECEIVES, settings.dead_letter_after)
        self._async_left_logged = -ASYNC_DEFER_LOG_SECONDS
        # (monotonic) until when this claimer sits out, having left async jobs' messages
        # for others while its event loop is blocked (`_leave_async`)
        self._sit_out_until = 0.0
        self._found_empty = False
        """The last receive from this queue returned nothing: the next reserves only
        `_idle_share` slots."""
        self._idle_share = max(1, settings.concurrency
                               // (self.threads * max(len(settings.queues), 1)))
        """Every receiver of every queue can long-poll at once with this many slots."""
        self.prefetch = Prefetch(
            CAP_PER_SLOT * settings.concurrency,
            min(PREFETCH_GIVE_BACK_SECONDS, settings.visibility_timeout_seconds / 2))
        """Received, not yet claimed: shared by this queue's receivers."""
        self._lendable = 0
        """Slots reserved by this queue's receivers for a long poll of an empty buffer,
        which the queue's other receiver may take to start what it buffered meanwhile
        (`_borrow`), rather than leave it there until the poll ends."""
        self._lending = threading.Lock()

    explicit_success = True
    """Marked by every pass that raised nothing, so a step-by-step `receive_once` counts
    towards readiness as a pass of the loop does."""

    def run_once(self, now: datetime | None = None, wait_seconds: int | None = None) -> int:
        """Receive one batch, claim it, hand the claimed jobs to the executor; returns how
        many were claimed."""
        claimed = self._pass(wait_seconds)
        if claimed is None:
            # No slot, and not for handlers holding them all (then the process is busy,
            # which is fine): other receivers hold them. This queue was not received from,
            # so readiness must not say it was.
            return 0
        self.mark_ok()
        return claimed

    def _pass(self, wait_seconds: int | None) -> int | None:
        """One receive and claim: how many jobs were claimed; None if no handler slot
        could be had while not every slot was running a handler."""
        pipe = self.pipe
        overdue = self.prefetch.overdue()
        if overdue:  # before its visibility runs out: another consumer may have a slot
            self._retry_later(overdue, 0)
        if len(pipe.tracker) >= pipe.max_tracked:
            # Outcomes are waiting to be written (database slow?): do not take more.
            self.wait(0.05)
            return 0
        if pipe.database_away:
            # Every receive counts towards the queue's maxReceiveCount: receiving while the
            # claim cannot run would walk the messages into the dead-letter queue in a few
            # seconds of an outage. Raises Retryable (and the loop backs off) until it is
            # back.
            pipe.claim_store.ping()
            pipe.database_away = False
        if pipe.worker_id_pending:
            # The heartbeat loop has yet to take this worker's id: a claim now could be
            # under an id another live process holds.
            self.wait(0.1)
            return None
        if self._async_blocked() and all(self._on_event_loop(t.kind)
                                         for t in pipe.registry.tasks()):
            # Every kind it runs would wait for the blocked event loop: receive nothing (a
            # receive would only hand messages back), so other consumers get them at once.
            self.wait(0.1)
            return 0
        if time.monotonic() < self._sit_out_until and self._async_blocked():
            # It just left async jobs' messages for others: it stays out of the queue until
            # they are visible again, so that another consumer receives them, not this one
            # again (each receive counts towards the limit past which it claims them).
            self.wait(min(self._sit_out_until - time.monotonic(), 0.1))
            return 0
        # A queue found empty is long-polled with its receiver's share of the slots, not
        # a whole batch: its receivers would otherwise hold every slot for their long
        # polls, and another queue's receivers would wait for them. The next receive after
        # one that found messages takes a batch again.
        most = self._idle_share if self._found_empty else pipe.settings.claim_batch_size
        reserved = self._borrow(min(most, len(self.prefetch)))
        if reserved < most:
            reserved += pipe.slots.reserve(most - reserved, timeout=0 if reserved else 0.5)
        if not reserved and not self.prefetch.room():
            return 0 if pipe.slots.running_only else None
        kept = 0
        try:
            # Prefetched messages first, in their fair order: their jobs start without
            # waiting for an SQS call. Then a receive for the slots left and the room.
            taken = self.prefetch.take(reserved)
            kept += self._claim_and_start(taken)
            rest = reserved - len(taken)
            idle = not taken and not len(self.prefetch)
            if idle:  # a long poll: its slots may be lent meanwhile
                with self._lending:
                    self._lendable += rest
            try:
                received = self._top_up(rest, idle, wait_seconds)
            finally:
                if idle:
                    back = self._borrow(rest)
                    reserved -= rest - back
                    rest = back
            if not received:
                return kept
            if rest:
                kept += self._claim_and_start(self.prefetch.take(rest))
        finally:
            pipe.slots.settle(reserved, kept)
        return kept

    def _borrow(self, most: int) -> int:
        """Up to `most` of the slots lent by long polls of this queue (`_lendable`): the
        taker settles them as its own reservation."""
        if most <= 0:
            return 0
        with self._lending:
            got = min(most, self._lendable)
            self._lendable -= got
            return got

    def _top_up(self, rest: int, idle: bool, wait_seconds: int | None) -> bool:
        """Receive for `rest` free slots and the buffer's room, into the buffer; False when
        stopping (what came is handed back). Long-polls only when `idle` (nothing taken or
        held): a slot that frees meanwhile must find the prefetched messages, not wait for
        the poll."""
        room = self.prefetch.hold_room()
        try:
            self._found_empty = False
            if not rest + room:
                return True
            wait = self.pipe.settings.receive_wait_seconds if wait_seconds is None \
                else wait_seconds
            messages = self._receive(rest + room, wait if idle else 0)
            self._found_empty = idle and not messages
            if self.stopping:
                # Shutting down: this process may be past its grace already (a receive
                # that hung). Hand the messages back at once rather than start them.
                self.hand_back(messages)
                return False
            self.prefetch.add(messages)
            return True
        finally:
            self.prefetch.release_room(room)

    def _claim_and_start(self, taken: list[Received]) -> int:
        """Claim the messages taken from the prefetch buffer, hand the claimed jobs to the
        executor, then make the SQS calls for the rest; returns how many were claimed."""
        if not taken:
            return 0
        pipe = self.pipe
        tidy: list[Callable[[], None]] = []
        try:
            claimed = self._claim(taken, tidy)
        except Retryable:
            # The database is away: receive no more until it answers, and let these
            # messages (and the prefetched ones) come back once the other receivers' long
            # polls have ended (so they have seen the flag: no receive is spent on them
            # meanwhile), not after a whole visibility timeout.
            pipe.database_away = True
            self._retry_later(taken + self.prefetch.drain(),
                              pipe.settings.receive_wait_seconds + 1)
            raise
        for entry in claimed:
            pipe.work.put(entry)
        # Only now the SQS calls for the messages that claimed nothing (deletes, deferrals):
        # each may hang up to its call timeout (times botocore's attempts) when SQS is cut
        # off, and the jobs just claimed must not wait for them, untracked meanwhile (no
        # visibility extension, their deadline running, and after two leases let go by the
        # heartbeat as claims this worker never held: run twice).
        for step in tidy:
            step()
        return len(claimed)

    def hand_back(self, received: list[Received] | None = None) -> None:
        """Make `received` and every prefetched message visible again at once (stopping):
        another consumer claims them now, not after the visibility timeout."""
        messages = (received or []) + self.prefetch.drain()
        if messages:
            self._retry_later(messages, 0)

    def _receive(self, room: int, wait: int) -> list[Received]:
        """Long-poll once; while SQS hands out full batches (a backlog) and handler slots
        are free, receive again at once, so one claim statement covers several receives."""
        pipe, visibility = self.pipe, self.pipe.settings.visibility_timeout_seconds
        try:
            got = pipe.transport.receive(self.queue, min(room, MAX_BATCH), wait, visibility)
        except TransportError:
            metrics.SQS_ERRORS.labels("ReceiveMessage").inc()
            raise
        messages = list(got)
        while len(got) == MAX_BATCH and len(messages) < room:
            try:
                got = pipe.transport.receive(self.queue, min(room - len(messages), MAX_BATCH),
                                             0, visibility)
            except TransportError:  # claim what came; the next pass meets the error again
                metrics.SQS_ERRORS.labels("ReceiveMessage").inc()
                break
            messages += got
        return messages

    def claim(self, messages: list[Received]) -> list[Work]:
        """Claim what the messages point at; drop (delete) the rest."""
        tidy: list[Callable[[], None]] = []
        work = self._claim(messages, tidy)
        for step in tidy:
            step()
        return work

    def _claim(self, messages: list[Received], tidy: list[Callable[[], None]]) -> list[Work]:
        """Claim what the messages point at and start tracking the claimed jobs; the SQS
        calls for the rest (drop, defer) are appended to `tidy`, for the caller to make
        once the claimed jobs are handed to the executor."""
        # Keyed by (job, token, kind): a stale message and the current one for the same job
        # may arrive in one batch, and only the database knows which one is current (and a
        # copy naming another kind must not push the real one out as a duplicate).
        wanted: dict[tuple[int, UUID, str], tuple[Received, JobMessage]] = {}
        drop: list[Drop] = []
        blocked = self._async_blocked()
        left: list[Received] = []
        for msg in messages:
            try:
                parsed = decode(msg.body)
            except InvalidMessage as exc:
                drop.append((msg, "malformed", str(exc)))
                continue
            key = (parsed.job_id, parsed.token, parsed.kind)
            if key in wanted:
                drop.append((msg, "duplicate", f"job {parsed.job_id} twice in one batch"))
                continue
            if blocked and self._on_event_loop(parsed.kind) \
                    and msg.receive_count < self.defer_limit:
                left.append(msg)  # for another consumer, whose event loop runs
                continue
            wanted[key] = (msg, parsed)
        if left:
            tidy.append(functools.partial(self._leave_async, left, blocked))
        rows: list[ClaimedJob] = []
        if wanted:
            rows, rejected = self._claim_each_if_rejected(list(wanted.values()))
            for msg, parsed, reason in rejected:
                wanted.pop((parsed.job_id, parsed.token, parsed.kind))
                drop.append((msg, "rejected", reason))
            # The timer sends before it commits; a message can arrive while the dispatch is
            # still uncommitted and so invisible to our claim. Wait for those rows' locks
            # (the commit takes milliseconds), then try once more.
            missed = [wanted[k] for k in wanted.keys() - {(r.id, r.token, r.kind) for r in rows}]
            if missed:
                try:
                    rows += self._claim_rows(missed, wait_for_locks=True)
                except LockTimeout:
                    # The dispatch is still open (a slow send): let SQS bring these back in a
                    # moment rather than hold this receiver.
                    tidy.append(functools.partial(self._defer, missed))
                    for _, p in missed:
                        wanted.pop((p.job_id, p.token, p.kind))
            got = {(r.id, r.token, r.kind) for r in rows}
            unmatched = [v for k, v in wanted.items() if k not in got]
            if unmatched:
                drop += self._explain_unclaimed(unmatched)
        work = [self._start(row, wanted[(row.id, row.token, row.kind)][0]) for row in rows]
        if drop:
            tidy.append(functools.partial(self._drop, drop))
        return work

    def _start(self, row: ClaimedJob, msg: Received) -> Work:
        pipe = self.pipe
        ctx = TaskContext(
            job_id=row.id, kind=row.kind, queue=row.queue, attempt=row.attempt,
            max_attempts=row.max_attempts, scheduled_at=row.run_at,
            deadline=row.claimed_at + timedelta(seconds=row.timeout_seconds), tenant=row.tenant,
            key=row.key, cancelled=CancelFlag())
        item = InFlight(Lease(row.id, row.attempt, row.token), self.queue, msg.receipt, ctx,
                        timeout_seconds=row.timeout_seconds)
        pipe.tracker.add(item)
        metrics.child(metrics.DUE_TO_START, row.kind).observe(max(row.lag_seconds, 0.0))
        emit(log, "job_started", logging.DEBUG, job_id=row.id, kind=row.kind,
             attempt=row.attempt, worker=pipe.worker_id, lag_ms=round(row.lag_seconds * 1000, 1))
        return Work(item, row.payload, pipe.registry.get(row.kind))

    def _claim_each_if_rejected(self, batch: list[Parsed]
                                ) -> tuple[list[ClaimedJob], list[Rejected]]:
        """Claim the batch in one statement; should Postgres refuse a value in it (which
        `decode` is there to prevent), claim message by message so the one it refuses is
        dropped and the others still run."""
        try:
            return self._claim_rows(batch), []
        except DataRejected:
            pass
        rows: list[ClaimedJob] = []
        rejected = []
        for one in batch:
            try:
                rows += self._claim_rows([one])
            except DataRejected as exc:
                rejected.append((one[0], one[1], str(exc)))
        return rows, rejected

    def _claim_rows(self, batch: list[tuple[Received, JobMessage]], *,
                    wait_for_locks: bool = False) -> list[ClaimedJob]:
        pipe = self.pipe
        claims = []
        for _, parsed in batch:
            task = pipe.registry.get(parsed.kind)
            claims.append(Claim(
                parsed.job_id, parsed.token,
                (task and task.max_attempts) or pipe.settings.default_max_attempts,
                (task and task.timeout_seconds) or pipe.settings.default_timeout_seconds,
                kind=parsed.kind, queue=self.queue))
        return pipe.claim_store.claim_messages(
            claims, pipe.worker_id, pipe.settings.lease_seconds, pipe.clock(),
            wait_for_locks=wait_for_locks)

    def _async_blocked(self) -> float:
        """How long this consumer's event loop has been blocked, if past ASYNC_BLOCKED_SECONDS
        (0 otherwise)."""
        blocked = self.pipe.async_blocked_for()
        return blocked if blocked > ASYNC_BLOCKED_SECONDS else 0.0

    def _on_event_loop(self, kind: str) -> bool:
        task = self.pipe.registry.get(kind)
        return task is not None and task.is_async \
            and task.runs_in(self.pipe.settings.isolation) == "thread"

    def _leave_async(self, messages: list[Received], blocked: float) -> None:
        """Async jobs received while the event loop is blocked (a handler running blocking
        code on it): claimed here, they would only wait past their deadline and lose an
        attempt, so their messages come back for another consumer in a few seconds (at
        most `defer_limit` receives: then they are claimed here all the same), and this
        claimer receives nothing until then, so that another consumer does. A consumer
        that runs only async kinds does not receive at all meanwhile (`_pass`)."""
        self._retry_later(messages, ASYNC_DEFER_SECONDS)
        now = time.monotonic()
        self._sit_out_until = now + ASYNC_DEFER_SECONDS + ASYNC_SIT_OUT_MARGIN_SECONDS
        if now - self._async_left_logged >= ASYNC_DEFER_LOG_SECONDS:
            self._async_left_logged = now
            emit(log, "async_jobs_deferred", logging.WARNING, queue=self.queue,
                 messages=len(messages), blocked_s=round(blocked, 1),
                 worker=self.pipe.worker_id,
                 detail="this consumer's event loop is blocked (an async handler running "
                        "blocking code): its async jobs are left to other consumers")

    def _retry_later(self, messages: list[Received],
                     seconds: int = RETRY_LATER_SECONDS) -> None:
        """Make the messages visible again after `seconds` (0: now)."""
        self.pipe.make_visible(self.queue, [m.receipt for m in messages], seconds)
        emit(log, "claim_deferred", logging.DEBUG, queue=self.queue, messages=len(messages),
             retry_in_seconds=seconds,
             most_receives=max((m.receive_count for m in messages), default=0))

    def _defer(self, waiting: list[Parsed]) -> None:
        """Messages whose dispatch has not committed: back in a moment, or deleted once
        SQS has handed them out `defer_limit` times (see the module docstring)."""
        spent = [(m, p) for m, p in waiting if m.receive_count >= self.defer_limit]
        again = [m for m, _ in waiting if m.receive_count < self.defer_limit]
        if again:
            self._retry_later(again)
        if not spent:
            return
        for msg, parsed in spent:  # once per message: it is gone after this
            metrics.MESSAGES_DROPPED.labels("dispatch_uncommitted").inc()
            emit(log, "deferred_message_deleted", logging.WARNING, job_id=parsed.job_id,
                 message_id=msg.message_id, queue=self.queue, receives=msg.receive_count,
                 detail="its job's row stayed locked through every receive: a dispatch "
                        "not committed (a timer stalled between send and commit), or "
                        "another transaction holding the row (the job's own outcome being "
                        "written, an operator's session); deleted before SQS moves it to "
                        "the dead-letter queue. A dispatch that commits is sent again after "
                        "the dispatch timeout; one that rolls back leaves the job due; a "
                        "running job goes on under its lease")
        self.pipe.delete(self.queue, [m.receipt for m, _ in spent])

    def _explain_unclaimed(self, batch: list[tuple[Received, JobMessage]]) -> list[Drop]:
        found = self.pipe.store.job_states([p.job_id for _, p in batch])
        routes = self.pipe.store.job_routes(
            [p.job_id for _, p in batch if p.job_id in found
             and found[p.job_id] == (JobState.DISPATCHED, p.token)])
        out: list[Drop] = []
        for msg, parsed in batch:
            if parsed.job_id not in found:
                out.append((msg, "unknown_job", f"no job {parsed.job_id}"))
                continue
            state, token = found[parsed.job_id]
            if token != parsed.token:
                out.append((msg, "stale_token", (
                    f"job {parsed.job_id} is {state} and has never been sent (the "
                    "message's token is none of its: forged, or of another database)"
                    if token is None else
                    f"job {parsed.job_id} is {state}, under a dispatch token other than "
                    "the message's (a copy of an earlier dispatch)")))
            elif state is JobState.DISPATCHED:  # its token, yet no claim: not its kind/queue
                kind, queue = routes.get(parsed.job_id, ("?", "?"))
                out.append((msg, "rejected", (
                    f"job {parsed.job_id} is not of the kind the message names, "
                    f"{parsed.kind!r}" if kind != parsed.kind else
                    f"job {parsed.job_id} belongs to queue {queue!r}, not {self.queue!r} "
                    "(a copied or moved message: the job's own goes on, or is sent again)")))
            else:
                out.append((msg, "not_dispatched", f"job {parsed.job_id} is already {state}"))
        return out

    def _drop(self, drop: list[Drop]) -> None:
        if not drop:
            return
        for msg, reason, detail in drop:
            # Each reason is one of tock's typed errors; the message changed no job.
            error = DROP_ERRORS[reason](detail)
            metrics.MESSAGES_DROPPED.labels(reason).inc()
            level = logging.INFO if reason in REDELIVERIES else logging.WARNING
            emit(log, "message_dropped", level, reason=reason,
                 error=f"{type(error).__name__}: {error}", message_id=msg.message_id,
                 queue=self.queue)
        self.pipe.delete(self.queue, [m.receipt for m, _, _ in drop])


