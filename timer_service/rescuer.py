"""Recovery of jobs whose worker stopped heartbeating.

A running job whose lease expired (by the database clock) goes back to `retrying` with
backoff, or to `dead` when that was its last attempt; the lost attempt is recorded as
`lease_expired`. Its old worker, if it is alive after all, is fenced out: its heartbeat and
its completion match no row.

Leases run on by the database clock while the database is away, and no worker can renew
its lease then. So after an outage (any statement of this timer finding the database
unavailable), and after this process starts (it may not have seen one), a worker's jobs
are rescued only once it has had a whole lease of its own since then to renew and did not:
a restart of Postgres longer than a lease does not fail every running job. A database
that answers the lease query `STALLED_AFTER_SECONDS` late counts as an outage that has
just ended: frozen (a stopped process, a hung host or disk), it fails no statement, yet
no worker can renew meanwhile, and the query, sent before the freeze, runs the moment it
ends, before the workers' own renewals.

Jobs whose SQS message was lost are the `LostMessages` loop's (timer_service/lost_messages.py):
it asks SQS, which may hang, and a lease rescue must not wait for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from shared.core.backoff import backoff_seconds
from shared.core.iso_time import formatted
from shared.core.states import JobState
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.job_store import JobStore
from shared.store.rows import ExpiredLease, Rescue

log = logging.getLogger("tock.timer.rescue")

STALLED_AFTER_SECONDS = 1.0
"""A lease query answered this late (it takes milliseconds) found a database that may
have been frozen: nothing is rescued in that pass, and workers get a whole lease from
then to renew. A freeze the pass does not see as one is shorter than this plus a
maintenance interval (the pass may start late in it): 3 s by default, well within the
slack of the default lease (30 s, renewed every 10 s: 20 s)."""


class Rescuer(Loop):
    """Runs every `interval_seconds` (a full batch goes on at once)."""

    name = "rescue"

    def __init__(self, store: JobStore, *, batch_size: int, default_max_attempts: int,
                 backoff_base_seconds: float, backoff_cap_seconds: float,
                 interval_seconds: float) -> None:
        super().__init__()
        self.store = store
        self.batch_size = batch_size
        self.default_max_attempts = default_max_attempts
        self.backoff_base = backoff_base_seconds
        self.backoff_cap = backoff_cap_seconds
        self.idle_seconds = interval_seconds
        self.monotonic: Callable[[], float] = time.monotonic  # tests move it
        self._back_at: float | None = None
        """(time.monotonic()) When a pass first reached the database after this process
        started or after the database was last found unavailable."""

    def run_once(self, now: datetime | None = None) -> int:
        """Rescue expired leases; 0 unless a batch was full."""
        return int(self.rescue_expired(now) >= self.batch_size)

    def rescue_expired(self, now: datetime | None = None) -> int:
        """Move running jobs with an expired lease to retrying or dead; returns how many.
        On the database clock (`now` None), a worker gets a whole lease to renew after the
        database comes back (see the module docstring); a pinned `now` skips that."""
        since_back, back_at = self._since_back() if now is None else (None, None)
        # Timed from before the checkout and BEGIN, which a freeze holds up too. The timer's
        # pool has a connection per loop thread, so the checkout waits behind no other loop.
        asked = time.monotonic()
        with self.store.transaction() as tx:
            expired = tx.expired_leases(self.batch_size, self.default_max_attempts, now,
                                        since_back=since_back)
            waited = time.monotonic() - asked
            if now is None and waited > STALLED_AFTER_SECONDS:
                self._stalled(waited, len(expired))
                return 0
            if back_at is not None:
                self._back_at = back_at  # this pass reached the database
            freed = tx.forget_dead_lingering(now, since_back=since_back)
            if freed:
                emit(log, "lingering_freed", logging.INFO, slots=len(freed),
                     workers=sorted({w for w, _ in freed}),
                     detail="the workers of these handlers are gone, and their threads "
                            "with them: their concurrency slots are free")
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
                    error=_lost(lease),
                    worker=lease.owner))
            done = tx.rescue_expired(rescues, now)
        for rescue in rescues:
            if rescue.job_id in done:
                metrics.LEASE_EXPIRIES.labels(rescue.state.value).inc()
                emit(log, "lease_expired", logging.WARNING, job_id=rescue.job_id,
                     worker=rescue.worker, next_state=rescue.state.value)
        return len(done)

    def _stalled(self, waited: float, expired: int) -> None:
        """The lease query took `waited` seconds: count it as an outage that ended now
        (see the module docstring) and rescue nothing in this pass."""
        self._back_at = self.monotonic()
        emit(log, "rescue_held", logging.WARNING, waited_s=round(waited, 1),
             expired_leases=expired,
             detail=f"the database took {waited:.1f} s to answer the lease query (frozen "
                    "or stalled?): no worker could renew its lease meanwhile, so each gets "
                    "a whole lease from now before its jobs are rescued")

    def _since_back(self) -> tuple[float, float | None]:
        """(Seconds since the database came back, as far as this timer can tell; the
        moment to remember as that if this pass reaches it, or None)."""
        start = self.monotonic()
        database = self.store.database
        down_at = database.unavailable_at if database is not None else None
        if self._back_at is None or (down_at is not None and down_at >= self._back_at):
            return 0.0, start
        return start - self._back_at, None


def _lost(lease: ExpiredLease) -> str:
    """The lost attempt's error: whose lease ran out, and why."""
    # Read by people on the job page and in `tock show`: the format every time there has.
    expired = formatted(lease.expired_at.astimezone(UTC), "%Y-%m-%d %H:%M:%S")
    at = f"lease expired at {expired} UTC"
    of = f"(attempt {lease.attempt} of {lease.max_attempts})"
    if lease.detached:
        return (f"{at}: worker {lease.owner} let the job go (its handler ran past its "
                f"deadline and did not return, or gave it up) and stayed alive {of}")
    return f"{at}: worker {lease.owner} stopped heartbeating {of}"
