"""`JobStore`: every statement on jobs, attempts and workers (shared.store.jobs_sql), one
typed method each. `now=None` means the database clock, which production uses (leases are
judged by one clock); tests pin it. Guarded transitions return what they changed; the
caller turns "nothing" into its typed error (`LeaseLost`, `InvalidTransition` ...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from uuid import UUID

import psycopg

from shared.core.jobs import Attempt, Job
from shared.core.reports import Worker
from shared.core.states import JobState
from shared.store import arrays, lingering_sql, producer_sql
from shared.store import jobs_sql as sql
from shared.store.base import Store
from shared.store.errors import classify
from shared.store.rows import (
    AttemptResult,
    Claim,
    ClaimedJob,
    ExpiredLease,
    Lease,
    NewJob,
    Refused,
    Rescue,
    WorkerHolder,
)

LOCK_WAIT_MS = 2000
"""Longest a claim waits for the timer's dispatch commit (see `claim_messages`)."""


class JobStore(Store):
    """Job statements. See `Store` for how a store runs them."""

    # --- producer -------------------------------------------------------------------------

    def insert_jobs(self, jobs: Sequence[NewJob], now: datetime | None = None) -> list[Job]:
        """Insert the jobs; those whose unique key is taken (by a job in the hot table or
        in the history) are not inserted (and not returned): read them with
        `jobs_by_key`."""
        rows = self._rows(producer_sql.INSERT_JOBS, {
            "kind": [j.kind for j in jobs], "queue": [j.queue for j in jobs],
            "payload": [j.payload for j in jobs], "priority": [j.priority for j in jobs],
            "at": [j.at for j in jobs], "delay": [j.delay_seconds for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "timeout_seconds": [j.timeout_seconds for j in jobs],
            "unique_key": [j.unique_key for j in jobs], "tenant": [j.tenant for j in jobs],
            "concurrency_key": [j.concurrency_key for j in jobs], "now": now,
        })
        return [Job.from_row(r) for r in rows]

    def jobs_by_key(self, keys: Sequence[str]) -> list[Job]:
        """The jobs holding these keys, unfinished or in the history."""
        return [Job.from_row(r, created=False)
                for r in self._rows(producer_sql.SELECT_JOBS_BY_KEY, {"keys": list(keys)})]

    def reclaim_keys(self, keys: Sequence[str]) -> list[str]:
        """Free those of `keys` no job holds any more (their job's day expired and its
        keys are not pruned yet); returns the keys freed."""
        return [r[0] for r in self._rows(producer_sql.RECLAIM_KEYS, {"keys": list(keys)})]

    def get_job(self, job_id: int) -> Job | None:
        """The job, unfinished or in the history; None if there is none."""
        row = self._one(producer_sql.SELECT_JOB, {"id": job_id})
        return Job.from_row(row) if row else None

    def attempts(self, job_id: int) -> list[Attempt]:
        """Finished attempts of a job, oldest first (wherever the job is)."""
        return [Attempt.from_row(r)
                for r in self._rows(producer_sql.SELECT_ATTEMPTS, {"id": job_id})]

    def cancel_job(self, job_id: int, now: datetime | None = None) -> Job | None:
        """Cancel an unfinished job (it moves to the history); None if it is finished or
        does not exist."""
        row = self._one(producer_sql.CANCEL_JOB, {"id": job_id, "now": now})
        return Job.from_row(row) if row else None

    def retry_job(self, job_id: int, now: datetime | None = None) -> Job | None:
        """Make a dead or cancelled job due now with a fresh attempt count (back from the
        history with its attempts); None otherwise."""
        row = self._one(producer_sql.RETRY_JOB, {"id": job_id, "now": now})
        return Job.from_row(row) if row else None

    def notify_due(self) -> None:
        """Wake the timers: something is due now or soon."""
        self._run(producer_sql.NOTIFY_DUE)

    # --- timer ----------------------------------------------------------------------------

    def undo_dispatch(self, refused: Sequence[Refused], *, backoff_base_seconds: float,
                      backoff_cap_seconds: float, now: datetime | None = None
                      ) -> dict[int, int]:
        """Put jobs SQS refused back to the state they came from, with the reason, due
        again after a backoff; returns {job id: sends refused in a row}."""
        rows = self._rows(sql.UNDO_DISPATCH, {
            "ids": [r.id for r in refused], "prev_states": [r.prev_state.value for r in refused],
            "errors": [r.error for r in refused], "backoff_base": backoff_base_seconds,
            "backoff_cap": backoff_cap_seconds, "now": now})
        return {r[0]: r[1] for r in rows}

    def ping(self) -> None:
        """Raise (Retryable) unless the database answers and takes writes: a server that
        answers but is read-only (a primary demoted by a failover, through a pooled
        connection) would let a consumer receive messages it cannot claim, each receive
        counting towards the dead-letter queue. Raised inside the connection's block, so
        the pool drops that connection as after any read-only refusal."""
        refused = psycopg.errors.ReadOnlySqlTransaction(
            "the server answers but takes no writes")
        if self._db is None:  # bound to a caller's connection: nothing to drop
            row = self._one(sql.PING)
            if row and row[0]:
                raise classify(refused)
            return
        with self._db.connection() as conn:
            if self._execute(conn, sql.PING, None)[0][0]:
                raise refused

    def next_due_at(self) -> tuple[datetime | None, datetime]:
        """(earliest run_at of a scheduled/retrying job, the database clock now)."""
        row = self._one(sql.NEXT_DUE_AT)
        assert row is not None
        return row[0], row[1]

    def next_to_fall_due(self) -> tuple[datetime, tuple[int, str, str], str, datetime] | None:
        """(run_at, (level, kind, tenant), queue, the database clock now) of the job not yet
        due that falls due first; None if there is none."""
        row = self._one(sql.NEXT_TO_FALL_DUE)
        if row is None:
            return None
        return row[0], (row[1], row[2], row[3]), row[4], row[5]

    def stuck_queues(self, timeout_seconds: float, now: datetime | None = None
                     ) -> dict[str, int]:
        """Queues with jobs dispatched longer ago than `timeout_seconds` and not claimed:
        {queue: how many}."""
        return {r[0]: r[1] for r in self._rows(sql.STUCK_QUEUES, {
            "timeout_seconds": timeout_seconds, "now": now})}

    def queue_expected(self, queue: str) -> tuple[int, int]:
        """(dispatched, running) jobs of `queue`: the messages SQS should hold for it."""
        row = self._one(sql.QUEUE_EXPECTED, {"queue": queue})
        return (row[0], row[1]) if row else (0, 0)

    def dispatched_before(self, queue: str, before: datetime) -> int:
        """How many of `queue`'s jobs are still dispatched (not claimed) from before
        `before`."""
        row = self._one(sql.DISPATCHED_BEFORE, {"queue": queue, "before": before})
        return row[0] if row else 0

    def redispatch_stuck(self, queue: str, timeout_seconds: float, limit: int,
                         now: datetime | None = None) -> list[int]:
        """Make up to `limit` of `queue`'s jobs dispatched longer ago than
        `timeout_seconds` and never claimed due again, oldest first; returns their ids."""
        return [r[0] for r in self._rows(sql.REDISPATCH_STUCK, {
            "queue": queue, "timeout_seconds": timeout_seconds, "limit": limit, "now": now})]

    def expired_leases(self, limit: int, default_max_attempts: int,
                       now: datetime | None = None, *,
                       since_back: float | None = None) -> list[ExpiredLease]:
        """Running jobs whose lease expired (their own and their worker's, or their own for
        a detached job), locked (SKIP LOCKED) until the transaction ends: call
        `rescue_expired` in the same transaction. With `since_back` (seconds since the
        database came back after an outage), a worker's jobs count only once it has had a
        whole lease since then to renew."""
        params = {"limit": limit, "default_max_attempts": default_max_attempts, "now": now,
                  "since_back": since_back}
        leases = [ExpiredLease(*r) for r in self._rows(sql.SELECT_EXPIRED_LEASES, params)]
        if len(leases) < limit:
            leases += [replace(ExpiredLease(*r), detached=True) for r in self._rows(
                sql.SELECT_EXPIRED_DETACHED, {**params, "limit": limit - len(leases),
                                              "found": [lease.job_id for lease in leases]})]
        return leases

    def forget_dead_lingering(self, now: datetime | None = None, *,
                              since_back: float | None = None) -> list[tuple[str, int]]:
        """Free the slots of lingering handlers whose worker is dead (its lease expired;
        with `since_back`, as `expired_leases` judges it): (worker, job id) of each."""
        return [(r[0], r[1]) for r in self._rows(lingering_sql.FORGET_DEAD, {
            "now": now, "since_back": since_back})]

    def rescue_expired(self, rescues: Sequence[Rescue], now: datetime | None = None
                       ) -> set[int]:
        """Move expired jobs on (retrying, or dead: to the history) and record the lost
        attempts; a lease a heartbeat renewed meanwhile is left alone. Returns the rescued
        ids."""
        return {r[0] for r in self._rows(sql.RESCUE_EXPIRED, {
            "ids": [r.job_id for r in rescues], "attempts": [r.attempt for r in rescues],
            "states": [r.state.value for r in rescues],
            "delays": [r.delay_seconds for r in rescues],
            "errors": [r.error for r in rescues], "workers": [r.worker for r in rescues],
            "now": now})}

    # --- consumer -------------------------------------------------------------------------

    def claim_messages(self, claims: Sequence[Claim], worker: str, lease_seconds: float,
                       now: datetime | None = None, *,
                       wait_for_locks: bool = False) -> list[ClaimedJob]:
        """dispatched -> running for every claim whose job id and token match, leased to
        `worker`. With `wait_for_locks`, first wait (up to LOCK_WAIT_MS, else `LockTimeout`)
        for row locks an uncommitted dispatch holds: the timer sends before it commits."""
        params = {
            "ids": arrays.numbers(c.job_id for c in claims),
            "tokens": arrays.uuids(c.token for c in claims),
            "default_max_attempts": arrays.numbers(c.default_max_attempts for c in claims),
            "default_timeout_seconds": arrays.numbers(c.default_timeout_seconds
                                                      for c in claims),
            "kinds": [c.kind for c in claims], "queues": [c.queue for c in claims],
            "worker": worker, "lease_seconds": lease_seconds, "now": now,
        }
        if wait_for_locks:
            with self.transaction() as tx:
                tx._run(sql.SET_LOCK_TIMEOUT, {"ms": LOCK_WAIT_MS})
                tx._run(sql.WAIT_FOR_DISPATCH_COMMIT, {"ids": params["ids"]})
                rows = tx._rows(sql.CLAIM_MESSAGES, params)
        else:
            rows = self._rows(sql.CLAIM_MESSAGES, params)
        return [ClaimedJob(id=r[0], kind=r[1], payload=r[2], attempt=r[3], max_attempts=r[4],
                           timeout_seconds=r[5], run_at=r[6], token=r[7], queue=r[8],
                           tenant=r[9], key=r[10], claimed_at=r[11],
                           lag_seconds=float(r[12])) for r in rows]

    def job_states(self, job_ids: Sequence[int]) -> dict[int, tuple[JobState, UUID | None]]:
        """State and dispatch token of each job that exists (why a message claimed nothing)."""
        return {r[0]: (JobState(r[1]), r[2])
                for r in self._rows(sql.EXPLAIN_UNCLAIMED, {"ids": list(job_ids)})}

    def job_routes(self, job_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """(kind, queue) of each unfinished job."""
        if not job_ids:  # the usual case (copies of messages whose job moved on): no trip
            return {}
        return {r[0]: (r[1], r[2]) for r in self._rows(sql.JOB_ROUTES, {"ids": list(job_ids)})}

    def heartbeat(self, worker: Worker, leases: Sequence[Lease], lease_seconds: float,
                  now: datetime | None = None, *, running: Sequence[Lease] = ()) -> set[int]:
        """The worker's heartbeat, one statement: refresh its row and its lease (which
        every job it holds hangs off), forget its lingering handlers not in `running` (the
        claims whose handlers are still running here: the others have returned), and return
        which of `leases` it still holds (the rest are lost: cancelled, expired and taken
        over, or detached)."""
        return {r[0] for r in self._rows(sql.WORKER_BEAT, {
            "id": worker.id, "host": worker.host, "pid": worker.pid, "queues": worker.queues,
            "kinds": worker.kinds, "concurrency": worker.concurrency,
            "in_flight": worker.in_flight, "lease_seconds": lease_seconds,
            "ids": [x.job_id for x in leases], "attempts": [x.attempt for x in leases],
            "tokens": [x.token for x in leases], "running": [x.token for x in running],
            "now": now})}

    def cancelled_claims(self, leases: Sequence[Lease]) -> set[int]:
        """Of `leases` (lost ones), the job ids an operator cancelled under that claim; the
        rest were lost otherwise (expired and taken over, or detached)."""
        if not leases:
            return set()
        return {r[0] for r in self._rows(sql.CANCELLED_CLAIMS, {
            "ids": [x.job_id for x in leases], "tokens": [x.token for x in leases]})}

    def take_worker_id(self, worker: Worker, lease_seconds: float,
                       now: datetime | None = None) -> WorkerHolder | None:
        """Announce `worker` as a new process under its id; None when that worked, else
        the live process that holds the id (another host or pid, its lease running)."""
        params = {"id": worker.id, "host": worker.host, "pid": worker.pid,
                  "queues": worker.queues, "kinds": worker.kinds,
                  "concurrency": worker.concurrency, "lease_seconds": lease_seconds,
                  "now": now}
        with self.transaction() as tx:
            if tx._rows(sql.TAKE_WORKER_ID, params):
                return None
            rows = tx._rows(sql.WORKER_HOLDER, params)
        if not rows:  # stopped and removed meanwhile: take it next time
            return WorkerHolder("", 0, None, 0.0)
        host, pid, beat, expires_in = rows[0]
        return WorkerHolder(host, pid, beat, max(float(expires_in), 0.0))

    def record_lingering(self, worker: str,
                         handlers: Sequence[tuple[Lease, str]]) -> None:
        """Handlers `worker` still runs for jobs it lost or let go, each with why
        ('cancelled', 'stuck', 'lease_lost', 'released'): they keep their concurrency slots until a
        heartbeat finds them returned (lingering_sql)."""
        if handlers:
            self._run(lingering_sql.RECORD, {
                "worker": worker, "ids": [h[0].job_id for h in handlers],
                "attempts": [h[0].attempt for h in handlers],
                "tokens": [h[0].token for h in handlers], "reasons": [h[1] for h in handlers]})

    def detach_lease(self, lease: Lease, worker: str, lease_seconds: float,
                     now: datetime | None = None) -> bool:
        """Stop the worker's lease covering this job (its handler is stuck): it expires
        `lease_seconds` from now unless its outcome is written first. False if the worker
        no longer holds it."""
        return self._one(sql.DETACH_LEASE, {
            "id": lease.job_id, "attempt": lease.attempt, "token": lease.token,
            "worker": worker, "lease_seconds": lease_seconds, "now": now}) is not None

    def release_untracked(self, worker: str, tracked: Sequence[int], older_than_seconds: float,
                          lease_seconds: float, now: datetime | None = None
                          ) -> list[tuple[int, int]]:
        """Detach the running jobs `worker` owns in the database but does not hold (not in
        `tracked`), claimed over `older_than_seconds` ago: each expires `lease_seconds`
        from now and the timer rescues it. Returns their (job id, attempt)."""
        return [(r[0], r[1]) for r in self._rows(sql.RELEASE_UNTRACKED, {
            "worker": worker, "tracked": list(tracked), "older_than": older_than_seconds,
            "lease_seconds": lease_seconds, "now": now})]

    def known_kinds(self, now: datetime | None = None) -> list[str]:
        """Kinds a consumer has announced handlers for in the last 24 hours."""
        return [r[0] for r in self._rows(sql.KNOWN_KINDS, {"now": now})]

    def stop_worker(self, worker_id: str, now: datetime | None = None) -> None:
        self._run(sql.STOP_WORKER, {"id": worker_id, "now": now})

    def finish_attempts(self, results: Sequence[AttemptResult], worker: str,
                        now: datetime | None = None) -> set[int]:
        """Write every outcome whose fence (state, owner, attempt, token) still holds, with
        its attempt row, in one statement (a finished job moves to the history); returns
        the job ids written."""
        errors = [r.error for r in results]
        tracebacks = [r.traceback for r in results]
        return {r[0] for r in self._rows(sql.FINISH_ATTEMPTS, {
            "ids": arrays.numbers(r.lease.job_id for r in results),
            "attempts": arrays.numbers(r.lease.attempt for r in results),
            "tokens": arrays.uuids(r.lease.token for r in results),
            "states": arrays.labels(r.state.value for r in results),
            "delays": arrays.numbers(r.delay_seconds for r in results),
            "outcomes": arrays.labels(r.outcome.value for r in results),
            # All NULL (every attempt succeeded): a NULL array, which unnest pads with NULLs
            "errors": errors if any(e is not None for e in errors) else None,
            "tracebacks": tracebacks if any(t is not None for t in tracebacks) else None,
            "refunds": arrays.booleans(r.refund for r in results),
            "worker": worker, "now": now})}
