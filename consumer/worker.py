"""A consumer process: receivers, handler threads, a completer and a heartbeat.

    receivers ──claim (fenced, batched)──► handler threads ──► completer
       (long poll, reserve slots first)                         one fenced UPDATE per batch,
                                                                commit, THEN DeleteMessageBatch
    heartbeat: one fenced UPDATE for every lease held + ChangeMessageVisibilityBatch

The database lease is the authority. A message whose claim matches nothing (forged,
stale, replayed, unknown job) changes nothing and is deleted. A result whose fence matches
nothing (the lease was lost) is discarded. Messages are deleted only after the outcome
is committed, so a crash at any point leaves the job recoverable.
"""

from __future__ import annotations

import logging
import os
import queue as queues
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from consumer import outcomes
from consumer.inflight import InFlight, Slots
from consumer.outcomes import Finished, TimedOut
from consumer.tasks import Abandon, Registry, Task, TaskContext
from shared.core.errors import (
    DatabaseUnavailable,
    InvalidMessage,
    JobNotFound,
    LeaseLost,
    StaleMessage,
    TockError,
    TransportError,
)
from shared.core.messages import JobMessage, decode
from shared.core.states import AttemptOutcome, JobState
from shared.runtime import metrics
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import emit
from shared.runtime.settings import ConsumerSettings
from shared.store import jobs_sql as sql
from shared.store.database import make_pool, statement, transaction
from shared.transport.base import Received, Transport
from shared.transport.sqs import MAX_BATCH, SqsTransport

log = logging.getLogger("tock.consumer")

_DROP_ERRORS: dict[str, type[TockError]] = {
    "malformed": InvalidMessage,
    "unknown_job": JobNotFound,
    "stale_token": StaleMessage,
    "not_dispatched": StaleMessage,
    "duplicate": StaleMessage,
}
"""The typed error behind each reason a message claims nothing."""

LOCK_WAIT_MS = 2000
"""Longest a claim waits for the timer's dispatch commit before deferring the message."""
RETRY_LATER_SECONDS = 1
"""Visibility given to a deferred message: it comes back after this long."""
TICK_SECONDS = 0.2
"""How often timeouts are checked; heartbeats go out every heartbeat_seconds."""


class Consumer:
    """One consumer process's machinery. `run_forever()` for production; tests drive
    `receive_once`, `heartbeat_once` and `complete_pending` step by step."""

    def __init__(self, settings: ConsumerSettings, registry: Registry,
                 transport: Transport | None = None,
                 clock: Callable[[], datetime | None] = lambda: None) -> None:
        """`clock` pins the database's "now" for leases (tests); None means the database
        clock, which is what production uses: leases are judged by one clock."""
        self.settings = settings
        self.clock = clock
        self.registry = registry
        self.worker_id = settings.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        # Outcomes, heartbeats: durable commits. Claims: a claim lost in a database crash
        # leaves the job dispatched and its message undeleted, so it is claimed again (or
        # re-dispatched): no WAL-flush wait needed. No checkout checks: the loops retry.
        self.pool = make_pool(settings.database_url, max_size=6, name="tock-consumer",
                              check=False, autocommit=True)
        self.claim_pool = make_pool(settings.database_url, max_size=4, name="tock-claim",
                                    check=False, autocommit=True, synchronous_commit=False)
        self.transport = transport or SqsTransport(
            settings.queue_prefix, call_timeout_seconds=settings.sqs_call_timeout_seconds,
            max_connections=max(20, settings.concurrency + 10))
        self.slots = Slots(settings.concurrency)
        self.stop_flag = StopFlag()
        self._inflight: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._max_tracked = 4 * settings.concurrency + MAX_BATCH
        self._work: queues.Queue[tuple[InFlight, Any, Task | None] | None] = queues.Queue()
        self._done: queues.Queue[Finished] = queues.Queue()
        self._threads: list[threading.Thread] = []
        self._receiving = threading.Event()
        self._opened = False
        self.last_heartbeat_ok: float | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        if not self._opened:
            self.pool.open()
            self.claim_pool.open()
            self._opened = True

    def close(self) -> None:
        """Close the database pools (after `shutdown`, or when driven step by step)."""
        self.pool.close()
        self.claim_pool.close()

    def start(self) -> None:
        """Start every thread; returns at once."""
        self.open()
        self._announce()
        self._receiving.set()
        for q in self.settings.queues:
            for n in range(2):
                self._spawn(f"receive-{q}-{n}", self._receive_loop, q)
        for n in range(self.settings.concurrency):
            self._spawn(f"handler-{n}", self._handler_loop)
        self._spawn("complete", self._complete_loop)
        self._spawn("heartbeat", self._tick_loop)
        emit(log, "consumer_started", worker=self.worker_id, queues=self.settings.queues,
             concurrency=self.settings.concurrency, tasks=self.registry.kinds())

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT, then shut down gracefully."""
        self.start()
        while not self.stop_flag.wait(1.0):
            pass
        self.shutdown()

    def shutdown(self) -> None:
        """Stop receiving; let in-flight jobs finish within the grace period; release the
        rest (fenced) so they run elsewhere at once; stop."""
        emit(log, "consumer_stopping", worker=self.worker_id, in_flight=len(self._inflight),
             grace_seconds=self.settings.shutdown_grace_seconds)
        self._receiving.clear()
        self.stop_flag.set()
        for t in self._threads:
            if t.name.startswith("tock-receive"):
                t.join()
        if not self.slots.wait_idle(self.settings.shutdown_grace_seconds):
            self._release_unfinished()
        self._wait_settled(10.0)
        for _ in range(self.settings.concurrency):
            self._work.put(None)
        self._done_stop = True
        for t in self._threads:
            if t.name in ("tock-complete", "tock-heartbeat"):
                t.join(timeout=10)
        try:
            with transaction(self.pool) as conn:
                conn.execute(sql.STOP_WORKER, {"id": self.worker_id, "now": self.clock()})
        except DatabaseUnavailable:
            pass
        self.close()
        emit(log, "consumer_stopped", worker=self.worker_id)

    _done_stop = False

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        # Daemon threads: a handler stuck past its deadline must not keep the process alive
        # after shutdown (its job was released or its lease left to expire).
        thread = threading.Thread(target=target, args=args, name=f"tock-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _announce(self) -> None:
        with transaction(self.pool) as conn:
            self._upsert_worker(conn)
        self.last_heartbeat_ok = time.monotonic()  # ready from the start (shared.health)

    def _upsert_worker(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.UPSERT_WORKER, {
            "id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
            "queues": self.settings.queues, "concurrency": self.settings.concurrency,
            "in_flight": len(self._inflight), "now": self.clock(),
        })

    # --- receive and claim -----------------------------------------------------------------

    def _receive_loop(self, queue: str) -> None:
        backoff = 0.0
        while self._receiving.is_set():
            try:
                self.receive_once(queue)
                backoff = 0.0
            except (TransportError, DatabaseUnavailable) as exc:
                backoff = min(max(backoff * 2, 0.2), 5.0)
                emit(log, "receive_failed", logging.ERROR, queue=queue, error=str(exc),
                     retry_in_seconds=backoff)
                self.stop_flag.wait(backoff)

    def receive_once(self, queue: str, wait_seconds: int | None = None) -> int:
        """Receive one batch from `queue`, claim it, hand the claimed jobs to handler
        threads; returns how many were claimed."""
        if len(self._inflight) >= self._max_tracked:
            # Outcomes are waiting to be written (database slow?): do not take more.
            self.stop_flag.wait(0.05)
            return 0
        reserved = self.slots.reserve(MAX_BATCH, timeout=0.5)
        if not reserved:
            return 0
        claimed: list[tuple[InFlight, Any, Task | None]] = []
        try:
            wait = self.settings.receive_wait_seconds if wait_seconds is None else wait_seconds
            try:
                messages = self.transport.receive(queue, reserved, wait,
                                                  self.settings.visibility_timeout_seconds)
            except TransportError:
                metrics.SQS_ERRORS.labels("ReceiveMessage").inc()
                raise
            if messages:
                claimed = self._claim(queue, messages)
        finally:
            self.slots.release(reserved - len(claimed))
        for entry in claimed:
            self._work.put(entry)
        return len(claimed)

    def _claim(self, queue: str, messages: list[Received]
               ) -> list[tuple[InFlight, Any, Task | None]]:
        # Keyed by (job, token): a stale message and the current one for the same job may
        # arrive in one batch, and only the database knows which one is current.
        wanted: dict[tuple[int, uuid.UUID], tuple[Received, JobMessage]] = {}
        drop: list[tuple[Received, str, str]] = []
        for msg in messages:
            try:
                parsed = decode(msg.body)
            except InvalidMessage as exc:
                drop.append((msg, "malformed", str(exc)))
                continue
            key = (parsed.job_id, parsed.token)
            if key in wanted:
                drop.append((msg, "duplicate", f"job {parsed.job_id} twice in one batch"))
                continue
            wanted[key] = (msg, parsed)
        rows: list[Any] = []
        if wanted:
            rows = self._claim_rows(list(wanted.values()))
            # The timer sends before it commits; a message can arrive while the dispatch is
            # still uncommitted and so invisible to our claim. Wait for those rows' locks
            # (the commit takes milliseconds), then try once more.
            missed = [wanted[k] for k in wanted.keys() - {(r[0], r[7]) for r in rows}]
            if missed:
                try:
                    rows += self._claim_rows(missed, wait_for_locks=True)
                except psycopg.errors.LockNotAvailable:
                    # The dispatch is still open (a slow send): let SQS bring these back in a
                    # moment rather than hold this receiver.
                    self._retry_later(queue, [m for m, _ in missed])
                    for _, p in missed:
                        wanted.pop((p.job_id, p.token))
            got = {(r[0], r[7]) for r in rows}
            unmatched = [v for k, v in wanted.items() if k not in got]
            if unmatched:
                drop += self._explain_unclaimed(unmatched)
        self._drop(queue, drop)
        claimed = []
        for row in rows:
            (job_id, kind, payload, attempt, max_attempts, timeout, run_at, token, q, tenant,
             key, lag) = row
            msg = wanted[(job_id, token)][0]
            now = run_at + timedelta(seconds=lag)
            ctx = TaskContext(
                job_id=job_id, kind=kind, queue=q, attempt=attempt, max_attempts=max_attempts,
                scheduled_at=run_at, deadline=now + timedelta(seconds=timeout), tenant=tenant,
                key=key, cancelled=threading.Event())
            item = InFlight(job_id, attempt, token, queue, msg.receipt, ctx,
                            timeout_seconds=timeout)
            with self._lock:
                self._inflight[job_id] = item
            metrics.DUE_TO_START.labels(kind).observe(max(lag, 0.0))
            emit(log, "job_started", logging.DEBUG, job_id=job_id, kind=kind,
                 attempt=attempt, worker=self.worker_id, lag_ms=round(lag * 1000, 1))
            claimed.append((item, payload, self.registry.get(kind)))
        return claimed

    def _claim_rows(self, batch: list[tuple[Received, JobMessage]], *,
                    wait_for_locks: bool = False) -> list[Any]:
        defaults_max, defaults_timeout = [], []
        for _, parsed in batch:
            task = self.registry.get(parsed.kind)
            defaults_max.append((task and task.max_attempts) or self.settings.default_max_attempts)
            defaults_timeout.append((task and task.timeout_seconds)
                                    or self.settings.default_timeout_seconds)
        ids = [p.job_id for _, p in batch]
        with (transaction if wait_for_locks else statement)(self.claim_pool) as conn:
            if wait_for_locks:
                conn.execute(sql.SET_LOCK_TIMEOUT, {"ms": LOCK_WAIT_MS})
                conn.execute(sql.WAIT_FOR_DISPATCH_COMMIT, {"ids": ids})
            return conn.execute(sql.CLAIM_MESSAGES, {
                "ids": ids, "tokens": [p.token for _, p in batch],
                "default_max_attempts": defaults_max,
                "default_timeout_seconds": defaults_timeout,
                "worker": self.worker_id, "lease_seconds": self.settings.lease_seconds,
                "now": self.clock(),
            }).fetchall()

    def _retry_later(self, queue: str, messages: list[Received]) -> None:
        receipts = [m.receipt for m in messages]
        for i in range(0, len(receipts), MAX_BATCH):
            try:
                self.transport.change_visibility_batch(queue, receipts[i:i + MAX_BATCH],
                                                       RETRY_LATER_SECONDS)
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc()
                emit(log, "visibility_change_failed", logging.WARNING, queue=queue,
                     error=str(exc))
        emit(log, "claim_deferred", logging.DEBUG, queue=queue, messages=len(messages),
             retry_in_seconds=RETRY_LATER_SECONDS)

    def _explain_unclaimed(self, batch: list[tuple[Received, JobMessage]]
                           ) -> list[tuple[Received, str, str]]:
        with statement(self.pool) as conn:
            found = {r[0]: (r[1], r[2]) for r in conn.execute(
                sql.EXPLAIN_UNCLAIMED, {"ids": [p.job_id for _, p in batch]})}
        out = []
        for msg, parsed in batch:
            if parsed.job_id not in found:
                out.append((msg, "unknown_job", f"no job {parsed.job_id}"))
                continue
            state, token = found[parsed.job_id]
            if token != parsed.token:
                out.append((msg, "stale_token",
                            f"job {parsed.job_id} is {state} with another dispatch token"))
            else:
                out.append((msg, "not_dispatched", f"job {parsed.job_id} is already {state}"))
        return out

    def _drop(self, queue: str, drop: list[tuple[Received, str, str]]) -> None:
        if not drop:
            return
        for msg, reason, detail in drop:
            # Each reason is one of tock's typed errors; the message changed no job.
            error = _DROP_ERRORS[reason](detail)
            metrics.MESSAGES_DROPPED.labels(reason).inc()
            emit(log, "message_dropped", logging.WARNING, reason=reason,
                 error=f"{type(error).__name__}: {error}", message_id=msg.message_id,
                 queue=queue)
        self._delete(queue, [m.receipt for m, _, _ in drop])

    def _delete(self, queue: str, receipts: list[str]) -> None:
        for i in range(0, len(receipts), MAX_BATCH):
            try:
                failures = self.transport.delete_batch(queue, receipts[i:i + MAX_BATCH])
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("DeleteMessageBatch").inc()
                emit(log, "delete_failed", logging.WARNING, queue=queue, error=str(exc))
                continue
            if failures:
                metrics.SQS_ERRORS.labels("DeleteMessageBatch").inc(len(failures))

    # --- run handlers ----------------------------------------------------------------------

    def _handler_loop(self) -> None:
        while True:
            entry = self._work.get()
            if entry is None:
                return
            self.run_handler(*entry)

    def run_handler(self, item: InFlight, payload: Any, task: Task | None) -> None:
        """Run one claimed job's handler and queue its outcome for the completer. The
        handler slot is free again as soon as the handler returns: writing the outcome
        and deleting the message happen in the completer, batched."""
        try:
            self._run_handler(item, payload, task)
        finally:
            self.slots.release()

    def _run_handler(self, item: InFlight, payload: Any, task: Task | None) -> None:
        if task is None:
            self._done.put(outcomes.no_handler(item, self.registry.kinds()))
            return
        started = time.monotonic()
        try:
            task.handler(payload, item.context)
        except Abandon:
            item.abandoned = True
            emit(log, "job_abandoned", logging.WARNING, job_id=item.job_id,
                 attempt=item.attempt, worker=self.worker_id)
            self._forget(item)
            return
        except Exception as exc:
            result = outcomes.failed(item, exc, time.monotonic() - started,
                                     base=self.settings.backoff_base_seconds,
                                     cap=self.settings.backoff_cap_seconds)
        else:
            elapsed = time.monotonic() - started
            if item.timed_out:
                result = outcomes.failed(item, TimedOut("returned after its deadline"), elapsed,
                                         base=self.settings.backoff_base_seconds,
                                         cap=self.settings.backoff_cap_seconds)
            else:
                result = outcomes.succeeded(item, elapsed)
        self._done.put(result)

    def _forget(self, item: InFlight) -> None:
        """Stop tracking a job, once, whichever path gets here first."""
        with self._settled:
            if self._inflight.get(item.job_id) is item:
                del self._inflight[item.job_id]
                self._settled.notify_all()

    def _wait_settled(self, timeout: float) -> bool:
        """Wait until every claimed job's outcome is written (stuck handlers excepted)."""
        deadline = time.monotonic() + timeout
        with self._settled:
            while any(not i.abandoned or i.released for i in self._inflight.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(left)
            return True

    def _tracked(self, item: InFlight) -> bool:
        with self._lock:
            return self._inflight.get(item.job_id) is item

    # --- complete ----------------------------------------------------------------------------

    def _complete_loop(self) -> None:
        while True:
            written = self.complete_pending(wait_seconds=0.2)
            if not written and self._done_stop and self._done.empty():
                return

    def complete_pending(self, wait_seconds: float = 0.0) -> int:
        """Write the outcomes waiting (one batch), then delete their messages."""
        batch: list[Finished] = []
        try:
            batch.append(self._done.get(timeout=wait_seconds) if wait_seconds
                         else self._done.get_nowait())
        except queues.Empty:
            return 0
        while len(batch) < self.settings.completion_batch_size:
            try:
                batch.append(self._done.get_nowait())
            except queues.Empty:
                break
        self._finish(batch)
        return len(batch)

    def _finish(self, batch: list[Finished]) -> None:
        # A late result of a job released at shutdown is not written: the release is.
        batch = [f for f in batch if self._tracked(f.item)
                 and (not f.item.released or f.outcome is AttemptOutcome.RELEASED)]
        live = [f for f in batch if not f.item.lease_lost]
        written: set[int] = set()
        delay = 0.1
        while live:
            try:
                written = self._write(live)
                break
            except DatabaseUnavailable as exc:
                # Keep the results and try again: the lease may run out meanwhile, and
                # then the fence rejects the write, which is the correct outcome.
                emit(log, "complete_failed", logging.ERROR, jobs=len(live), error=str(exc),
                     retry_in_seconds=delay)
                if self._done_stop and delay >= 5.0:
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        by_queue: dict[str, list[str]] = defaultdict(list)
        for f in batch:
            item = f.item
            kind = item.context.kind
            if item.job_id in written:
                metrics.OUTCOMES.labels(kind, f.outcome.value).inc()
                metrics.RUN_DURATION.labels(kind, f.outcome.value).observe(f.run_seconds)
                if f.state is JobState.RETRYING and not f.refund:
                    metrics.RETRIES.labels(kind).inc()
                if f.state is JobState.DEAD:
                    metrics.DEAD.labels(kind).inc()
                level = logging.INFO if f.state is JobState.SUCCEEDED else logging.WARNING
                extra: dict[str, Any] = {"error": f.error} if f.error else {}
                if f.state is JobState.RETRYING and not f.refund:
                    extra["retry_in_s"] = round(f.delay_seconds, 2)
                emit(log, f"job_{f.outcome.value}", level, job_id=item.job_id, kind=kind,
                     attempt=item.attempt, worker=self.worker_id, next_state=f.state.value,
                     ms=round(f.run_seconds * 1000, 1), **extra)
            else:
                lost = LeaseLost(f"job {item.job_id} attempt {item.attempt}: the fenced write "
                                 "matched no row (cancelled, or its lease expired and the job "
                                 "was taken over)")
                metrics.STALE_COMPLETIONS.inc()
                emit(log, "result_discarded", logging.WARNING, job_id=item.job_id, kind=kind,
                     attempt=item.attempt, worker=self.worker_id,
                     error=f"LeaseLost: {lost}", outcome=f.outcome.value)
            by_queue[item.queue].append(item.receipt)
        # Only now, after the commit: delete. A crash before this line leaves messages that
        # are redelivered and find their job finished, which is harmless.
        for q, receipts in by_queue.items():
            self._delete(q, receipts)
        for f in batch:
            self._forget(f.item)

    def _write(self, batch: list[Finished]) -> set[int]:
        params = {
            "ids": [f.item.job_id for f in batch],
            "attempts": [f.item.attempt for f in batch],
            "tokens": [f.item.token for f in batch],
            "states": [f.state.value for f in batch],
            "delays": [f.delay_seconds for f in batch],
            "outcomes": [f.outcome.value for f in batch],
            "errors": [f.error for f in batch],
            "tracebacks": [f.traceback for f in batch],
            "refunds": [f.refund for f in batch],
            "worker": self.worker_id, "now": self.clock(),
        }
        with statement(self.pool) as conn:
            # One statement: atomic without BEGIN/COMMIT round trips.
            rows = conn.execute(sql.FINISH_ATTEMPTS, params).fetchall()
            if any(f.state in (JobState.RETRYING, JobState.SCHEDULED) and f.delay_seconds < 60
                   for f in batch):
                conn.execute(sql.NOTIFY_DUE)  # wake the timers for retries due soon
        return {r[0] for r in rows}

    # --- heartbeat, timeouts -----------------------------------------------------------------

    def _tick_loop(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_seconds
        while not self._done_stop:
            time.sleep(TICK_SECONDS)
            self.check_timeouts()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.settings.heartbeat_seconds
                try:
                    self.heartbeat_once()
                except DatabaseUnavailable as exc:
                    emit(log, "heartbeat_failed", logging.ERROR, error=str(exc))

    def check_timeouts(self) -> None:
        """Signal handlers past their deadline; stop heartbeating ones stuck far past it, so
        their lease expires and the timer recovers the job as if this worker had died."""
        now = time.monotonic()
        with self._lock:
            items = list(self._inflight.values())
        for item in items:
            over = now - item.started - item.timeout_seconds
            if over > 0 and not item.timed_out:
                item.timed_out = True
                item.context.cancelled.set()
                emit(log, "job_timeout", logging.WARNING, job_id=item.job_id,
                     attempt=item.attempt, timeout_s=item.timeout_seconds)
            if over > self.settings.lease_seconds and not item.abandoned:
                item.abandoned = True
                emit(log, "handler_stuck", logging.ERROR, job_id=item.job_id,
                     attempt=item.attempt, worker=self.worker_id,
                     detail="handler ignored its deadline; lease left to expire")

    def heartbeat_once(self) -> tuple[int, int]:
        """Extend every lease this process holds (one fenced UPDATE) and the visibility of
        their messages; returns (kept, lost)."""
        with self._lock:
            items = [i for i in self._inflight.values() if i.heartbeating]
        with transaction(self.pool) as conn:
            kept = {r[0] for r in conn.execute(sql.HEARTBEAT, {
                "ids": [i.job_id for i in items], "attempts": [i.attempt for i in items],
                "tokens": [i.token for i in items], "worker": self.worker_id,
                "lease_seconds": self.settings.lease_seconds, "now": self.clock(),
            })} if items else set()
            self._upsert_worker(conn)
        self.last_heartbeat_ok = time.monotonic()
        lost = [i for i in items if i.job_id not in kept]
        for item in lost:
            item.lease_lost = True
            item.context.cancelled.set()
            metrics.LEASES_LOST.inc()
            emit(log, "lease_lost", logging.WARNING, job_id=item.job_id, attempt=item.attempt,
                 worker=self.worker_id, detail="cancelled or taken over; result will be dropped")
        by_queue: dict[str, list[str]] = defaultdict(list)
        for item in items:
            if item.job_id in kept:
                by_queue[item.queue].append(item.receipt)
        for q, receipts in by_queue.items():
            for i in range(0, len(receipts), MAX_BATCH):
                try:
                    failures = self.transport.change_visibility_batch(
                        q, receipts[i:i + MAX_BATCH], self.settings.visibility_timeout_seconds)
                except TransportError as exc:
                    # The DB lease stays the authority; a redelivered message claims nothing.
                    metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc()
                    emit(log, "visibility_extend_failed", logging.WARNING, queue=q,
                         error=str(exc))
                    continue
                if failures:
                    metrics.SQS_ERRORS.labels("ChangeMessageVisibilityBatch").inc(len(failures))
                    emit(log, "visibility_extend_failed", logging.WARNING, queue=q,
                         entries=len(failures), error=failures[0].message)
        return len(kept), len(lost)

    # --- shutdown ------------------------------------------------------------------------------

    def _release_unfinished(self) -> None:
        with self._lock:
            items = [i for i in self._inflight.values() if i.heartbeating]
        pending = {f.item.job_id for f in list(self._done.queue)}
        release = [i for i in items if i.job_id not in pending]
        for item in release:
            item.released = True  # before the signal: the handler may return at once
            item.abandoned = True
            item.context.cancelled.set()
        if release:
            emit(log, "jobs_released", logging.WARNING, jobs=len(release),
                 job_ids=[i.job_id for i in release], worker=self.worker_id)
            self._finish([outcomes.released(i) for i in release])

    def in_flight(self) -> list[InFlight]:
        with self._lock:
            return list(self._inflight.values())
