"""The history's upkeep, one loop of the timer (every `TOCK_RETENTION_INTERVAL_SECONDS`).

A finished job leaves tock_jobs in its outcome statement (shared/store/history_sql.py) for
the history: partitions by final state, then by UTC day. This loop keeps that layout:

1. day partitions exist from today to today + 2 (and for the days of rows it is about to
   move); a day whose end is past its state's retention (`TOCK_RETENTION_*_HOURS`) is
   detached whole: its jobs leave every read at once, nothing is deleted row by row;
2. finished rows still in tock_jobs (written before migration 0007, or by a process of an
   earlier version during an upgrade) move to the history in bounded batches, or are
   deleted if their day is already past retention;
3. the keys of a detached day are freed in batches, then its table is dropped;
4. rows that landed in a DEFAULT partition (no partition for their day) are deleted once
   their day is past retention;
5. workers stopped or silent past `TOCK_RETENTION_WORKERS_HOURS` holding no running job,
   and audit records past `TOCK_RETENTION_AUDIT_HOURS`, are pruned in batches.

Several timers share the work: every batch takes its rows with SKIP LOCKED, and the DDL
runs under an advisory lock one timer at a time (the others skip it for that pass). The
DDL never waits more than a second for a lock (then it tries again next pass), and
nothing here touches a row the dispatcher or a consumer works on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from functools import partial

from prometheus_client import Counter

from shared.core.errors import DataRejected, LockTimeout
from shared.core.states import FINAL_STATES, JobState
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.retention_sql import PARTITIONS_AHEAD_DAYS
from shared.store.retention_store import RetentionStore

log = logging.getLogger("tock.timer.retention")

MOVED = Counter("tock_history_moved_total",
                "Finished jobs the retention loop moved from tock_jobs to the history")
EXPIRED = Counter("tock_history_partitions_expired_total",
                  "Day partitions of the history detached past their retention", ["state"])
PRUNED = Counter("tock_retention_pruned_total", "Rows the retention loop deleted", ["what"])

BATCHES_PER_PASS = 10
"""Batches of one kind per pass (a full last batch makes the next pass start at once)."""
MAX_DDL_PER_PASS = 20
"""Partitions created or expired per pass (a fresh install with long retention needs
more than one pass to catch up; each is one short transaction)."""


@dataclass
class RetentionReport:
    """What one pass did."""

    created: int = 0
    """Day partitions created."""
    expired: int = 0
    """Day partitions detached past retention."""
    moved: int = 0
    """Finished rows moved from tock_jobs to the history."""
    deleted: int = 0
    """Finished rows deleted from tock_jobs (their day already past retention)."""
    keys_freed: int = 0
    dropped: int = 0
    """Expired tables dropped."""
    swept: int = 0
    """Rows deleted from DEFAULT partitions."""
    workers: int = 0
    audit: int = 0
    more: bool = False
    """Some batch was full, or DDL was left for the next pass."""

    def busy(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name != "more")


class Retention(Loop):
    """Runs every `interval_seconds`; `run_once(now)` is one pass (`run_pass` returns its
    report)."""

    name = "retention"
    # A pass runs several batches of a catch-up (moves, prunes): seconds each, rightly.
    stall_log_seconds = 60.0

    def __init__(self, store: RetentionStore, *, retention_hours: Mapping[JobState, float],
                 workers_hours: float, audit_hours: float, batch_size: int,
                 interval_seconds: float, ahead_days: int = PARTITIONS_AHEAD_DAYS) -> None:
        super().__init__()
        self.store = store
        self.retention = {s: timedelta(hours=retention_hours[s]) for s in FINAL_STATES}
        self.workers_retention = timedelta(hours=workers_hours)
        self.audit_retention = timedelta(hours=audit_hours)
        self.batch_size = batch_size
        self.ahead_days = ahead_days
        self.idle_seconds = interval_seconds

    def run_once(self, now: datetime | None = None) -> int:
        """One pass; 1 when there is more to do at once, else 0."""
        return int(self.run_pass(now).more)

    def keep_from(self, state: JobState, at: datetime) -> datetime:
        """The first instant kept for `state`: the start of the UTC day holding
        `at - retention` (a day is dropped whole once it ends before that)."""
        day = (at - self.retention[state]).astimezone(UTC).date()
        return datetime(day.year, day.month, day.day, tzinfo=UTC)

    def run_pass(self, now: datetime | None = None) -> RetentionReport:
        """One pass of every step, in order (partitions, moves, key frees, defaults,
        workers, audit), each in bounded batches; `now` pins the database clock."""
        report = RetentionReport()
        at = self.store.database_now(now)
        keep_from = {s: self.keep_from(s, at) for s in FINAL_STATES}
        self._partitions(at, keep_from, report)
        for state in FINAL_STATES:
            self._batches(report, partial(self._move, state, keep_from, report))
        for table in self.store.expired_tables():
            self._free_keys(table, report)
        for state in FINAL_STATES:
            self._batches(report, partial(self._sweep, state, keep_from[state], report))
        self._batches(report, lambda: self._count(report, "workers", self.store.prune_workers(
            at - self.workers_retention, self.batch_size)))
        self._batches(report, lambda: self._count(report, "audit", self.store.prune_audit(
            at - self.audit_retention, self.batch_size)))
        if report.busy():
            emit(log, "retention_pass", **{f.name: getattr(report, f.name)
                                           for f in fields(report)})
        return report

    # --- steps --------------------------------------------------------------------------

    def _partitions(self, at: datetime, keep_from: Mapping[JobState, datetime],
                    report: RetentionReport) -> None:
        today = at.astimezone(UTC).date()
        wanted = {(s, today + timedelta(days=n))
                  for s in FINAL_STATES for n in range(self.ahead_days + 1)}
        for state in FINAL_STATES:  # where the next moves out of tock_jobs will land
            limit = self.batch_size * BATCHES_PER_PASS
            wanted |= {(state, d) for d in self.store.finished_days(state, limit)
                       if d >= keep_from[state].date()}
        existing = set(self.store.day_partitions())
        work: list[tuple[str, JobState, date]] = sorted(
            [("create", s, d) for s, d in wanted - existing]
            + [("expire", s, d) for s, d in existing if d < keep_from[s].date()],
            key=lambda w: (w[2], w[1].value, w[0]))
        for done, (what, state, day) in enumerate(work):
            if done == MAX_DDL_PER_PASS:
                report.more = True
                return
            try:
                with self.store.transaction() as tx:
                    if not tx.try_ddl_lock():
                        return  # another timer is at it: its pass does this
                    tx.set_lock_timeout()
                    if what == "create" and tx.ensure_partition(state, day):
                        report.created += 1
                        emit(log, "history_partition_created", state=state.value,
                             day=day.isoformat())
                    elif what == "expire" and tx.expire_partition(state, day):
                        report.expired += 1
                        EXPIRED.labels(state.value).inc()
                        emit(log, "history_partition_expired", state=state.value,
                             day=day.isoformat())
            except (LockTimeout, DataRejected) as exc:
                # Readers or writers hold the parent longer than a second: never queue
                # everyone behind the DDL. (DataRejected: ATTACH found a row of that day in
                # the DEFAULT partition, which the function's lock should prevent.) The
                # next pass tries again.
                emit(log, "history_ddl_busy", logging.WARNING, action=what,
                     state=state.value, day=day.isoformat(), error=str(exc))
                return

    def _move(self, state: JobState, keep_from: Mapping[JobState, datetime],
              report: RetentionReport) -> int:
        with self.store.transaction() as tx:
            ids = tx.pick_finished(state, self.batch_size)
            if not ids:
                return 0
            moved, total = tx.move_finished(ids, keep_from)
        MOVED.inc(moved)
        report.moved += moved
        self._count(report, "deleted", total - moved)
        return len(ids)

    def _sweep(self, state: JobState, keep_from: datetime, report: RetentionReport) -> int:
        return self._count(report, "swept",
                           self.store.sweep_default(state, keep_from, self.batch_size))

    def _free_keys(self, table: str, report: RetentionReport) -> None:
        def batch() -> int:
            freed = self.store.prune_expired(table, self.batch_size)
            report.keys_freed += freed
            return freed

        if self._batches(report, batch):
            return  # keys left: the next pass goes on
        # No keyed job left: nothing refers to the table any more.
        try:
            with self.store.transaction() as tx:
                if tx.try_ddl_lock():
                    tx.set_lock_timeout()
                    tx.drop_expired(table)
                    report.dropped += 1
                    emit(log, "history_expired_dropped", table=table)
        except LockTimeout as exc:
            emit(log, "history_ddl_busy", logging.WARNING, action="drop", table=table,
                 error=str(exc))

    def _batches(self, report: RetentionReport, batch: Callable[[], int]) -> bool:
        """Run `batch` until it does less than a full batch, at most BATCHES_PER_PASS
        times; True (and `report.more`) if the last one was full."""
        for _ in range(BATCHES_PER_PASS):
            if batch() < self.batch_size:
                return False
        report.more = True
        return True

    @staticmethod
    def _count(report: RetentionReport, what: str, n: int) -> int:
        setattr(report, what, getattr(report, what) + n)
        if n:
            PRUNED.labels(what).inc(n)
        return n
