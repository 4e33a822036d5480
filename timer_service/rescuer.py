"""Recovery: jobs whose worker stopped heartbeating, and dispatched jobs nobody claimed.

A running job whose lease expired (by the database clock) goes back to `retrying` with
backoff, or to `dead` when that was its last attempt; the lost attempt is recorded as
`lease_expired`. Its old worker, if it is alive after all, is fenced out: its heartbeat and
its completion match no row.
"""

from __future__ import annotations

import logging
from datetime import datetime

from psycopg_pool import ConnectionPool

from shared.core.backoff import backoff_seconds
from shared.core.states import JobState
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.store import jobs_sql as sql
from shared.store.database import statement, transaction

log = logging.getLogger("tock.timer.rescue")


class Rescuer:
    def __init__(self, pool: ConnectionPool, *, batch_size: int, default_max_attempts: int,
                 backoff_base_seconds: float, backoff_cap_seconds: float,
                 dispatch_timeout_seconds: float) -> None:
        self.pool = pool
        self.batch_size = batch_size
        self.default_max_attempts = default_max_attempts
        self.backoff_base = backoff_base_seconds
        self.backoff_cap = backoff_cap_seconds
        self.dispatch_timeout = dispatch_timeout_seconds

    def rescue_expired(self, now: datetime | None = None) -> int:
        """Move running jobs with an expired lease to retrying or dead; returns how many."""
        with transaction(self.pool) as conn:
            rows = conn.execute(sql.SELECT_EXPIRED_LEASES, {
                "limit": self.batch_size, "now": now,
                "default_max_attempts": self.default_max_attempts,
            }).fetchall()
            if not rows:
                return 0
            ids, attempts, states, delays, errors, workers = [], [], [], [], [], []
            for job_id, attempt, max_attempts, owner, _started, expired_at in rows:
                last = attempt >= max_attempts
                ids.append(job_id)
                attempts.append(attempt)
                states.append(JobState.DEAD if last else JobState.RETRYING)
                delays.append(0.0 if last else backoff_seconds(
                    attempt, base=self.backoff_base, cap=self.backoff_cap))
                errors.append(f"lease expired at {expired_at.isoformat()}: worker {owner} "
                              f"stopped heartbeating (attempt {attempt} of {max_attempts})")
                workers.append(owner)
            done = conn.execute(sql.RESCUE_EXPIRED, {
                "ids": ids, "attempts": attempts, "states": states, "delays": delays,
                "errors": errors, "workers": workers, "now": now,
            }).fetchall()
        rescued = {r[0] for r in done}
        for job_id, state, worker in zip(ids, states, workers, strict=True):
            if job_id in rescued:
                metrics.LEASE_EXPIRIES.labels(state.value).inc()
                emit(log, "lease_expired", logging.WARNING, job_id=job_id, worker=worker,
                     next_state=state.value)
        return len(rescued)

    def redispatch_stuck(self, now: datetime | None = None) -> int:
        """Make dispatched jobs that nobody claimed within the timeout due again."""
        with statement(self.pool) as conn:
            rows = conn.execute(sql.REDISPATCH_STUCK, {
                "limit": self.batch_size, "now": now,
                "timeout_seconds": self.dispatch_timeout,
            }).fetchall()
        if rows:
            metrics.REDISPATCHED.inc(len(rows))
            emit(log, "redispatch_stuck", logging.WARNING, jobs=len(rows),
                 job_ids=[r[0] for r in rows[:20]])
        return len(rows)
