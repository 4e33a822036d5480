"""The timer's claim with flow control: fair share between tenants, concurrency limits and
rate limits, and the tables that configure them (tock_tenant_weights, tock_limits).

Within a priority level the claim walks the (kind, queue, tenant) pairs with due work
through `tock_jobs_fair_idx` (priority, kind, queue, coalesce(tenant, ''), run_at DESC,
id DESC): a loose index scan of the (kind, queue) lanes, and inside each lane one of its
tenants, one probe per step, every probe stopping at the first matching row (the newest
of its group, which is live: dead entries of claimed rows gather at the old end), so a
million far-future or same-tenant rows cost nothing. Kinds and tenants at a limit, and
lanes whose dispatch window is full, are left out of the walk. The caller shares the
batch out (timer_service.fair_share) and claims each pair's oldest rows, SKIP LOCKED, so
any number of timers claim side by side and each row goes to exactly one of them. Jobs
without a tenant are the tenant ''.
"""

from shared.core.validation import MAX_PRIORITY, MIN_PRIORITY
from shared.store.columns import NOW, due_since
from shared.store.counts_sql import PAIRS
from shared.store.lingering_sql import lingering_count, live_lingering

_DUE = "j.state IN ('scheduled', 'retrying')"
TENANT_KEY = "coalesce(j.tenant, '')"
IN_FLIGHT = "j.state IN ('dispatched', 'running')"
"""A job holds a concurrency slot from its dispatch until its outcome (or its rescue); a
handler still running after its job left the worker holds one too (lingering_sql)."""

# Probes are LATERAL ... ORDER BY run_at DESC LIMIT 1, not EXISTS: the planner may turn
# an EXISTS into a hash semi-join that reads every due row of the level (it did at 5M
# pending rows, from statistics that counted few due rows). The ORDER BY, which only the
# index gives without a sort, keeps a bare LIMIT 1 from being planned as a sequential scan
# that "soon" meets a match (it was, at 1M due rows: 0.7 s per probe of an empty level);
# and newest first, a probe starts at `now` and meets a live row at once, not the dead
# entries claimed rows leave at the old end of the range until vacuum.

# Levels with something due, highest first: one probe of tock_jobs_due_idx each.
DUE_LEVELS = f"""
SELECT p.level FROM generate_series(9, 0, -1) AS p(level)
CROSS JOIN LATERAL (SELECT 1 FROM tock_jobs j
                    WHERE {_DUE} AND j.priority = p.level AND j.run_at <= {NOW}
                    ORDER BY j.run_at DESC LIMIT 1) due
ORDER BY p.level DESC
"""


def _due_pairs(bound: str) -> str:
    """(kind, queue, tenant, weight) with due jobs at one level: kinds not in
    %(skip_kinds)s, lanes (kind, queue) not in %(skip_lane_kinds)s/%(skip_lane_queues)s,
    in each lane at most %(per_kind)s tenants, in key order from `bound` %(after)s, not
    in %(skip_tenants)s."""
    # The ORDER BY names the tenant too, so that only tock_jobs_fair_idx gives the order:
    # by kind alone the planner may take tock_jobs_kind_idx, which holds every row of the
    # kind, and step over all its dispatched and running ones to find a due one.
    return f"""
WITH RECURSIVE lanes(kind, queue) AS (
    (SELECT j.kind, j.queue FROM tock_jobs j WHERE {_DUE} AND j.priority = %(level)s
     ORDER BY j.kind, j.queue, {TENANT_KEY} LIMIT 1)
    UNION ALL
    SELECT n.kind, n.queue FROM lanes l CROSS JOIN LATERAL (
        SELECT j.kind, j.queue FROM tock_jobs j
        WHERE {_DUE} AND j.priority = %(level)s AND (j.kind, j.queue) > (l.kind, l.queue)
        ORDER BY j.kind, j.queue, {TENANT_KEY} LIMIT 1) n
)
SELECT k.kind, k.queue, t.tk, coalesce(w.weight, 1)
FROM lanes k
CROSS JOIN LATERAL (
    WITH RECURSIVE t(tk) AS (
        (SELECT {TENANT_KEY} FROM tock_jobs j
         WHERE {_DUE} AND j.priority = %(level)s AND j.kind = k.kind AND j.queue = k.queue
           AND {TENANT_KEY} {bound} %(after)s
         ORDER BY {TENANT_KEY} LIMIT 1)
        UNION ALL
        SELECT (SELECT {TENANT_KEY} FROM tock_jobs j
                WHERE {_DUE} AND j.priority = %(level)s AND j.kind = k.kind
                  AND j.queue = k.queue AND {TENANT_KEY} > t.tk
                ORDER BY {TENANT_KEY} LIMIT 1)
        FROM t WHERE t.tk IS NOT NULL
    )
    SELECT t.tk FROM t
    CROSS JOIN LATERAL (
        SELECT 1 FROM tock_jobs j
        WHERE {_DUE} AND j.priority = %(level)s AND j.kind = k.kind AND j.queue = k.queue
          AND {TENANT_KEY} = t.tk AND j.run_at <= {NOW}
        ORDER BY j.run_at DESC LIMIT 1) due
    WHERE t.tk IS NOT NULL AND t.tk <> ALL(%(skip_tenants)s::text[])
    LIMIT %(per_kind)s
) t
LEFT JOIN tock_tenant_weights w ON w.tenant = t.tk
WHERE k.kind <> ALL(%(skip_kinds)s::text[])
  AND NOT EXISTS (SELECT 1 FROM unnest(%(skip_lane_kinds)s::text[],
                                       %(skip_lane_queues)s::text[]) AS s(kind, queue)
                  WHERE s.kind = k.kind AND s.queue = k.queue)
ORDER BY k.kind, k.queue, t.tk
"""


DUE_PAIRS_FROM = _due_pairs(">=")
DUE_PAIRS_AFTER = _due_pairs(">")


def _dispatch(due: str) -> str:
    """Mark the rows of the CTE `due` (id, prev_state, tk) dispatched, with fresh tokens."""
    return f"""
WITH due AS ({due})
UPDATE tock_jobs j
SET state = 'dispatched', dispatch_token = gen_random_uuid(), dispatched_at = {NOW},
    updated_at = {NOW}
FROM due
WHERE j.id = due.id
RETURNING j.id, j.kind, j.queue, j.dispatch_token, due.prev_state,
          extract(epoch FROM {NOW} - {due_since('j')})::float8 AS lag_seconds, due.tk,
          j.run_at
"""


# Up to each (kind, queue, tenant)'s quota of its oldest due jobs at one level (SKIP LOCKED,
# as above); for a kind with a per-key limit (`unkeyed`), only its jobs without a key.
# Each pair's scan starts past its floor (run_at, id) when it has one (NULL: from the
# oldest): the index entries of the jobs claimed before it stay where the scan would start
# until VACUUM, and a backlog's claims would step over more of them every batch.
CLAIM_PAIRS = _dispatch(f"""
    SELECT d.id, d.state AS prev_state, q.tk
    FROM unnest(%(kinds)s::text[], %(queues)s::text[], %(tenants)s::text[],
                %(quotas)s::int[], %(unkeyed)s::bool[], %(floor_ats)s::timestamptz[],
                %(floor_ids)s::bigint[])
         AS q(kind, queue, tk, n, unkeyed, floor_at, floor_id)
    CROSS JOIN LATERAL (
        SELECT j.id, j.state FROM tock_jobs j
        WHERE {_DUE} AND j.priority = %(level)s AND j.kind = q.kind AND j.queue = q.queue
          AND {TENANT_KEY} = q.tk AND j.run_at <= {NOW}
          AND (j.run_at, j.id) > (coalesce(q.floor_at, '-infinity'), coalesce(q.floor_id, 0))
          AND (NOT q.unkeyed OR j.concurrency_key IS NULL)
        ORDER BY j.run_at, j.id
        LIMIT q.n
        FOR UPDATE SKIP LOCKED
    ) d""")

# --- per-key limits ----------------------------------------------------------------------------
# A kind with a kind_key limit has its keyed jobs claimed key by key: a walk of the keys
# with due work of one (kind, queue, tenant) at a level through tock_jobs_key_due_idx, from a
# cursor (so every key gets its turn however many there are), one probe per key, then each
# key's oldest jobs up to the room its limit leaves. The kind_key limit's advisory lock
# (LOCK_LIMITS) keeps the counts true until the claim commits, as for the other limits.
_KEYED_DUE = "j.concurrency_key IS NOT NULL AND j.state IN ('scheduled', 'retrying')"
_KEYED_PAIR = (f"{_KEYED_DUE} AND j.kind = %(kind)s AND j.priority = %(level)s "
               f"AND {TENANT_KEY} = %(tenant)s AND j.queue = %(queue)s")
"""One (kind, queue, tenant)'s keyed due jobs at a level: the queue is read from the row
(tock_jobs_key_due_idx has no queue), a kind's keyed jobs being on one queue as a rule."""

# Up to %(walk)s keys after %(after)s: (key, has due work now, jobs of the key in flight).
KEY_ROOMS = f"""
WITH RECURSIVE keys(ck) AS (
    (SELECT j.concurrency_key FROM tock_jobs j
     WHERE {_KEYED_PAIR} AND j.concurrency_key > %(after)s
     ORDER BY j.concurrency_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.concurrency_key FROM tock_jobs j
            WHERE {_KEYED_PAIR} AND j.concurrency_key > keys.ck
            ORDER BY j.concurrency_key LIMIT 1)
    FROM keys WHERE keys.ck IS NOT NULL
), walked AS (
    SELECT k.ck, EXISTS (SELECT 1 FROM tock_jobs j
                         WHERE {_KEYED_PAIR} AND j.concurrency_key = k.ck
                           AND j.run_at <= {NOW}) AS due
    FROM keys k WHERE k.ck IS NOT NULL
    LIMIT %(walk)s
)
SELECT w.ck, w.due,
       CASE WHEN w.due THEN (SELECT count(*) FROM tock_jobs j
                             WHERE {IN_FLIGHT} AND j.concurrency_key IS NOT NULL
                               AND j.kind = %(kind)s AND j.concurrency_key = w.ck)
                            + {lingering_count("h.kind = %(kind)s AND h.concurrency_key = w.ck")}
       END
FROM walked w
"""

# Up to each key's quota of its oldest due jobs of one (kind, queue, tenant) at one level.
CLAIM_KEYS = _dispatch(f"""
    SELECT d.id, d.state AS prev_state, %(tenant)s::text AS tk
    FROM unnest(%(keys)s::text[], %(quotas)s::int[]) AS q(ck, n)
    CROSS JOIN LATERAL (
        SELECT j.id, j.state FROM tock_jobs j
        WHERE {_KEYED_PAIR} AND j.concurrency_key = q.ck AND j.run_at <= {NOW}
        ORDER BY j.run_at, j.id
        LIMIT q.n
        FOR UPDATE SKIP LOCKED
    ) d""")

# --- limits ------------------------------------------------------------------------------------
# A limit's room: concurrency slots left (max_running - jobs dispatched or running) and
# rate tokens (refilled by elapsed time, up to burst). Only one timer at a time claims
# for a limit: its transaction-level advisory lock, tried (never waited for), is held
# until the claim commits after the send, so the count it read stays true meanwhile.
# A limit whose lock another timer holds has no room for this pass. The transaction must
# be READ COMMITTED (the default), so that the count sees the last holder's commit.
_KIND_IN_FLIGHT = f"""((SELECT count(*) FROM tock_jobs j
                        WHERE {IN_FLIGHT} AND j.kind = l.key)
                       + {lingering_count("h.kind = l.key")})"""
# The kinds with jobs in flight, as `k`: a loose scan of tock_jobs_in_flight_idx, one
# probe per kind.
_IN_FLIGHT_KINDS = f"""
WITH RECURSIVE k(kind) AS (
    (SELECT j.kind FROM tock_jobs j WHERE {IN_FLIGHT} ORDER BY j.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT j.kind FROM tock_jobs j WHERE {IN_FLIGHT} AND j.kind > k.kind
            ORDER BY j.kind LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)"""
# Tenants' in-flight counts: the kinds with jobs in flight, then one range per (kind,
# tenant), so the cost follows the slots held, not the table.
_TENANT_IN_FLIGHT = f"""(({_IN_FLIGHT_KINDS}
    SELECT coalesce(sum((SELECT count(*) FROM tock_jobs j
                         WHERE {IN_FLIGHT} AND j.kind = k.kind AND {TENANT_KEY} = l.key)),
                    0)::bigint
    FROM k WHERE k.kind IS NOT NULL) + {lingering_count("h.tenant = l.key")})"""

# A kind_key limit's slots are counted per key (KEY_ROOMS); here, all its keys' together.
_KEYED_IN_FLIGHT = f"""((SELECT count(*) FROM tock_jobs j
                         WHERE {IN_FLIGHT} AND j.concurrency_key IS NOT NULL
                           AND j.kind = l.key)
                        + {lingering_count("h.kind = l.key AND h.concurrency_key IS NOT NULL")})"""

_IN_FLIGHT_OF = f"""CASE WHEN l.scope = 'kind' THEN {_KIND_IN_FLIGHT}
                         WHEN l.scope = 'kind_key' THEN {_KEYED_IN_FLIGHT}
                         ELSE {_TENANT_IN_FLIGHT} END"""

# Of those, the lingering handlers (lingering_sql): for `explain` and the limits' listings.
_LINGERING_OF = f"""CASE WHEN l.scope = 'kind' THEN {lingering_count("h.kind = l.key")}
    WHEN l.scope = 'kind_key'
    THEN {lingering_count("h.kind = l.key AND h.concurrency_key IS NOT NULL")}
    ELSE {lingering_count("h.tenant = l.key")} END"""

_TOKENS_NOW = f"""CASE WHEN l.rate IS NULL THEN NULL
    ELSE least(l.burst::float8, l.tokens + l.rate
               * greatest(extract(epoch FROM {NOW} - l.refilled_at), 0)) END"""

# Two statements, not one: READ COMMITTED takes a statement's snapshot when it starts, so a
# count in the statement that takes the lock could miss what the lock's last holder
# committed just before letting go.
LOCK_LIMITS = """
SELECT l.scope, l.key,
       pg_try_advisory_xact_lock(hashtext('tock_limit'), hashtext(l.scope || ':' || l.key))
FROM tock_limits l
"""

LIMIT_ROOM = f"""
SELECT l.scope, l.key, l.max_running,
       CASE WHEN l.max_running IS NOT NULL AND l.scope <> 'kind_key' THEN {_IN_FLIGHT_OF} END,
       {_TOKENS_NOW}, l.rate
FROM tock_limits l
JOIN unnest(%(scopes)s::text[], %(keys)s::text[]) AS m(scope, key)
  ON m.scope = l.scope AND m.key = l.key
"""

# Tokens spent by the jobs just claimed, in the claiming transaction.
TAKE_TOKENS = f"""
UPDATE tock_limits l
SET tokens = {_TOKENS_NOW} - t.n, refilled_at = {NOW}
FROM unnest(%(scopes)s::text[], %(keys)s::text[], %(counts)s::int[]) AS t(scope, key, n)
WHERE l.scope = t.scope AND l.key = t.key AND l.rate IS NOT NULL
"""

SET_LIMIT = f"""
INSERT INTO tock_limits AS l (scope, key, max_running, rate, burst, tokens, refilled_at)
VALUES (%(scope)s, %(key)s, %(max_running)s, %(rate)s, %(burst)s,
        coalesce(%(burst)s, 0), {NOW})
ON CONFLICT (scope, key) DO UPDATE
SET max_running = EXCLUDED.max_running, rate = EXCLUDED.rate, burst = EXCLUDED.burst,
    tokens = least(coalesce(EXCLUDED.burst, 0),
                   CASE WHEN l.rate IS NULL THEN coalesce(EXCLUDED.burst, 0)
                        ELSE {_TOKENS_NOW} END),
    refilled_at = {NOW}, updated_at = {NOW}
"""

DELETE_LIMIT = "DELETE FROM tock_limits WHERE scope = %(scope)s AND key = %(key)s RETURNING 1"

_PRIORITIES = "'{" + ",".join(map(str, range(MIN_PRIORITY, MAX_PRIORITY + 1))) + "}'"


def _up_to_bound(rows: str) -> str:
    """count(*) of `rows` (a FROM ... WHERE ...), stopping at %(bound)s + 1."""
    return f"(SELECT count(*) FROM (SELECT 1 {rows} LIMIT %(bound)s + 1) w)"


# Waiting jobs are counted up to %(bound)s + 1, each through an index range: a kind's in
# tock_jobs_group_idx, one range per queue it has jobs on (PAIRS walks them); a tenant's
# in tock_jobs_fair_idx, one per priority level and kind.
_KIND_WAITING = _up_to_bound(f"""FROM tock_jobs j
    WHERE j.queue = ANY(ARRAY(SELECT p.queue FROM pairs p WHERE p.kind = l.key))
      AND j.kind = l.key AND {_DUE} AND j.run_at <= {NOW}""")
_KEYED_WAITING = _up_to_bound(f"""FROM tock_jobs j
    WHERE {_KEYED_DUE} AND j.kind = l.key AND j.run_at <= {NOW}""")
_TENANT_WAITING = _up_to_bound(f"""FROM tock_jobs j
    WHERE {_DUE} AND j.priority = ANY({_PRIORITIES}::smallint[])
      AND j.kind = ANY(ARRAY(SELECT DISTINCT p.kind FROM pairs p))
      AND {TENANT_KEY} = l.key AND j.run_at <= {NOW}""")

LIMITS = f"""
WITH RECURSIVE {PAIRS}
SELECT l.scope, l.key, l.max_running, l.rate, l.burst,
       CASE WHEN l.max_running IS NULL THEN NULL ELSE {_IN_FLIGHT_OF} END,
       {_TOKENS_NOW},
       CASE WHEN l.scope = 'kind' THEN {_KIND_WAITING}
            WHEN l.scope = 'kind_key' THEN {_KEYED_WAITING}
            ELSE {_TENANT_WAITING} END,
       CASE WHEN l.scope = 'kind_key'
            THEN (SELECT count(*) FROM (
                      SELECT 1 FROM (
                          SELECT j.concurrency_key AS ck FROM tock_jobs j
                          WHERE {IN_FLIGHT} AND j.concurrency_key IS NOT NULL
                            AND j.kind = l.key
                          UNION ALL
                          SELECT h.concurrency_key FROM {live_lingering("h")}
                            AND h.kind = l.key AND h.concurrency_key IS NOT NULL
                      ) used
                      GROUP BY used.ck HAVING count(*) >= l.max_running) full_keys)
       END,
       CASE WHEN l.max_running IS NULL THEN NULL ELSE {_LINGERING_OF} END
FROM tock_limits l
WHERE %(scope)s::text IS NULL OR (l.scope = %(scope)s AND l.key = %(key)s)
ORDER BY l.scope, l.key
"""

# One key's use of its kind's kind_key limit (for `explain`): the limit, the key's jobs in
# flight, and its due jobs.
_KEY_WAITING = _up_to_bound(f"""FROM tock_jobs j
    WHERE {_KEYED_DUE} AND j.kind = l.key AND j.concurrency_key = %(ck)s
      AND j.run_at <= {NOW}""")
KEY_LIMIT = f"""
SELECT l.max_running,
       (SELECT count(*) FROM tock_jobs j
        WHERE {IN_FLIGHT} AND j.concurrency_key IS NOT NULL AND j.kind = l.key
          AND j.concurrency_key = %(ck)s)
       + {lingering_count("h.kind = l.key AND h.concurrency_key = %(ck)s")},
       {_KEY_WAITING},
       {lingering_count("h.kind = l.key AND h.concurrency_key = %(ck)s")}
FROM tock_limits l
WHERE l.scope = 'kind_key' AND l.key = %(kind)s
"""

# --- the dispatch window ------------------------------------------------------------------------
# Jobs of each (kind, queue, tenant) sent to SQS and not yet claimed by a consumer, up to
# %(cap)s of each kind, and how many of those were sent more than %(age)s seconds ago: a
# loose scan of the kinds in tock_jobs_in_flight_idx, then each kind's range of it. The
# ORDER BY (only that index gives it without a sort) keeps the planner on it: a range of
# one kind holds its jobs in SQS and its running ones (at most the fleet's handler
# slots), where tock_jobs_kind_idx would step over every due row of the kind.
_IN_SQS_OF = f"""(
    SELECT j.dispatched_at, j.queue, {TENANT_KEY} AS tk FROM tock_jobs j
    WHERE {IN_FLIGHT} AND j.kind = %(kind_ref)s AND j.state = 'dispatched'
    ORDER BY j.kind, {TENANT_KEY} LIMIT %(cap)s)"""
_WAITED = f"count(*) FILTER (WHERE s.dispatched_at < {NOW} - make_interval(secs => %(age)s))"

IN_SQS = f"""{_IN_FLIGHT_KINDS}
SELECT k.kind, c.queue, c.tk, c.n, c.waited
FROM k CROSS JOIN LATERAL (
    SELECT s.queue, s.tk, count(*) AS n, {_WAITED} AS waited
    FROM {_IN_SQS_OF.replace("%(kind_ref)s", "k.kind")} s
    GROUP BY s.queue, s.tk) c
WHERE k.kind IS NOT NULL
"""

KIND_IN_SQS = f"""
SELECT s.queue, count(*) FROM (
    SELECT j.queue FROM tock_jobs j
    WHERE {IN_FLIGHT} AND j.kind = %(kind)s AND j.state = 'dispatched'
    ORDER BY j.kind, {TENANT_KEY} LIMIT %(cap)s) s
GROUP BY s.queue ORDER BY count(*) DESC, s.queue"""

# --- tenant weights ----------------------------------------------------------------------------

SET_TENANT_WEIGHT = """
INSERT INTO tock_tenant_weights (tenant, weight) VALUES (%(tenant)s, %(weight)s)
ON CONFLICT (tenant) DO UPDATE SET weight = EXCLUDED.weight, updated_at = now()
"""

DELETE_TENANT_WEIGHT = "DELETE FROM tock_tenant_weights WHERE tenant = %(tenant)s RETURNING 1"

TENANT_WEIGHTS = "SELECT tenant, weight FROM tock_tenant_weights ORDER BY tenant"
