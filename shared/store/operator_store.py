"""`OperatorStore`: the statements behind the dashboard, the CLI and `explain`
(shared.store.operator_sql), one typed method each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.core.filters import JobFilter
from shared.core.jobs import Job
from shared.core.reports import QueueKindStats, TenantStats, WorkerInfo
from shared.core.states import JobState
from shared.store import operator_sql as sql
from shared.store.base import Store

DUE_AHEAD_CAP = 10_000


class OperatorStore(Store):
    """Operator statements. See `Store` for how a store runs them."""

    def database_now(self) -> datetime:
        """The database clock, which leases and run_at are judged by."""
        row = self._one(sql.DB_NOW)
        assert row is not None
        value: datetime = row[0]
        return value

    def list_jobs(self, where: JobFilter, *, limit: int, before_id: int | None = None
                  ) -> list[Job]:
        """Up to `limit` jobs matching the filter, newest first, older than `before_id`,
        unfinished or in the history."""
        clause, params = sql.where(where)
        params.update(limit=limit, before_id=before_id)
        rows = self._rows(sql.list_jobs(clause, with_cursor=before_id is not None), params)
        return [Job.from_row(r) for r in rows]

    def count_matching(self, where: JobFilter, only_states: tuple[JobState, ...], *,
                       cap: int) -> tuple[int, bool, int | None]:
        """(how many jobs match in `only_states`, counted up to `cap`; whether more than
        `cap` match; the highest id among them)."""
        clause, params = sql.where(where, only_states=only_states)
        params["cap"] = cap
        row = self._one(sql.count_matching(clause), params)
        if not row:
            return 0, False, None
        return min(int(row[0]), cap), int(row[0]) > cap, row[1]

    def bulk_batch(self, action: str, where: JobFilter, action_states: tuple[JobState, ...],
                   *, after: int, up_to_id: int | None, batch_size: int) -> list[int]:
        """Apply `action` to the next `batch_size` matching jobs with id > `after` (and
        <= `up_to_id`), in the hot table or the history (a cancelled job moves to the
        history, a retried one back); returns the ids changed."""
        clause, params = sql.where(where, only_states=action_states)
        params.update(after=after, up_to=up_to_id, batch=batch_size, now=None,
                      action_states=[s.value for s in action_states])
        statement = sql.bulk_batch(action, clause, bounded=up_to_id is not None)
        return [r[0] for r in self._rows(statement, params)]

    def queue_stats(self, now: datetime | None = None) -> list[QueueKindStats]:
        """Per queue and kind: due, dispatched, running and future counts, oldest due age."""
        return [QueueKindStats(r[0], r[1], r[2], r[3], r[4], r[5], max(float(r[6]), 0.0))
                for r in self._rows(sql.QUEUE_STATS, {"now": now})]

    def tenant_stats(self, now: datetime | None = None) -> list[TenantStats]:
        """Per tenant with unfinished work or a weight set (the busiest first, at most
        MAX_TENANT_ROWS): weight, due, dispatched, running, future, oldest due age."""
        return [TenantStats(r[0], r[1], r[2], r[3], r[4], r[5], max(float(r[6]), 0.0))
                for r in self._rows(sql.TENANT_STATS, {"now": now})]

    def counts_by_state_kind(self, states: Sequence[JobState]) -> dict[tuple[str, str], int]:
        """Jobs in `states` counted by (state, kind). For finished states this is a pass
        over the history's partitions of those states: callers cache it."""
        rows = self._rows(sql.COUNTS_BY_STATE_KIND, {"states": [s.value for s in states]})
        return {(r[0], r[1]): r[2] for r in rows}

    def workers(self, *, stale_after_seconds: float, now: datetime | None = None
                ) -> list[WorkerInfo]:
        """Consumers running or stopped within the last hour, live ones first."""
        out = []
        for r in self._rows(sql.WORKERS, {"now": now}):
            status = "stopped" if r[9] else ("stale" if r[11] > stale_after_seconds else "alive")
            out.append(WorkerInfo(id=r[0], host=r[1], pid=r[2], queues=r[3], kinds=r[4],
                                  concurrency=r[5], in_flight=r[6], started_at=r[7],
                                  last_heartbeat=r[8], stopped_at=r[9], lease_expires_at=r[10],
                                  heartbeat_age_seconds=r[11], status=status))
        return out

    def throughput(self, since: datetime, until: datetime, bucket_seconds: int
                   ) -> list[tuple[int, str, int]]:
        """(bucket index, outcome, finished attempts) in [since, until)."""
        return [(r[0], r[1], r[2]) for r in self._rows(sql.THROUGHPUT, {
            "since": since, "until": until, "bucket": bucket_seconds})]

    def latency(self, since: datetime, until: datetime, bucket_seconds: int
                ) -> dict[int, tuple[int, float | None, float | None, float | None,
                                     float | None]]:
        """bucket index -> (succeeded, start lag p50, p95, run time p50, p95)."""
        return {r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in self._rows(sql.LATENCY, {
            "since": since, "until": until, "bucket": bucket_seconds})}

    def due_ahead(self, job: Job, now: datetime) -> int:
        """How many due jobs the timer dispatches before this one (capped at
        DUE_AHEAD_CAP)."""
        row = self._one(sql.DUE_AHEAD, {"now": now, "id": job.id, "priority": job.priority,
                                        "run_at": job.run_at, "cap": DUE_AHEAD_CAP})
        return int(row[0]) if row else 0

    def paused_schedule_of(self, job_id: int) -> str | None:
        """The schedule that made the job, if it is paused now."""
        row = self._one(sql.PAUSED_SCHEDULE, {"id": job_id})
        return str(row[0]) if row else None
