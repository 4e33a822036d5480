"""Read and bulk-write queries for operators: filtered job listing with keyset pagination,
dry-run counts and bulk retry/cancel by filter, queue and kind statistics, workers, and
the cluster-wide gauges the dashboard's /metrics exports.

The statements live here rather than in `shared.sql` because they are composed from the
filter an operator chose (`psycopg.sql`, values always bound); the core pipeline's fixed
statements stay in `shared.sql`.

Listing is newest first and pages on `id` (`WHERE id < cursor ORDER BY id DESC LIMIT n`),
so page 10,000 costs what page 1 costs; the per-filter indexes are `(state, id)`,
`(kind, id)` (migration 0001), `(queue, id)` and `(tenant, id)` (0003).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg import sql as pgsql

from shared.core import validation
from shared.core.errors import InvalidInput
from shared.core.jobs import Job
from shared.core.states import ACTIVE_STATES, FINAL_STATES, JobState
from shared.store.database import Connection
from shared.store.jobs_sql import JOB_COLUMNS, NOTIFY_DUE

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50
BULK_BATCH_SIZE = 1000
"""Rows changed per transaction by a bulk action: short locks, steady progress."""

RETRYABLE_STATES = (JobState.DEAD, JobState.CANCELLED)
UNFINISHED_STATES = ACTIVE_STATES
FINISHED_STATES = FINAL_STATES
CANCELLABLE_STATES = ACTIVE_STATES


@dataclass(frozen=True)
class JobFilter:
    """Which jobs an operator means. Empty fields do not filter. Build with `JobFilter.of`
    to validate loose input."""

    states: tuple[JobState, ...] = ()
    kind: str | None = None
    queue: str | None = None
    tenant: str | None = None
    key: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    @classmethod
    def of(cls, *, states: object = None, kind: object = None, queue: object = None,
           tenant: object = None, key: object = None, created_after: object = None,
           created_before: object = None) -> JobFilter:
        """Validate every field; raise `InvalidInput` naming the one that is wrong."""
        return cls(
            states=parse_states(states),
            kind=validation.kind(kind) if kind not in (None, "") else None,
            queue=validation.queue(queue) if queue not in (None, "") else None,
            tenant=validation.optional_text("tenant", tenant or None,
                                            validation.MAX_TENANT_LENGTH),
            key=validation.optional_text("key", key or None, validation.MAX_KEY_LENGTH),
            created_after=(validation.aware("created_after", created_after)
                           if created_after is not None else None),
            created_before=(validation.aware("created_before", created_before)
                            if created_before is not None else None),
        )

    def is_empty(self) -> bool:
        return self == JobFilter()

    def describe(self) -> str:
        """The filter in words, for confirmations and logs."""
        parts = []
        if self.states:
            parts.append("state " + "/".join(s.value for s in self.states))
        for name in ("kind", "queue", "tenant", "key"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value}")
        if self.created_after:
            parts.append(f"created after {self.created_after.isoformat()}")
        if self.created_before:
            parts.append(f"created before {self.created_before.isoformat()}")
        return ", ".join(parts) or "all jobs"

    def where(self, *, only_states: tuple[JobState, ...] | None = None
              ) -> tuple[pgsql.Composable, dict[str, Any]]:
        """A WHERE clause (without the keyword) and its parameters. `only_states`
        intersects the filter's states with the states an action applies to."""
        parts: list[pgsql.Composable] = []
        params: dict[str, Any] = {}
        states = self.states
        if only_states is not None:
            states = tuple(s for s in (states or only_states) if s in only_states)
            if not states:
                return pgsql.SQL("false"), params
        if states:
            parts.append(pgsql.SQL("state = ANY(%(states)s::tock_job_state[])"))
            params["states"] = [s.value for s in states]
        for name, column in (("kind", "kind"), ("queue", "queue"), ("tenant", "tenant"),
                             ("key", "unique_key")):
            value = getattr(self, name)
            if value is not None:
                parts.append(pgsql.SQL("{} = {}").format(pgsql.Identifier(column),
                                                         pgsql.Placeholder(name)))
                params[name] = value
        if self.created_after is not None:
            parts.append(pgsql.SQL("created_at >= %(created_after)s"))
            params["created_after"] = self.created_after
        if self.created_before is not None:
            parts.append(pgsql.SQL("created_at < %(created_before)s"))
            params["created_before"] = self.created_before
        if not parts:
            return pgsql.SQL("true"), params
        return pgsql.SQL(" AND ").join(parts), params


def parse_states(value: object) -> tuple[JobState, ...]:
    """States from a list or a comma-separated string; unknown names are refused."""
    if value is None or value in ("", []):
        return ()
    items: list[object]
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise InvalidInput(f"state must be a state name or a list of them, got {value!r}")
    out: list[JobState] = []
    for item in items:
        try:
            state = JobState(item) if isinstance(item, str) else None
        except ValueError:
            state = None
        if state is None:
            raise InvalidInput(
                f"unknown state {item!r}; states are {', '.join(s.value for s in JobState)}"
            ) from None
        if state not in out:
            out.append(state)
    return tuple(out)


# --- listing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of jobs, newest first. `next_cursor` is passed back as `before_id` for the
    next page; None on the last page."""

    jobs: list[Job]
    next_cursor: int | None


def page_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"limit must be an integer, got {value!r}")
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE_SIZE}, got {value}")
    return value


def list_jobs(conn: Connection, where: JobFilter, *, limit: int = DEFAULT_PAGE_SIZE,
              before_id: int | None = None) -> Page:
    """Jobs matching the filter, newest first, `limit` at most, older than `before_id`."""
    page_size(limit)
    clause, params = where.where()
    if before_id is not None:
        validation.job_id(before_id)
        clause = pgsql.SQL("{} AND id < %(before_id)s").format(clause)
        params["before_id"] = before_id
    params["limit"] = limit + 1  # one more than asked tells whether another page exists
    statement = pgsql.SQL("SELECT {} FROM tock_jobs WHERE {} ORDER BY id DESC LIMIT %(limit)s"
                          ).format(pgsql.SQL(JOB_COLUMNS), clause)
    rows = conn.execute(statement, params).fetchall()
    jobs = [Job.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(jobs, jobs[-1].id if more and jobs else None)


# --- bulk actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch now: `count` jobs, none newer than `up_to_id`.
    Passing `up_to_id` back to the action keeps jobs created after the dry run out."""

    action: str
    count: int
    up_to_id: int | None
    description: str


def _action_states(action: str) -> tuple[JobState, ...]:
    if action == "retry":
        return RETRYABLE_STATES
    if action == "cancel":
        return CANCELLABLE_STATES
    raise InvalidInput(f"unknown bulk action {action!r}; use retry or cancel")


def plan_bulk(conn: Connection, action: str, where: JobFilter) -> BulkPlan:
    """The dry run: how many jobs `action` would change. Retry applies to dead and
    cancelled jobs, cancel to unfinished ones, whatever else the filter says."""
    states = _action_states(action)
    clause, params = where.where(only_states=states)
    statement = pgsql.SQL("SELECT count(*), max(id) FROM tock_jobs WHERE {}").format(clause)
    row = conn.execute(statement, params).fetchone()
    count, max_id = (row[0], row[1]) if row else (0, None)
    return BulkPlan(action, int(count), max_id, where.describe())


_BULK_SET = {
    "retry": pgsql.SQL(
        "state = 'scheduled', run_at = now(), attempt = 0, lease_owner = NULL, "
        "lease_expires_at = NULL, dispatch_token = NULL, finished_at = NULL, updated_at = now()"),
    "cancel": pgsql.SQL("state = 'cancelled', finished_at = now(), updated_at = now()"),
}


def run_bulk(pool_transaction: Any, action: str, where: JobFilter, *,
             up_to_id: int | None = None, batch_size: int = BULK_BATCH_SIZE) -> int:
    """Apply `action` to every matching job, `batch_size` rows per transaction, in id
    order; returns how many changed. `pool_transaction` is a callable returning a context
    manager that yields a connection in a transaction (`lambda: transaction(pool)`).

    Each batch re-checks the state under the row lock (the same guard as the one-job
    statements), so a job that finished or was claimed meanwhile is left alone."""
    states = _action_states(action)
    if up_to_id is not None:
        validation.job_id(up_to_id)
    clause, params = where.where(only_states=states)
    statement = pgsql.SQL(
        "WITH picked AS ("
        " SELECT id FROM tock_jobs WHERE {where} AND id > %(after)s"
        "{upper} ORDER BY id LIMIT %(batch)s FOR UPDATE)"
        " UPDATE tock_jobs j SET {set} FROM picked"
        " WHERE j.id = picked.id AND j.state = ANY(%(action_states)s::tock_job_state[])"
        " RETURNING j.id"
    ).format(where=clause, set=_BULK_SET[action],
             upper=pgsql.SQL(" AND id <= %(up_to)s") if up_to_id is not None else pgsql.SQL(""))
    params.update(batch=batch_size, up_to=up_to_id,
                  action_states=[s.value for s in states])
    after, total = 0, 0
    while True:
        with pool_transaction() as conn:
            ids = [r[0] for r in conn.execute(statement, {**params, "after": after})]
            if ids and action == "retry":
                conn.execute(NOTIFY_DUE)
        if not ids:
            return total
        total += len(ids)
        after = max(ids)


# --- statistics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueKindStats:
    """Unfinished work of one kind on one queue, as of `now`."""

    queue: str
    kind: str
    due: int
    """scheduled/retrying with run_at passed: waiting for a timer."""
    dispatched: int
    """in SQS, waiting for a consumer."""
    running: int
    future: int
    """scheduled/retrying, not yet due."""
    oldest_due_age_seconds: float
    """How long the oldest due-but-not-started job (due or dispatched) has waited; 0 if none."""

    @property
    def depth(self) -> int:
        """Jobs that are due and not yet running: the backlog consumers should drain."""
        return self.due + self.dispatched


QUEUE_STATS = """
SELECT queue, kind,
       count(*) FILTER (WHERE state IN ('scheduled', 'retrying') AND run_at <= n.now),
       count(*) FILTER (WHERE state = 'dispatched'),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state IN ('scheduled', 'retrying') AND run_at > n.now),
       coalesce(extract(epoch FROM n.now - min(run_at) FILTER (
           WHERE state = 'dispatched'
              OR (state IN ('scheduled', 'retrying') AND run_at <= n.now))), 0)::float8
FROM tock_jobs, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
WHERE state IN ('scheduled', 'retrying', 'dispatched', 'running')
GROUP BY queue, kind, n.now
ORDER BY queue, kind
"""

# Unfinished jobs are few and sit behind the state index; finished ones are the table's
# history, so counting them is a full pass that callers refresh less often.
COUNTS_BY_STATE_KIND = """
SELECT state::text, kind, count(*) FROM tock_jobs
WHERE state = ANY(%(states)s::tock_job_state[]) GROUP BY state, kind
"""


def queue_stats(conn: Connection, now: datetime | None = None) -> list[QueueKindStats]:
    """Per queue and kind: due, dispatched, running and future counts, oldest due age."""
    rows = conn.execute(QUEUE_STATS, {"now": now}).fetchall()
    return [QueueKindStats(r[0], r[1], r[2], r[3], r[4], r[5], max(float(r[6]), 0.0))
            for r in rows]


def counts_by_state_kind(conn: Connection, states: tuple[JobState, ...] = tuple(JobState)
                         ) -> dict[tuple[str, str], int]:
    """Jobs in `states` counted by (state, kind). For finished states this is a pass over
    the table's history: callers cache it."""
    params = {"states": [s.value for s in states]}
    return {(r[0], r[1]): r[2] for r in conn.execute(COUNTS_BY_STATE_KIND, params)}


@dataclass(frozen=True)
class WorkerInfo:
    """A consumer process as it last reported itself."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    heartbeat_age_seconds: float
    status: str = field(default="alive")
    """alive, stale (no heartbeat for `stale_after_seconds`) or stopped."""


WORKERS = """
SELECT id, host, pid, queues, concurrency, in_flight, started_at, last_heartbeat, stopped_at,
       extract(epoch FROM n.now - last_heartbeat)::float8
FROM tock_workers, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
WHERE stopped_at IS NULL OR stopped_at > n.now - interval '1 hour'
ORDER BY stopped_at IS NOT NULL, last_heartbeat DESC
LIMIT 500
"""


def workers(conn: Connection, *, stale_after_seconds: float,
            now: datetime | None = None) -> list[WorkerInfo]:
    """Consumers running or stopped within the last hour, live ones first."""
    out = []
    for r in conn.execute(WORKERS, {"now": now}).fetchall():
        status = "stopped" if r[8] else ("stale" if r[9] > stale_after_seconds else "alive")
        out.append(WorkerInfo(id=r[0], host=r[1], pid=r[2], queues=r[3], concurrency=r[4],
                              in_flight=r[5], started_at=r[6], last_heartbeat=r[7],
                              stopped_at=r[8], heartbeat_age_seconds=r[9], status=status))
    return out


@dataclass(frozen=True)
class Bucket:
    """One time bucket of finished work."""

    start: datetime
    outcomes: dict[str, int]
    """Finished attempts by outcome."""
    succeeded: int
    start_lag_p50: float | None
    start_lag_p95: float | None
    """Due-to-start latency (seconds) of jobs that succeeded in the bucket."""
    run_p50: float | None
    run_p95: float | None


THROUGHPUT = """
SELECT floor(extract(epoch FROM finished_at - %(since)s) / %(bucket)s)::int, outcome::text,
       count(*)
FROM tock_attempts
WHERE finished_at >= %(since)s AND finished_at < %(until)s
GROUP BY 1, 2
"""

LATENCY = """
SELECT b, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.95) WITHIN GROUP
       (ORDER BY lag), percentile_cont(0.5) WITHIN GROUP (ORDER BY run),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY run)
FROM (
    SELECT floor(extract(epoch FROM finished_at - %(since)s) / %(bucket)s)::int AS b,
           greatest(extract(epoch FROM started_at - run_at), 0)::float8 AS lag,
           extract(epoch FROM finished_at - started_at)::float8 AS run
    FROM tock_jobs
    WHERE finished_at >= %(since)s AND finished_at < %(until)s AND state = 'succeeded'
      AND started_at IS NOT NULL
) x
GROUP BY b
"""


def timeline(conn: Connection, *, now: datetime, window_seconds: int = 600,
             bucket_seconds: int = 10) -> list[Bucket]:
    """Throughput and latency of the last `window_seconds`, in `bucket_seconds` buckets,
    oldest first; empty buckets included so charts keep their time axis."""
    from datetime import timedelta

    if not 1 <= bucket_seconds <= window_seconds <= 86400:
        raise InvalidInput("need 1 <= bucket_seconds <= window_seconds <= 86400")
    count = window_seconds // bucket_seconds
    since = now - timedelta(seconds=count * bucket_seconds)
    params = {"since": since, "until": now, "bucket": bucket_seconds}
    outcomes: dict[int, dict[str, int]] = {}
    for b, outcome, n in conn.execute(THROUGHPUT, params):
        outcomes.setdefault(b, {})[outcome] = n
    latency = {r[0]: r[1:] for r in conn.execute(LATENCY, params)}
    out = []
    for b in range(count):
        lat = latency.get(b, (0, None, None, None, None))
        out.append(Bucket(since + timedelta(seconds=b * bucket_seconds), outcomes.get(b, {}),
                          int(lat[0]), lat[1], lat[2], lat[3], lat[4]))
    return out


def database_now(conn: Connection) -> datetime:
    """The database clock, which leases and run_at are judged by."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


# --- explain helpers ----------------------------------------------------------------------------

DUE_AHEAD = """
SELECT count(*) FROM (
    SELECT 1 FROM tock_jobs
    WHERE state IN ('scheduled', 'retrying') AND run_at <= %(now)s AND id <> %(id)s
      AND (priority > %(priority)s OR (priority = %(priority)s AND run_at < %(run_at)s))
    LIMIT %(cap)s
) x
"""

DUE_AHEAD_CAP = 10_000


def due_ahead(conn: Connection, job: Job, now: datetime) -> int:
    """How many due jobs the timer dispatches before this one (capped at DUE_AHEAD_CAP)."""
    row = conn.execute(DUE_AHEAD, {"now": now, "id": job.id, "priority": job.priority,
                                   "run_at": job.run_at, "cap": DUE_AHEAD_CAP}).fetchone()
    return int(row[0]) if row else 0
