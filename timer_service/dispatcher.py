"""Due rows -> SQS messages.

Order, chosen so that no crash loses a job or leaves it stuck: claim (scheduled ->
dispatched with a new token), send, then commit, all in one transaction.
- Crash before the send, or between send and commit: the transaction rolls back, the job
  is due again at once and another pass sends it with a new token. A message already sent
  carries a token that was never committed, so it claims nothing and is dropped.
- A consumer that receives a message before the commit waits on the row lock for the
  moment it takes the commit to land, then claims normally.
- SQS refusing some entries: those rows are put back in the same transaction.
- SQS refusing some entries (or the whole call: the queue is missing, SQS is away): those
  rows are put back in the same transaction, due again after a backoff of their own
  (0.5 s doubling to 5 s), so they never block other rows; `explain` says why.
A message lost after the commit is covered by the rescuer's re-dispatch of lost messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from shared.core.errors import TransportError
from shared.core.messages import JobMessage
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.database import Listener
from shared.store.job_store import JobStore
from shared.store.rows import DueJob, Refused
from shared.transport.base import MAX_BATCH, EntryFailure, Transport
from timer_service import fair_share

log = logging.getLogger("tock.timer.dispatch")

DUE_CHANNEL = "tock_due"
"""NOTIFY channel: an insert of a near-due job, a retry, or a retry delay ending soon."""
REFUSED_PAUSE_SECONDS = 0.5
"""After a pass in which SQS took nothing: a pause, so the loop does not spin."""
REFUSED_BACKOFF_BASE_SECONDS = 0.5
REFUSED_BACKOFF_CAP_SECONDS = 5.0
STUCK_AFTER_FAILURES = 5
"""A job refused this many times in a row is reported (log line, explain)."""
REPORT_EVERY_SECONDS = 30.0
TOP_UP_ROUNDS = 3
"""Claims per level and pass: the fair shares, then up to two rounds handing what light
tenants left over to the ones that filled their share."""


class Dispatcher(Loop):
    """Claims due jobs in batches and sends them, several SendMessageBatch calls at once.
    Between passes it sleeps until the next due time, or until a NOTIFY on `tock_due`,
    never longer than `max_idle_seconds`."""

    name = "dispatch"
    threads = 2
    """Two passes in flight: one claims the next batch while the other's sends are out."""

    def __init__(self, store: JobStore, transport: Transport, *, batch_size: int,
                 send_concurrency: int, max_idle_seconds: float) -> None:
        super().__init__()
        self.store = store
        self.transport = transport
        self.batch_size = batch_size
        self.max_idle_seconds = max_idle_seconds
        self.ready_within_seconds = max(10.0, 5 * max_idle_seconds)
        self._executor = ThreadPoolExecutor(send_concurrency, thread_name_prefix="tock-send")
        self._local = threading.local()  # each dispatch thread: its listener, its last pass
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._reported: dict[str, float] = {}
        self._refusals: dict[str, int] = {}
        self._cursors: dict[int, str | None] = {}  # per level: the last tenant served

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            for listener in self._listeners:
                listener.close()
            self._listeners.clear()

    def run_once(self, now: datetime | None = None) -> int:
        """One batch; returns how many were sent. A full batch returns at once for more."""
        sent, refused = self.dispatch_due(now)
        self._local.refused = bool(refused) and not sent
        return sent if sent >= self.batch_size else 0

    def idle(self) -> None:
        if getattr(self._local, "refused", False):
            self.wait(REFUSED_PAUSE_SECONDS)  # SQS is refusing sends: do not spin on them
            return
        listener: Listener | None = getattr(self._local, "listener", None)
        try:
            if listener is None:
                assert self.store.database is not None
                listener = self._local.listener = self.store.database.listener(DUE_CHANNEL)
                with self._lock:
                    self._listeners.append(listener)
            wait = self.seconds_until_next_due()
            if wait > 0:
                listener.wait(min(wait, self.max_idle_seconds))
        except BaseException:
            if listener is not None:
                listener.close()
                self._local.listener = None
                with self._lock:
                    if listener in self._listeners:
                        self._listeners.remove(listener)
            raise

    def seconds_until_next_due(self) -> float:
        """How long until the earliest scheduled job is due, capped at max_idle_seconds."""
        next_due, db_now = self.store.next_due_at()
        if next_due is None:
            return self.max_idle_seconds
        wait = (next_due - db_now).total_seconds()
        return min(max(wait, 0.0), self.max_idle_seconds)

    def dispatch_due(self, now: datetime | None = None) -> tuple[int, int]:
        """Claim one batch, send it, commit; returns (sent, refused)."""
        with self.store.transaction() as tx:
            due = self.claim_batch(tx, now)
            if not due:
                return 0, 0
            failed = self._send(due)
            if failed:
                streaks = tx.undo_dispatch(
                    [Refused(j.id, j.prev_state, failed[j.id]) for j in due if j.id in failed],
                    backoff_base_seconds=REFUSED_BACKOFF_BASE_SECONDS,
                    backoff_cap_seconds=REFUSED_BACKOFF_CAP_SECONDS, now=now)
        if failed:
            self._report_stuck(due, streaks, failed)
        for job in due:
            if job.id not in failed:
                metrics.DUE_TO_DISPATCH.observe(max(job.lag_seconds, 0.0))
                emit(log, "job_dispatched", logging.DEBUG, job_id=job.id, kind=job.kind,
                     queue=job.queue, lag_ms=round(job.lag_seconds * 1000, 1))
        return len(due) - len(failed), len(failed)

    def claim_batch(self, tx: JobStore, now: datetime | None) -> list[DueJob]:
        """One batch: priority levels highest first; within a level, the tenants with due
        work share the batch by weight (fair_share), and what a tenant with little due
        leaves over goes to those that filled their share."""
        claimed: list[DueJob] = []
        for level in tx.due_levels(now):
            capacity = self.batch_size - len(claimed)
            if capacity <= 0:
                break
            with self._lock:
                cursor = self._cursors.get(level)
            after = tx.due_tenants(level, capacity, after=cursor, now=now)
            wrapped = (tx.due_tenants(level, capacity - len(after), now=now)
                       if cursor is not None and len(after) < capacity else [])
            walk = fair_share.round_from(after, wrapped, cursor, capacity)
            with self._lock:
                self._cursors[level] = walk[-1][0] if len(walk) >= capacity else None
            weights = dict(walk)
            share = fair_share.quotas(walk, capacity)
            for _ in range(TOP_UP_ROUNDS):
                got = tx.claim_tenants(level, share, now)
                claimed.extend(got)
                capacity -= len(got)
                taken: dict[str, int] = defaultdict(int)
                for job in got:
                    taken[job.tenant_key] += 1
                # Tenants that took their whole share may have more; the others are done.
                full = [(t, weights[t]) for t, n in share if taken[t] >= n]
                if capacity <= 0 or not full:
                    break
                share = fair_share.quotas(full, capacity)
        return claimed

    def _send(self, due: list[DueJob]) -> dict[int, str]:
        """Send every job; returns {job id: error} for the ones SQS did not take."""
        by_queue: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for job in due:
            by_queue[job.queue].append(
                (str(job.id), JobMessage(job.id, job.token, job.kind).encode()))
        calls = [
            (queue, entries[i:i + MAX_BATCH])
            for queue, entries in by_queue.items()
            for i in range(0, len(entries), MAX_BATCH)
        ]
        futures = [(q, chunk, self._executor.submit(self.transport.send_batch, q, chunk))
                   for q, chunk in calls]
        failed: dict[int, str] = {}
        for queue, chunk, future in futures:
            try:
                refused: list[EntryFailure] = future.result()
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("SendMessageBatch").inc()
                refused = [EntryFailure(entry_id, type(exc).__name__, str(exc))
                           for entry_id, _ in chunk]
            for failure in refused:
                failed[int(failure.entry_id)] = f"SQS refused the send: {failure.code}: " \
                                                f"{failure.message}"
            metrics.DISPATCHED.labels(queue).inc(len(chunk) - len(refused))
            if refused:
                metrics.DISPATCH_FAILURES.labels(queue).inc(len(refused))
                self._report_refused(queue, len(refused), refused[0])
        return failed

    def _report_refused(self, queue: str, count: int, example: EntryFailure) -> None:
        """One line per queue every REPORT_EVERY_SECONDS, however many passes fail."""
        self._refusals[queue] = self._refusals.get(queue, 0) + count
        now = time.monotonic()
        if now - self._reported.get(queue, -REPORT_EVERY_SECONDS) < REPORT_EVERY_SECONDS:
            return
        self._reported[queue] = now
        emit(log, "dispatch_refused", logging.WARNING, queue=queue,
             jobs=self._refusals.pop(queue), error=f"{example.code}: {example.message}",
             detail="the jobs stay due and are tried again with a backoff")

    def _report_stuck(self, due: list[DueJob], streaks: dict[int, int],
                      failed: dict[int, str]) -> None:
        for job in due:
            if streaks.get(job.id) == STUCK_AFTER_FAILURES:
                emit(log, "dispatch_stuck", logging.ERROR, job_id=job.id, queue=job.queue,
                     refused=STUCK_AFTER_FAILURES, error=failed[job.id])
