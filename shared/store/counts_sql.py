"""Counts of unfinished work (tock_jobs) for the dashboard, `tock stats`, `tock tenants`
and /metrics, each a bounded read however big the backlog grows.

- Per (queue, kind): a loose scan of tock_jobs_group_idx finds the pairs with unfinished
  jobs (one probe a pair), each state of a pair is counted up to %(bound)s + 1 rows, due
  and not yet due apart (two ranges of the index), and the oldest waiting job of each is
  the first entry of a range: exact, so the autoscaling signal never rests on an estimate.
  A range past the bound is estimated from the planner's statistics (`estimate_range`).
- Per tenant: counted when at most %(bound)s jobs wait in all, else from a sample of about
  that many rows' pages, scaled; jobs in flight (bounded by the dispatch window and the
  fleet's slots) are always counted.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import sql as pgsql

from shared.store.columns import NOW

UNFINISHED_EXACT_UP_TO = 10_000
"""Each (queue, kind, state) is counted up to this many due jobs and as many not yet due,
and a limit's waiting jobs up to this many; past that they are estimated (or shown as
"more than"), so these counts cost a bounded read."""

UNFINISHED_STATES_SQL = "'{scheduled,retrying,dispatched,running}'::tock_job_state[]"

# The (queue, kind) pairs with unfinished jobs, in order: each step is the first index
# entry past the last pair (PostgreSQL 15 has no skip scan to do this by itself).
PAIRS = """
pairs(queue, kind) AS (
    (SELECT queue, kind FROM tock_jobs ORDER BY queue, kind LIMIT 1)
    UNION ALL
    SELECT n.queue, n.kind FROM pairs p, LATERAL (
        SELECT j.queue, j.kind FROM tock_jobs j
        WHERE (j.queue, j.kind) > (p.queue, p.kind)
        ORDER BY j.queue, j.kind LIMIT 1) n
)"""

_BOUNDED = """(SELECT count(*) FROM (
            SELECT 1 FROM tock_jobs j
            WHERE j.queue = p.queue AND j.kind = p.kind AND j.state = s.state
              AND j.run_at {op} t.now
            ORDER BY j.run_at LIMIT %(bound)s + 1) c)"""

# Per pair and state: due (run_at passed) and later counts, each at most %(bound)s + 1,
# and how long the state's oldest job has been due (negative: none due yet). The ORDER BY,
# which only tock_jobs_group_idx gives without a sort, keeps a count from being planned as
# a sequential scan that "soon" meets %(bound)s matches.
GROUP_COUNTS = f"""
WITH RECURSIVE {PAIRS}, t AS (SELECT {NOW} AS now)
SELECT p.queue, p.kind, s.state::text, t.now,
       {_BOUNDED.format(op="<=")},
       {_BOUNDED.format(op=">")},
       extract(epoch FROM t.now - (
           SELECT min(j.run_at) FROM tock_jobs j
           WHERE j.queue = p.queue AND j.kind = p.kind AND j.state = s.state))::float8
FROM pairs p CROSS JOIN t CROSS JOIN unnest({UNFINISHED_STATES_SQL}) s(state)
ORDER BY p.queue, p.kind, s.state
"""


def estimate_range(queue: str, kind: str, state: str, *, due: bool,
                   now: datetime) -> pgsql.Composed:
    """The planner's row estimate of one (queue, kind, state) range, due or later (the
    extended statistics tock_jobs_group_stats keep a pair's share right)."""
    return pgsql.SQL(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM tock_jobs "
        "WHERE queue = {} AND kind = {} AND state = {}::tock_job_state AND run_at {} {}"
    ).format(pgsql.Literal(queue), pgsql.Literal(kind), pgsql.Literal(state),
             pgsql.SQL("<=" if due else ">"), pgsql.Literal(now))


# Jobs waiting (scheduled or retrying, due or not), counted up to %(bound)s + 1 (in the
# order of tock_jobs_due_idx, so that only it is read).
WAITING_UP_TO = """
SELECT count(*) FROM (
    SELECT 1 FROM tock_jobs WHERE state IN ('scheduled', 'retrying')
    ORDER BY priority, run_at, id LIMIT %(bound)s + 1) w
"""

# The planner's row estimate of the whole hot table.
TABLE_ROWS = "EXPLAIN (FORMAT JSON) SELECT 1 FROM tock_jobs"

# Per tenant, the counts with the weight; the busiest MAX_TENANT_ROWS tenants (by due
# work), so a fleet of many small tenants keeps a bounded page and metric cardinality.
# Waiting jobs come from {source}: the table, or a sample of it with %(scale)s its inverse
# share; jobs in flight are counted (tock_jobs_in_flight_idx's rows).
MAX_TENANT_ROWS = 200
_TENANT_STATS = f"""
WITH t AS (SELECT {NOW} AS now)
SELECT coalesce(u.tenant, w.tenant), coalesce(w.weight, 1), coalesce(u.due, 0),
       coalesce(u.dispatched, 0), coalesce(u.running, 0), coalesce(u.future, 0),
       coalesce(u.oldest, 0)
FROM (
    SELECT tenant, sum(due)::bigint AS due, sum(dispatched)::bigint AS dispatched,
           sum(running)::bigint AS running, sum(future)::bigint AS future,
           max(oldest) AS oldest
    FROM (
        SELECT coalesce(j.tenant, '') AS tenant,
               round(count(*) FILTER (WHERE j.run_at <= t.now) * %(scale)s) AS due,
               0 AS dispatched, 0 AS running,
               round(count(*) FILTER (WHERE j.run_at > t.now) * %(scale)s) AS future,
               coalesce(extract(epoch FROM t.now - min(j.run_at) FILTER (
                   WHERE j.run_at <= t.now)), 0)::float8 AS oldest
        FROM tock_jobs j {{source}}, t
        WHERE j.state IN ('scheduled', 'retrying')
        GROUP BY 1, t.now
        UNION ALL
        SELECT coalesce(j.tenant, ''), 0, count(*) FILTER (WHERE j.state = 'dispatched'),
               count(*) FILTER (WHERE j.state = 'running'), 0, 0
        FROM tock_jobs j
        WHERE j.state IN ('dispatched', 'running')
        GROUP BY 1
    ) parts
    GROUP BY tenant
) u
FULL JOIN tock_tenant_weights w ON w.tenant = u.tenant
ORDER BY u.due DESC NULLS LAST, u.running DESC NULLS LAST, coalesce(u.tenant, w.tenant)
LIMIT {MAX_TENANT_ROWS}
"""


def tenant_stats(*, sampled: bool) -> pgsql.SQL:
    """Per-tenant counts, waiting jobs read in full or from a sample of %(percent)s of the
    table's pages (SYSTEM sampling reads only those pages)."""
    source = "TABLESAMPLE SYSTEM (%(percent)s)" if sampled else ""
    return pgsql.SQL(_TENANT_STATS.format(source=source))
