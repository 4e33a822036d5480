"""The statements of the producer and of an operator on one job: insert, read, cancel,
retry (same conventions as jobs_sql.py). A job is in the hot table (`tock_jobs`) while
unfinished and in the history (`tock_history_jobs`) once finished, so every read here
covers both tables in one statement: a job moving meanwhile is seen on exactly one side.
"""

from shared.store.columns import ATTEMPT_COLUMNS, JOB_COLUMNS, NOW
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

INSERT_JOBS = f"""
INSERT INTO tock_jobs (id, kind, queue, payload, priority, run_at, max_attempts,
                       timeout_seconds, unique_key, tenant, concurrency_key)
OVERRIDING SYSTEM VALUE
SELECT t.id, t.kind, t.queue, t.payload::jsonb, t.priority,
       coalesce(t.at, {NOW} + make_interval(secs => t.delay)),
       t.max_attempts, t.timeout_seconds, t.unique_key, t.tenant, t.concurrency_key
-- Ids in input order (the due order breaks ties by id, so a batch keeps its order) ...
FROM (SELECT nextval(pg_get_serial_sequence('tock_jobs', 'id')) AS id, u.*
      FROM unnest(%(kind)s::text[], %(queue)s::text[], %(payload)s::text[],
                  %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                  %(max_attempts)s::int[], %(timeout_seconds)s::float8[],
                  %(unique_key)s::text[], %(tenant)s::text[], %(concurrency_key)s::text[])
           WITH ORDINALITY
           AS u(kind, queue, payload, priority, at, delay, max_attempts, timeout_seconds,
                unique_key, tenant, concurrency_key, ord)
      ORDER BY u.ord) t
-- ... but rows inserted in key order: each key is locked (tock_keys, the unique index) as
-- its row goes in, so two batches sharing keys in different orders would each hold a key
-- the other waits for, and one would fail with a deadlock. Jobs without a key come last,
-- in input order, which the client relies on to match them to its input.
ORDER BY t.unique_key, t.ord
-- A key already taken inserts nothing (even by a row another transaction is inserting right
-- now: we wait for it), and the caller reads the existing job. The authority is tock_keys
-- (the trigger tock_jobs_claim_key, migration 0007), which holds the key of a finished job
-- too; the unique index still covers rows of producers of earlier versions.
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
RETURNING {JOB_COLUMNS}
"""

SELECT_JOBS_BY_KEY = f"""
SELECT {JOB_COLUMNS} FROM tock_jobs WHERE unique_key = ANY(%(keys)s)
UNION ALL
SELECT {JOB_COLUMNS} FROM tock_history_jobs WHERE unique_key = ANY(%(keys)s)
"""

# Keys whose job is gone: its history partition was detached past retention and the
# retention loop has not yet freed its keys (see retention_sql). Deleted only when no job
# holds the key on either side, in one snapshot, so a job moving meanwhile keeps its key.
RECLAIM_KEYS = """
DELETE FROM tock_keys k
WHERE k.unique_key = ANY(%(keys)s)
  AND NOT EXISTS (SELECT 1 FROM tock_jobs j WHERE j.unique_key = k.unique_key)
  AND NOT EXISTS (SELECT 1 FROM tock_history_jobs h WHERE h.unique_key = k.unique_key)
RETURNING k.unique_key
"""

# LIMIT 1: the hot table answers first and, holding the job, spares the history's probes.
# A running job's lease hangs off its worker's row (one heartbeat per worker renews them
# all), so its own lease_expires_at is only the floor the claim set: the lease in force is
# the later of the two, unless the job was detached (then its own lease is the one).
_LEASE_IN_FORCE = ("CASE WHEN j.state <> 'running' OR j.lease_detached "
                   "OR w.lease_expires_at IS NULL "
                   "THEN j.lease_expires_at "
                   "ELSE greatest(j.lease_expires_at, w.lease_expires_at) END")
_HOT_JOB_COLUMNS = ", ".join(_LEASE_IN_FORCE if c == "lease_expires_at" else f"j.{c}"
                             for c in JOB_COLUMNS.split(", "))

SELECT_JOB = f"""
SELECT {_HOT_JOB_COLUMNS} FROM tock_jobs j
LEFT JOIN tock_workers w ON w.id = j.lease_owner
WHERE j.id = %(id)s
UNION ALL
SELECT {JOB_COLUMNS} FROM tock_history_jobs WHERE id = %(id)s
LIMIT 1
"""

SELECT_ATTEMPTS = f"""
SELECT {ATTEMPT_COLUMNS} FROM (
    SELECT id, {ATTEMPT_COLUMNS} FROM tock_attempts WHERE job_id = %(id)s
    UNION ALL
    SELECT id, {ATTEMPT_COLUMNS} FROM tock_history_attempts WHERE job_id = %(id)s
) a ORDER BY id
"""

# An unfinished job is cancelled by moving it to the history (unless it is older than
# migration 0007 and its key has no row yet: then in place, and the retention loop moves it).
# A running job's handler keeps its concurrency slot until it returns (lingering_sql).
_UNFINISHED = "('scheduled', 'retrying', 'dispatched', 'running')"
_CANCELLED = {"state": "'cancelled'::tock_job_state", "finished_at": NOW, "updated_at": NOW}

CANCEL_JOB = f"""
WITH upd AS (
    UPDATE tock_jobs j
    SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}
    WHERE j.id = %(id)s AND j.state IN {_UNFINISHED} AND NOT {movable("j")}
    RETURNING {JOB_COLUMNS}
), gone AS (
    DELETE FROM tock_jobs j
    WHERE j.id = %(id)s AND j.state IN {_UNFINISHED} AND {movable("j")}
    RETURNING {final_row("j", _CANCELLED)}, j.state::text AS prev_state
), {to_history("gone")}, {cancelled_attempt("gone")}, {cancelled_running("gone")}
SELECT {JOB_COLUMNS} FROM upd UNION ALL SELECT {JOB_COLUMNS} FROM gone
"""

# A retried job starts its attempt count again; its history keeps the earlier attempts.
# From the history it moves back to the hot table with its id and its attempts; a job
# finished before migration 0007 (still in tock_jobs) is updated in place.
RETRY_JOB = f"""
WITH upd AS (
    UPDATE tock_jobs
    SET state = 'scheduled', {RETRIED_SET}
    WHERE id = %(id)s AND state IN ('dead', 'cancelled')
    RETURNING {JOB_COLUMNS}
), gone AS (
    DELETE FROM tock_history_jobs h
    WHERE h.id = %(id)s AND h.state IN ('dead', 'cancelled')
    RETURNING h.*
), {back_to_hot("gone", JOB_COLUMNS)}, {from_history("gone")}
SELECT * FROM upd UNION ALL SELECT * FROM back
"""

NOTIFY_DUE = "SELECT pg_notify('tock_due', '')"
