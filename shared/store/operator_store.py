"""`OperatorStore`: the statements behind the dashboard, the CLI and `explain`
(shared.store.operator_sql), one typed method each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from shared.core.errors import DatabaseBug
from shared.core.filters import JobFilter
from shared.core.jobs import Job
from shared.core.reports import QueueKindStats, TenantStats, Unfinished, WorkerInfo
from shared.core.states import FINAL_STATES, JobState
from shared.store import counts_sql
from shared.store import operator_sql as sql
from shared.store.base import Query, Store
from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO

DUE_AHEAD_CAP = 10_000
UNDEFINED_TABLE = "42P01"
FINISHED_EXACT_UP_TO = 20_000
"""A history partition up to this many rows is counted exactly; a bigger one is estimated
from its statistics (or a sample of this many rows), so finished counts cost a bounded
read however long the history is."""
WAITING = (JobState.SCHEDULED, JobState.RETRYING)
_STATUS_ORDER = {"alive": 0, "stale": 1, "stopped": 2}
OTHER_KINDS = "(other)"
"""The kind label of an estimate's rows whose kinds the statistics do not name."""


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
        `cap` match; the newest job's id, matching or not: the bound of the action)."""
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

    def unfinished(self, now: datetime | None = None, *,
                   exact_up_to: int = UNFINISHED_EXACT_UP_TO) -> Unfinished:
        """Unfinished work per queue and kind and per (state, kind), a bounded read: each
        (queue, kind, state) is counted up to `exact_up_to` jobs due and as many not yet
        due, and estimated past that (see shared.store.counts_sql). Oldest ages are exact."""
        rows = self._rows(counts_sql.GROUP_COUNTS, {"now": now, "bound": exact_up_to})
        # (queue, kind) -> state -> [due, later]; the pairs' estimated flags; oldest ages.
        pairs: dict[tuple[str, str], dict[str, list[int]]] = {}
        guessed: set[tuple[str, str]] = set()
        oldest: dict[tuple[str, str], float] = {}
        counts: Counter[tuple[str, str]] = Counter()
        estimated: set[str] = set()
        for queue, kind, state, at, due, later, age in rows:
            figures = [int(due), int(later)]
            for i, is_due in ((0, True), (1, False)):
                if figures[i] > exact_up_to:
                    figures[i] = self._estimate(counts_sql.estimate_range(
                        queue, kind, state, due=is_due, now=at), exact_up_to)
                    estimated.add(state)
                    guessed.add((queue, kind))
            pairs.setdefault((queue, kind), {})[state] = figures
            if sum(figures):
                counts[(state, kind)] += sum(figures)
            # Waiting: in SQS, or scheduled/retrying with some due (then its oldest is).
            if age is not None and (state == JobState.DISPATCHED or (
                    state in WAITING and figures[0])):
                oldest[(queue, kind)] = max(oldest.get((queue, kind), 0.0), float(age))
        queues = []
        for (queue, kind), by_state in pairs.items():
            def total(*states: str, at: int | None = None,
                      by_state: dict[str, list[int]] = by_state) -> int:
                return sum(sum(f) if at is None else f[at]
                           for f in (by_state.get(s, [0, 0]) for s in states))
            stats = QueueKindStats(
                queue, kind, due=total(*WAITING, at=0), dispatched=total(JobState.DISPATCHED),
                running=total(JobState.RUNNING), future=total(*WAITING, at=1),
                oldest_due_age_seconds=max(oldest.get((queue, kind), 0.0), 0.0),
                estimated=(queue, kind) in guessed)
            if stats.depth + stats.running + stats.future:  # else: all finished meanwhile
                queues.append(stats)
        return Unfinished(queues, dict(counts), estimated)

    def queue_stats(self, now: datetime | None = None) -> list[QueueKindStats]:
        """Per queue and kind: due, dispatched, running and future counts, oldest due age
        (`unfinished().queues`)."""
        return self.unfinished(now).queues

    def tenant_stats(self, now: datetime | None = None, *,
                     exact_up_to: int = UNFINISHED_EXACT_UP_TO) -> list[TenantStats]:
        """Per tenant with unfinished work or a weight set (the busiest first, at most
        MAX_TENANT_ROWS): weight, due, dispatched, running, future, oldest due age. With
        more than `exact_up_to` jobs waiting in all, due, future and the age come from a
        sample of about that many rows (`estimated` set)."""
        row = self._one(counts_sql.WAITING_UP_TO, {"bound": exact_up_to})
        sampled = row is not None and int(row[0]) > exact_up_to
        params: dict[str, object] = {"now": now, "scale": 1.0}
        if sampled:
            total = self._estimate(counts_sql.TABLE_ROWS, exact_up_to)
            percent = min(100.0, 100.0 * exact_up_to / total)
            params.update(percent=percent, scale=100.0 / percent)
        return [TenantStats(r[0], r[1], r[2], r[3], r[4], r[5], max(float(r[6]), 0.0),
                            sampled)
                for r in self._rows(counts_sql.tenant_stats(sampled=sampled), params)]

    def counts_by_state_kind(self, states: Sequence[JobState]) -> dict[tuple[str, str], int]:
        """Unfinished jobs in `states` by (state, kind) (`unfinished().counts`: estimated
        past a bound; finished ones: `finished_counts`)."""
        if any(s in FINAL_STATES for s in states):
            raise ValueError("counts_by_state_kind counts unfinished states; "
                             "finished ones are finished_counts()")
        wanted = {s.value for s in states}
        return {k: n for k, n in self.unfinished().counts.items() if k[0] in wanted}

    def _estimate(self, explain: Query, at_least: int) -> int:
        """The planner's row estimate of a statement, and at least `at_least` + 1 (what a
        bounded count already found)."""
        plan = self._one(explain)
        assert plan is not None
        return max(int(plan[0][0]["Plan"]["Plan Rows"]), at_least + 1)

    def finished_counts(self, states: Sequence[JobState], *,
                        exact_up_to: int = FINISHED_EXACT_UP_TO
                        ) -> tuple[dict[tuple[str, str], int], set[str]]:
        """Jobs in the finished `states` by (state, kind), and the states whose figures
        include an estimate: each history partition of up to `exact_up_to` rows is
        counted, a bigger one estimated, from its statistics when it has been analyzed
        (the planner's row count, the kinds' shares), else from a sample of its pages."""
        params = {"states": [s.value for s in states]}
        counts: Counter[tuple[str, str]] = Counter(
            {(r[0], r[1]): int(r[2]) for r in self._rows(sql.HOT_FINISHED_COUNTS, params)})
        estimated: set[str] = set()
        for leaf, state, reltuples in self._history_leaves(states):
            try:
                # A savepoint each: a day the retention loop drops meanwhile is skipped.
                with self.transaction() as tx:
                    found, guessed = tx._leaf_counts(leaf, reltuples, exact_up_to)
            except DatabaseBug as exc:
                if exc.sqlstate != UNDEFINED_TABLE:
                    raise
                continue
            counts.update({(state, k): n for k, n in found.items()})
            if guessed:
                estimated.add(state)
        return dict(counts), estimated

    def _history_leaves(self, states: Sequence[JobState]) -> list[tuple[str, str, float]]:
        return [(r[0], r[1], float(r[2])) for r in self._rows(sql.HISTORY_LEAVES, {
            "parents": [f"tock_history_jobs_{s.value}" for s in states]})]

    def _leaf_counts(self, leaf: str, reltuples: float, exact_up_to: int
                     ) -> tuple[dict[str, int], bool]:
        """One history partition's jobs by kind, and whether that is an estimate."""
        if reltuples <= exact_up_to:  # small when last analyzed (or never analyzed)
            n = self._one(sql.probe_leaf(leaf), {"bound": exact_up_to})
            if n is not None and n[0] <= exact_up_to:
                if not n[0]:
                    return {}, False
                return {r[0]: int(r[1]) for r in self._rows(sql.count_leaf(leaf))}, False
        return self._estimate_leaf(leaf, reltuples, exact_up_to), True

    def _estimate_leaf(self, leaf: str, reltuples: float, sample_rows: int) -> dict[str, int]:
        total = float(self._estimate(sql.estimate_leaf(leaf), sample_rows))
        shares: dict[str, float] = {}
        stats = self._one(sql.KIND_SHARES, {"leaf": leaf}) if reltuples > sample_rows else None
        if stats and stats[0]:
            shares = dict(zip(stats[0], stats[1], strict=True))
        else:
            # Not analyzed since it grew: SYSTEM sampling takes whole pages, so the rows
            # of `percent` of the pages, scaled up, estimate the total as well.
            percent = min(100.0, 100.0 * sample_rows / total)
            seen = {r[0]: int(r[1]) for r in self._rows(sql.sample_leaf(leaf),
                                                         {"percent": percent})}
            if seen:
                total = max(sum(seen.values()) * 100.0 / percent, sample_rows + 1.0)
                shares = {k: n / sum(seen.values()) for k, n in seen.items()}
        out = {k: round(total * f) for k, f in shares.items()}
        rest = round(total) - sum(out.values())
        if rest > 0:
            out[OTHER_KINDS] = out.get(OTHER_KINDS, 0) + rest
        return {k: n for k, n in out.items() if n > 0}

    def workers(self, *, stale_after_seconds: float, now: datetime | None = None
                ) -> list[WorkerInfo]:
        """Consumers running or stopped within the last hour, live ones first. A worker
        that has not stopped is `stale` once its own lease has expired (the timer then
        rescues its jobs: with 3 s leases, 3 s after a kill -9) or once it has been silent
        for `stale_after_seconds`, whichever comes first (the bound covers a very long
        lease and rows without one); else `alive`. A live worker's `in_flight` is what it
        last reported; a stale or stopped one's is the running jobs it still holds (0
        once the timer rescued them), not its last report."""
        out = []
        for r in self._rows(sql.WORKERS, {"now": now}):
            stale = bool(r[12]) or r[11] > stale_after_seconds
            status = "stopped" if r[9] else ("stale" if stale else "alive")
            out.append(WorkerInfo(id=r[0], host=r[1], pid=r[2], queues=r[3], kinds=r[4],
                                  concurrency=r[5],
                                  in_flight=r[6] if status == "alive" else r[13],
                                  started_at=r[7],
                                  last_heartbeat=r[8], stopped_at=r[9], lease_expires_at=r[10],
                                  heartbeat_age_seconds=r[11], status=status))
        out.sort(key=lambda w: _STATUS_ORDER[w.status])  # stable: newest heartbeat first
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

    def schedule_of(self, job_id: int) -> tuple[str, bool, bool] | None:
        """(name, paused now, deleted since) of the recurring schedule that made the job;
        None if no schedule made it."""
        row = self._one(sql.JOB_SCHEDULE, {"id": job_id})
        return (str(row[0]), bool(row[1]), bool(row[2])) if row else None
