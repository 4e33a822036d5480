"""Handlers still running for jobs their worker no longer holds (tock_lingering, 0012).

A thread cannot be killed: a cancelled job's handler stops when it notices `ctx.cancelled`,
and a handler that ignores its deadline runs on while its job is recovered elsewhere. The
job row has moved on, but the handler still occupies the worker, so it keeps its
concurrency slot: limits count these rows beside the jobs in flight. The cancel writes its
row itself (no moment with the slot free); the worker's heartbeat writes the rest and
deletes those whose handler has returned; a stopping worker deletes its own, and a timer
those of a worker it finds dead (its threads died with it).
"""

from shared.store.columns import NOW

FORGET_AFTER_SECONDS = 2
"""A returned handler's row goes at the first heartbeat at least this long after it was
written (FORGET_RETURNED)."""


def live_lingering(alias: str) -> str:
    """FROM ... WHERE ... of the lingering handlers that hold a slot now (rows `alias`):
    all but those whose job is still running under the same worker and claim (a detached
    job before its rescue: counted as in flight already). The claim is its dispatch token:
    the job's next claim on the same worker may have the same attempt (a retried job counts
    from 1 again), and runs beside the old handler. A dead worker's rows go when a timer
    finds it dead (FORGET_DEAD), as its jobs are rescued: until then its handlers may be
    running."""
    return f"""tock_lingering {alias}
    WHERE NOT EXISTS (SELECT 1 FROM tock_jobs {alias}_j
                      WHERE {alias}_j.id = {alias}.job_id AND {alias}_j.state::text = 'running'
                        AND {alias}_j.lease_owner = {alias}.worker
                        AND {alias}_j.dispatch_token = {alias}.token)"""


def lingering_count(match: str) -> str:
    """How many lingering handlers hold a slot now whose row `h` matches `match`."""
    return f"(SELECT count(*) FROM {live_lingering('h')} AND {match})"


def cancelled_running(gone: str) -> str:
    """A CTE writing a lingering row for each job of CTE `gone` (a cancel's rows, with
    `prev_state`) that was running: its handler is told at its worker's next heartbeat,
    and holds its slot until it returns."""
    return f"""lingering AS (
    INSERT INTO tock_lingering (worker, job_id, attempt, token, kind, tenant, concurrency_key,
                                reason, since)
    SELECT g.lease_owner, g.id, g.attempt, g.dispatch_token, g.kind, coalesce(g.tenant, ''),
           g.concurrency_key, 'cancelled', {NOW}
    FROM {gone} g JOIN tock_workers w ON w.id = g.lease_owner
    WHERE g.prev_state = 'running'
    ON CONFLICT (worker, token) DO NOTHING
)"""


# The heartbeat's side (a CTE of WORKER_BEAT): rows of handlers no longer running here go
# (%(running)s: the dispatch tokens of the claims whose handlers still run). Only rows a
# little older than the beat: a cancel can land between a claim's commit and the moment the
# worker tracks the claim, and the beat's list, taken just before, would not name it yet.
FORGET_RETURNED = f"""forget AS (
    DELETE FROM tock_lingering
    WHERE worker = %(id)s AND NOT (token = ANY(%(running)s::uuid[]))
      AND since < {NOW} - make_interval(secs => {FORGET_AFTER_SECONDS})
)"""

# Handlers this worker still runs for jobs it lost or let go, with the job's kind, tenant and
# key from wherever the job is now (hot table or history).
RECORD = """
INSERT INTO tock_lingering (worker, job_id, attempt, token, kind, tenant, concurrency_key,
                            reason)
SELECT %(worker)s, m.id, m.attempt, m.token, j.kind, coalesce(j.tenant, ''), j.concurrency_key,
       m.reason
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(tokens)s::uuid[], %(reasons)s::text[])
     AS m(id, attempt, token, reason)
CROSS JOIN LATERAL (SELECT a.kind, a.tenant, a.concurrency_key FROM tock_jobs_all a
                    WHERE a.id = m.id LIMIT 1) j
ON CONFLICT (worker, token) DO NOTHING
"""

# The rescuer's side: rows of workers whose lease expired, judged as SELECT_EXPIRED_LEASES
# judges them (after an outage, only once the worker has had a whole lease to renew).
FORGET_DEAD = f"""
DELETE FROM tock_lingering h USING tock_workers w
WHERE w.id = h.worker AND (w.lease_expires_at IS NULL OR (
    w.lease_expires_at < {NOW}
    AND (%(since_back)s::float8 IS NULL
         OR make_interval(secs => %(since_back)s::float8)
            > w.lease_expires_at - w.last_heartbeat)))
RETURNING h.worker, h.job_id
"""
