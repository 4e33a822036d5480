"""Recovery: jobs whose worker stopped heartbeating, and dispatched jobs nobody claimed.

A running job whose lease expired (by the database clock) goes back to `retrying` with
backoff, or to `dead` when that was its last attempt; the lost attempt is recorded as
`lease_expired`. Its old worker, if it is alive after all, is fenced out: its heartbeat and
its completion match no row.
"""

from __future__ import annotations

import logging
from datetime import datetime

from shared.core.backoff import backoff_seconds
from shared.core.states import JobState
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.job_store import JobStore
from shared.store.rows import Rescue

log = logging.getLogger("tock.timer.rescue")


class Rescuer(Loop):
    """Runs every `interval_seconds` (a full batch goes on at once)."""

    name = "rescue"

    def __init__(self, store: JobStore, *, batch_size: int, default_max_attempts: int,
                 backoff_base_seconds: float, backoff_cap_seconds: float,
                 dispatch_timeout_seconds: float, interval_seconds: float) -> None:
        super().__init__()
        self.store = store
        self.batch_size = batch_size
        self.default_max_attempts = default_max_attempts
        self.backoff_base = backoff_base_seconds
        self.backoff_cap = backoff_cap_seconds
        self.dispatch_timeout = dispatch_timeout_seconds
        self.idle_seconds = interval_seconds

    def run_once(self, now: datetime | None = None) -> int:
        """Rescue expired leases, then re-dispatch stuck jobs; 0 unless a batch was full."""
        rescued = self.rescue_expired(now)
        redispatched = self.redispatch_stuck(now)
        return int(rescued >= self.batch_size or redispatched >= self.batch_size)

    def rescue_expired(self, now: datetime | None = None) -> int:
        """Move running jobs with an expired lease to retrying or dead; returns how many."""
        with self.store.transaction() as tx:
            expired = tx.expired_leases(self.batch_size, self.default_max_attempts, now)
            if not expired:
                return 0
            rescues = []
            for lease in expired:
                last = lease.attempt >= lease.max_attempts
                rescues.append(Rescue(
                    job_id=lease.job_id, attempt=lease.attempt,
                    state=JobState.DEAD if last else JobState.RETRYING,
                    delay_seconds=0.0 if last else backoff_seconds(
                        lease.attempt, base=self.backoff_base, cap=self.backoff_cap),
                    error=f"lease expired at {lease.expired_at.isoformat()}: worker "
                          f"{lease.owner} stopped heartbeating (attempt {lease.attempt} of "
                          f"{lease.max_attempts})",
                    worker=lease.owner))
            done = tx.rescue_expired(rescues, now)
        for rescue in rescues:
            if rescue.job_id in done:
                metrics.LEASE_EXPIRIES.labels(rescue.state.value).inc()
                emit(log, "lease_expired", logging.WARNING, job_id=rescue.job_id,
                     worker=rescue.worker, next_state=rescue.state.value)
        return len(done)

    def redispatch_stuck(self, now: datetime | None = None) -> int:
        """Make dispatched jobs that nobody claimed within the timeout due again."""
        ids = self.store.redispatch_stuck(self.dispatch_timeout, self.batch_size, now)
        if ids:
            metrics.REDISPATCHED.inc(len(ids))
            emit(log, "redispatch_stuck", logging.WARNING, jobs=len(ids), job_ids=ids[:20])
        return len(ids)
