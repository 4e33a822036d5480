"""The operators' statements: listing, bulk actions, statistics, workers, the timeline and
the facts behind `explain`. Fixed statements are constants here; listing and bulk actions
are composed from the operator's filter (`where`, values always bound).

Listing is newest first and pages on `id` (`WHERE id < cursor ORDER BY id DESC LIMIT n`),
so page 10,000 costs what page 1 costs; the per-filter indexes are `(state, id)`,
`(kind, id)` (migration 0001), `(queue, id)` and `(tenant, id)` (0003), and the same on
the history (0007), where a state filter also picks the partitions. Every statement that
reads jobs reads the hot table and the history in one statement (a job moving meanwhile
is seen once): each side gives its own newest `limit`, and the two merge by id.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql as pgsql

from shared.core.filters import JobFilter
from shared.core.states import JobState
from shared.store.columns import JOB_COLUMNS, NOW, due_since, state_is
from shared.store.history_sql import (
    RETRIED_SET,
    back_to_hot,
    cancelled_attempt,
    final_row,
    from_history,
    movable,
    to_history,
)
from shared.store.lingering_sql import cancelled_running

DB_NOW = "SELECT now()"


def where(f: JobFilter, *, only_states: tuple[JobState, ...] | None = None
          ) -> tuple[pgsql.Composable, dict[str, Any]]:
    """The filter as a WHERE clause (without the keyword) and its parameters. `only_states`
    intersects the filter's states with the states an action applies to."""
    parts: list[pgsql.Composable] = []
    params: dict[str, Any] = {}
    states = f.states
    if only_states is not None:
        states = tuple(s for s in (states or only_states) if s in only_states)
        if not states:
            return pgsql.SQL("false"), params
    if states:
        parts.append(pgsql.SQL("state = ANY(%(states)s::tock_job_state[])"))
        params["states"] = [s.value for s in states]
    for name, column in (("kind", "kind"), ("queue", "queue"), ("tenant", "tenant"),
                         ("key", "unique_key")):
        value = getattr(f, name)
        if value is not None:
            parts.append(pgsql.SQL("{} = {}").format(pgsql.Identifier(column),
                                                     pgsql.Placeholder(name)))
            params[name] = value
    if f.created_after is not None:
        parts.append(pgsql.SQL("created_at >= %(created_after)s"))
        params["created_after"] = f.created_after
    if f.created_before is not None:
        parts.append(pgsql.SQL("created_at < %(created_before)s"))
        params["created_before"] = f.created_before
    if not parts:
        return pgsql.SQL("true"), params
    return pgsql.SQL(" AND ").join(parts), params


def list_jobs(clause: pgsql.Composable, *, with_cursor: bool) -> pgsql.Composed:
    cursor = pgsql.SQL(" AND id < %(before_id)s") if with_cursor else pgsql.SQL("")
    side = "SELECT {cols} FROM {table} WHERE {where}{cursor} ORDER BY id DESC LIMIT %(limit)s"
    hot, history = (pgsql.SQL(side).format(cols=pgsql.SQL(JOB_COLUMNS), where=clause,
                                           cursor=cursor, table=pgsql.Identifier(t))
                    for t in ("tock_jobs", "tock_history_jobs"))
    return pgsql.SQL("SELECT * FROM (({}) UNION ALL ({})) jobs ORDER BY id DESC "
                     "LIMIT %(limit)s").format(hot, history)


# A bulk dry run counts at most %(cap)s + 1 rows per side (a bulk action over millions of
# history rows must not start with a count of them all); max(id) is a backward walk of
# each side's id index that stops at the first match.
def count_matching(clause: pgsql.Composable) -> pgsql.Composed:
    return pgsql.SQL(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM tock_jobs WHERE {where}"
        " LIMIT %(cap)s + 1) h)"
        " + (SELECT count(*) FROM (SELECT 1 FROM tock_history_jobs WHERE {where}"
        " LIMIT %(cap)s + 1) x),"
        # The newest job's id (matching or not): handed back to the action, it keeps out
        # every job created after the dry run, and keeps in an older one that comes to
        # match meanwhile (the highest matching id would leave out one newer than it).
        " coalesce(greatest((SELECT max(id) FROM tock_jobs),"
        " (SELECT max(id) FROM tock_history_jobs)), 1)"
    ).format(where=clause)


_CANCELLED = {"state": "'cancelled'::tock_job_state", "finished_at": NOW, "updated_at": NOW}
_UPPER = pgsql.SQL(" AND id <= %(up_to)s")

# Cancel: unfinished jobs are all in tock_jobs; each leaves for the history as CANCEL_JOB
# moves it (a job older than migration 0007 whose key has no row yet: in place).
_BULK_CANCEL = """
WITH picked AS (
    SELECT id FROM tock_jobs WHERE {where} AND id > %(after)s{upper}
    ORDER BY id LIMIT %(batch)s FOR UPDATE
), upd AS (
    UPDATE tock_jobs j SET state = 'cancelled', finished_at = {now}, updated_at = {now}
    FROM picked
    WHERE j.id = picked.id AND j.state = ANY(%(action_states)s::tock_job_state[])
      AND NOT {movable}
    RETURNING j.id
), gone AS (
    DELETE FROM tock_jobs j USING picked
    WHERE j.id = picked.id AND j.state = ANY(%(action_states)s::tock_job_state[])
      AND {movable}
    RETURNING {final_row}, j.state::text AS prev_state
), {to_history}, {cancelled_attempt}, {lingering}
SELECT id FROM upd UNION ALL SELECT id FROM gone
"""

# Retry: dead and cancelled jobs are in the history (and, finished before migration 0007
# and not moved yet, in tock_jobs): the batch is the lowest ids of both sides, and those
# in the history come back to tock_jobs with their ids and attempts, as RETRY_JOB does.
_BULK_RETRY = """
WITH hot AS (
    SELECT id FROM tock_jobs WHERE {where} AND id > %(after)s{upper}
    ORDER BY id LIMIT %(batch)s FOR UPDATE
), history AS (
    SELECT id FROM tock_history_jobs WHERE {where} AND id > %(after)s{upper}
    ORDER BY id LIMIT %(batch)s FOR UPDATE
), picked AS (
    SELECT id FROM (SELECT id FROM hot UNION ALL SELECT id FROM history) p
    ORDER BY id LIMIT %(batch)s
), upd AS (
    UPDATE tock_jobs j
    SET state = 'scheduled', {retried}
    FROM picked
    WHERE j.id = picked.id AND j.state = ANY(%(action_states)s::tock_job_state[])
    RETURNING j.id
), gone AS (
    DELETE FROM tock_history_jobs h USING picked
    WHERE h.id = picked.id AND h.state = ANY(%(action_states)s::tock_job_state[])
    RETURNING h.*
), {back}, {from_history}
SELECT id FROM upd UNION ALL SELECT id FROM back
"""


def bulk_batch(action: str, clause: pgsql.Composable, *, bounded: bool) -> pgsql.Composed:
    """One batch of a bulk action, in id order after %(after)s; each row's state is
    re-checked under its lock (the same guard as the one-job statements)."""
    upper = _UPPER if bounded else pgsql.SQL("")
    if action == "cancel":
        return pgsql.SQL(_BULK_CANCEL).format(
            where=clause, upper=upper, now=pgsql.SQL(NOW), movable=pgsql.SQL(movable("j")),
            final_row=pgsql.SQL(final_row("j", _CANCELLED)),
            to_history=pgsql.SQL(to_history("gone")),
            cancelled_attempt=pgsql.SQL(cancelled_attempt("gone")),
            lingering=pgsql.SQL(cancelled_running("gone")))
    return pgsql.SQL(_BULK_RETRY).format(
        where=clause, upper=upper, retried=pgsql.SQL(RETRIED_SET),
        back=pgsql.SQL(back_to_hot("gone", "id")), from_history=pgsql.SQL(from_history("gone")))


# --- finished counts: exact for small partitions, estimated for big ones -----------------
# Rows a finished state still has in tock_jobs (left by an earlier version; the retention
# loop moves them): the state index, a short range.
HOT_FINISHED_COUNTS = """
SELECT state::text, kind, count(*) FROM tock_jobs
WHERE state = ANY(%(states)s::tock_job_state[]) GROUP BY state, kind
"""

# The history's leaves (a DEFAULT and a partition per day under each final state's table)
# with the planner's row count from the last ANALYZE (-1: never analyzed).
HISTORY_LEAVES = """
SELECT c.relname, substring(p.relname FROM '^tock_history_jobs_(.*)$'), c.reltuples::float8
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = ANY(%(parents)s::text[])
ORDER BY c.relname
"""

# The kinds' share of a leaf from its statistics (kinds are plain [A-Za-z0-9_.:-] text, so
# the array's text form parses as text[]).
KIND_SHARES = """
SELECT most_common_vals::text::text[], most_common_freqs::float8[] FROM pg_stats
WHERE schemaname = current_schema() AND tablename = %(leaf)s AND attname = 'kind'
  AND NOT inherited
"""


def probe_leaf(leaf: str) -> pgsql.Composed:
    """At most %(bound)s + 1 rows of one leaf, counted."""
    return pgsql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %(bound)s + 1) p").format(
        pgsql.Identifier(leaf))


def count_leaf(leaf: str) -> pgsql.Composed:
    return pgsql.SQL("SELECT kind, count(*) FROM {} GROUP BY kind").format(
        pgsql.Identifier(leaf))


def estimate_leaf(leaf: str) -> pgsql.Composed:
    """The planner's row estimate of a whole leaf (its reltuples scaled to its pages now)."""
    return pgsql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {}").format(pgsql.Identifier(leaf))


def sample_leaf(leaf: str) -> pgsql.Composed:
    """Kinds in a sample of %(percent)s of a leaf's pages."""
    return pgsql.SQL("SELECT kind, count(*) FROM {} TABLESAMPLE SYSTEM (%(percent)s) "
                     "GROUP BY kind").format(pgsql.Identifier(leaf))


# The last column: whether the worker's own lease has run out (the timer then rescues
# every job it holds; NULL for a row written before migration 0006).
WORKERS = f"""
SELECT id, host, pid, queues, kinds, concurrency, in_flight, started_at, last_heartbeat,
       stopped_at, lease_expires_at,
       -- now() is the transaction's start: a beat committed since reads as newer.
       greatest(extract(epoch FROM n.now - last_heartbeat), 0)::float8,
       lease_expires_at < n.now,
       (SELECT count(*) FROM tock_jobs j
        WHERE {state_is('j', 'running')} AND j.lease_owner = w.id)
FROM tock_workers w, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
WHERE stopped_at IS NULL OR stopped_at > n.now - interval '1 hour'
ORDER BY stopped_at IS NOT NULL, last_heartbeat DESC
LIMIT 500
"""

# Attempts in the history sit in the partition of their job's finish, which is never
# before the attempt's own: `job_finished_at >= since` keeps the scan to the last day's
# partitions (and the BRIN index to their last pages).
THROUGHPUT = """
SELECT floor(extract(epoch FROM finished_at - %(since)s) / %(bucket)s)::int, outcome::text,
       count(*)
FROM (
    SELECT finished_at, outcome FROM tock_attempts
    WHERE finished_at >= %(since)s AND finished_at < %(until)s
    UNION ALL
    SELECT finished_at, outcome FROM tock_history_attempts
    WHERE job_finished_at >= %(since)s AND finished_at >= %(since)s AND finished_at < %(until)s
) a
GROUP BY 1, 2
"""

LATENCY = f"""
SELECT b, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.95) WITHIN GROUP
       (ORDER BY lag), percentile_cont(0.5) WITHIN GROUP (ORDER BY run),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY run)
FROM (
    SELECT floor(extract(epoch FROM finished_at - %(since)s) / %(bucket)s)::int AS b,
           greatest(extract(epoch FROM started_at - {due_since('j')}), 0)::float8 AS lag,
           extract(epoch FROM finished_at - started_at)::float8 AS run
    FROM (
        SELECT run_at, created_at, schedule_name, started_at, finished_at FROM tock_jobs
        WHERE finished_at >= %(since)s AND finished_at < %(until)s AND state = 'succeeded'
          AND started_at IS NOT NULL
        UNION ALL
        SELECT run_at, created_at, schedule_name, started_at, finished_at
        FROM tock_history_jobs
        WHERE finished_at >= %(since)s AND finished_at < %(until)s AND state = 'succeeded'
          AND started_at IS NOT NULL
    ) j
) x
GROUP BY b
"""

DUE_AHEAD = """
SELECT count(*) FROM (
    SELECT 1 FROM tock_jobs
    WHERE state IN ('scheduled', 'retrying') AND run_at <= %(now)s AND id <> %(id)s
      AND (priority > %(priority)s OR (priority = %(priority)s AND run_at < %(run_at)s))
    LIMIT %(cap)s
) x
"""

JOB_SCHEDULE = """
SELECT j.schedule_name, coalesce(s.paused, false), s.name IS NULL FROM (
    SELECT schedule_name FROM tock_jobs WHERE id = %(id)s
    UNION ALL
    SELECT schedule_name FROM tock_history_jobs WHERE id = %(id)s
) j LEFT JOIN tock_schedules s ON s.name = j.schedule_name
WHERE j.schedule_name IS NOT NULL
"""
