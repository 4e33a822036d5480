"""Every SQL statement tock runs against its job tables, named, in one place.

Conventions:
- Batch statements join their rows (an unnest) to tock_jobs on the id and compare the state
  they expect as text (`state_is`): the planner then has one way in, a probe of the primary
  key per row of the batch, whatever the statistics say, so the cost per job stays flat
  however many rows are running or dispatched. No `j.id = ANY(%(ids)s)` beside the join:
  that second way in let a generic plan (counting one row there) read the rows first and
  scan the whole batch again for each one, quadratic in the batch (300 outcomes: 29 ms,
  9 without). The claim (CLAIM_MESSAGES) keeps it: its pool forbids nested loops and
  scans (consumer/service.py `CLAIM_PLANNER`), so it is hashed through the primary key.
- Time is a parameter: `coalesce(%(now)s::timestamptz, now())` runs on the database clock
  in production (leases are judged by one clock, not by many hosts') and lets tests pin it.
- Every state transition is one guarded statement. The guard is in the WHERE clause; a
  caller that gets no row back raises a typed error (`LeaseLost`, `StaleMessage`,
  `InvalidTransition`), never carries on silently.
- Batches travel as parallel arrays through `unnest`, so one round trip serves many jobs.
"""

from shared.store.columns import JOB_COLUMNS, NOW, due_since, state_is, unindented
from shared.store.history_sql import FINISHED, final_row, movable, to_history
from shared.store.lingering_sql import FORGET_RETURNED

__all__ = ["JOB_COLUMNS", "NOW"]  # the statement modules' shared names, also from here

# The producer's and the operator's statements on one job (insert, read, cancel, retry)
# are in producer_sql.py: they read and move jobs across the hot table and the history.

# --- timer ---------------------------------------------------------------------------------
# The claim of due jobs is in flow_sql.py (fair share and limits).

# Sends that SQS refused: back to the state they came from, in the claiming transaction,
# and due again only after a backoff of their own (base * 2^failures, capped), so a job
# whose queue is missing waits aside instead of heading every claim.
UNDO_DISPATCH = f"""
UPDATE tock_jobs j
SET state = t.prev_state, dispatch_token = NULL, dispatched_at = NULL,
    last_error = t.error, dispatch_failures = j.dispatch_failures + 1,
    run_at = greatest(j.run_at, {NOW} + make_interval(secs => least(
        %(backoff_cap)s::float8, %(backoff_base)s::float8 * 2 ^ least(j.dispatch_failures, 30)))),
    updated_at = {NOW}
FROM unnest(%(ids)s::bigint[], %(prev_states)s::tock_job_state[], %(errors)s::text[])
     AS t(id, prev_state, error)
WHERE j.id = t.id AND {state_is('j', 'dispatched')}
RETURNING j.id, j.dispatch_failures
"""

# Earliest due time per level, so the timer can sleep until exactly then.
PING = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool"
"""A consumer that lost the database asks this before it receives again: true if the
server takes no writes (a standby, or a primary demoted by a failover)."""

NEXT_DUE_AT = """
SELECT min(n.run_at), clock_timestamp()
FROM generate_series(0, 9) AS p(level)
CROSS JOIN LATERAL (
    SELECT run_at FROM tock_jobs
    WHERE state IN ('scheduled', 'retrying') AND priority = p.level
    ORDER BY run_at LIMIT 1
) n
"""

# The job that falls due next, of the ones not due yet (the due watcher sleeps until then):
# one probe per level of tock_jobs_due_idx, from now on.
NEXT_TO_FALL_DUE = """
SELECT n.run_at, n.priority, n.kind, coalesce(n.tenant, ''), n.queue, clock_timestamp()
FROM generate_series(0, 9) AS p(level)
CROSS JOIN LATERAL (
    SELECT run_at, priority, kind, tenant, queue FROM tock_jobs
    WHERE state IN ('scheduled', 'retrying') AND priority = p.level AND run_at > now()
    ORDER BY run_at LIMIT 1
) n
ORDER BY n.run_at LIMIT 1
"""

# Queues with dispatched jobs nobody claimed for too long: candidates for a lost message.
STUCK_QUEUES = f"""
SELECT queue, count(*) FROM tock_jobs
WHERE state = 'dispatched' AND dispatched_at < {NOW} - make_interval(secs => %(timeout_seconds)s)
GROUP BY queue
"""

# What one SQS queue should hold: a message per dispatched job (not yet claimed), and for a
# running job one in flight unless a redelivered copy was deleted meanwhile. The rescuer
# counts on the dispatched ones only: fewer messages than those means messages were lost.
QUEUE_EXPECTED = """
SELECT count(*) FILTER (WHERE state = 'dispatched'), count(*) FILTER (WHERE state = 'running')
FROM tock_jobs WHERE state IN ('dispatched', 'running') AND queue = %(queue)s
"""

# Dispatched jobs sent before their queue was created: their messages went with the old one.
DISPATCHED_BEFORE = """
SELECT count(*) FROM tock_jobs
WHERE state = 'dispatched' AND queue = %(queue)s AND dispatched_at < %(before)s
"""

# A dispatched job whose message was lost (queue purged or recreated, moved to the DLQ):
# make it due again, oldest first; the next claim gives it a new token, so the old message,
# should it ever arrive, is stale.
REDISPATCH_STUCK = f"""
WITH stuck AS (
    SELECT id FROM tock_jobs
    WHERE state = 'dispatched' AND queue = %(queue)s
      AND dispatched_at < {NOW} - make_interval(secs => %(timeout_seconds)s)
    ORDER BY dispatched_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE tock_jobs j
SET state = CASE WHEN j.attempt > 0 THEN 'retrying'::tock_job_state
                 ELSE 'scheduled'::tock_job_state END,
    dispatch_token = NULL,
    last_error = 'its SQS message was lost (not claimed within ' || %(timeout_seconds)s
                 || ' s, and the queue holds fewer messages than jobs or was created '
                 || 'after it was sent); sent again',
    updated_at = {NOW}
FROM stuck
WHERE j.id = stuck.id
RETURNING j.id
"""

# Running jobs whose lease ran out: both their own (from the claim) and their worker's.
# The owners are found with a loose index scan over the running jobs' owners (one probe
# per distinct worker), so the cost follows the number of workers, not of running jobs.
SELECT_EXPIRED_LEASES = f"""
WITH RECURSIVE owners(owner) AS (
    (SELECT lease_owner FROM tock_jobs WHERE state = 'running' AND lease_owner IS NOT NULL
     ORDER BY lease_owner LIMIT 1)
    UNION ALL
    SELECT (SELECT j.lease_owner FROM tock_jobs j
            WHERE j.state = 'running' AND j.lease_owner > o.owner
            ORDER BY j.lease_owner LIMIT 1)
    FROM owners o WHERE o.owner IS NOT NULL
), stale AS (
    -- A worker's lease runs on while the database is away, when no worker can renew it:
    -- after an outage (since_back: seconds since this timer reached it again) a worker is
    -- stale only once it has had a whole lease of its own to renew and did not.
    SELECT o.owner FROM owners o LEFT JOIN tock_workers w ON w.id = o.owner
    WHERE o.owner IS NOT NULL AND (w.lease_expires_at IS NULL OR (
        w.lease_expires_at < {NOW}
        AND (%(since_back)s::float8 IS NULL
             OR make_interval(secs => %(since_back)s::float8)
                > w.lease_expires_at - w.last_heartbeat)))
)
SELECT j.id, j.attempt, coalesce(j.max_attempts, %(default_max_attempts)s), j.lease_owner,
       j.started_at, greatest(j.lease_expires_at, w.lease_expires_at)
FROM tock_jobs j LEFT JOIN tock_workers w ON w.id = j.lease_owner
WHERE j.state = 'running' AND j.lease_owner IN (SELECT owner FROM stale)
  AND j.lease_expires_at < {NOW}
ORDER BY j.lease_expires_at
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED
"""

# Running jobs detached from their worker (a handler stuck past its deadline) whose own
# lease ran out; not those SELECT_EXPIRED_LEASES found already (`found`: a detached job of a
# worker that died too is in both, and would be rescued, logged and counted twice).
SELECT_EXPIRED_DETACHED = f"""
SELECT id, attempt, coalesce(max_attempts, %(default_max_attempts)s), lease_owner, started_at,
       lease_expires_at
FROM tock_jobs
WHERE state = 'running' AND lease_detached AND lease_expires_at < {NOW}
  AND id <> ALL(%(found)s::bigint[])
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# The rows are locked by the selects above in the same transaction; the guard repeats the
# expiry test (the job's and its worker's), so a heartbeat that won the race keeps its job.
# A job that goes dead leaves for the history (shared/store/history_sql.py) with its
# attempts; the lost attempt is written where the job now is.
_RESCUE_FENCE = f"""j.id = r.id AND {state_is('j', 'running')}
      AND j.attempt = r.attempt AND j.lease_expires_at < {NOW}
      AND (j.lease_detached OR NOT EXISTS (
          SELECT 1 FROM tock_workers w
          WHERE w.id = j.lease_owner AND w.lease_expires_at >= {NOW}))"""

_DEAD = {"state": "r.state", "last_error": "r.error", "lease_owner": "NULL::text",
         "lease_expires_at": "NULL::timestamptz", "lease_detached": "false",
         "finished_at": NOW, "updated_at": NOW}
"""What the rescue writes to a job that goes dead (the columns of the update above)."""

RESCUE_EXPIRED = unindented(f"""
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::tock_job_state[],
                         %(delays)s::float8[], %(errors)s::text[], %(workers)s::text[])
         AS t(id, attempt, state, delay, error, worker)
), upd AS (
    UPDATE tock_jobs j
    SET state = r.state,
        run_at = CASE WHEN r.state = 'retrying' THEN {NOW} + make_interval(secs => r.delay)
                      ELSE j.run_at END,
        last_error = r.error, lease_owner = NULL, lease_expires_at = NULL,
        lease_detached = false,
        finished_at = CASE WHEN r.state = 'dead' THEN {NOW} END, updated_at = {NOW}
    FROM r
    WHERE {_RESCUE_FENCE} AND NOT (r.state = 'dead' AND {movable("j")})
    RETURNING j.id, r.attempt, r.error, j.started_at, r.worker
), gone AS (
    DELETE FROM tock_jobs j USING r
    WHERE {_RESCUE_FENCE} AND r.state = 'dead' AND {movable("j")}
    RETURNING {final_row("j", _DEAD)}, r.attempt AS lost_attempt, r.worker AS lost_worker
), {to_history("gone")}, lost_in_history AS (
    INSERT INTO tock_history_attempts (job_id, attempt, worker, started_at, finished_at,
                                       outcome, error, job_state, job_finished_at)
    SELECT id, lost_attempt, lost_worker, started_at, finished_at, 'lease_expired',
           last_error, state, finished_at FROM gone
), lost AS (
    INSERT INTO tock_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, worker, started_at, {NOW}, 'lease_expired', error FROM upd
)
SELECT id FROM upd UNION ALL SELECT id FROM gone
""")

# --- consumer ---------------------------------------------------------------------------------

# dispatched -> running, matched on the message's job id AND dispatch token: a forged, stale
# or replayed message matches nothing. Task defaults fill max_attempts/timeout left NULL.
CLAIM_MESSAGES = f"""
UPDATE tock_jobs j
SET state = 'running', attempt = j.attempt + 1, lease_owner = %(worker)s,
    lease_expires_at = {NOW} + make_interval(secs => %(lease_seconds)s),
    started_at = {NOW}, updated_at = {NOW}, dispatch_failures = 0, lease_detached = false,
    max_attempts = coalesce(j.max_attempts, m.default_max_attempts),
    timeout_seconds = coalesce(j.timeout_seconds, m.default_timeout_seconds)
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(default_max_attempts)s::int[],
            %(default_timeout_seconds)s::float8[], %(kinds)s::text[], %(queues)s::text[])
     AS m(id, token, default_max_attempts, default_timeout_seconds, kind, queue)
WHERE j.id = m.id AND j.id = ANY(%(ids)s::bigint[]) AND {state_is('j', 'dispatched')}
  AND j.dispatch_token = m.token AND (m.kind IS NULL OR j.kind = m.kind)
  AND (m.queue IS NULL OR j.queue = m.queue)
RETURNING j.id, j.kind, j.payload, j.attempt, j.max_attempts, j.timeout_seconds, j.run_at,
          j.dispatch_token, j.queue, j.tenant, j.unique_key, {NOW} AS claimed_at,
          extract(epoch FROM {NOW} - {due_since('j')})::float8 AS lag_seconds
"""

# The timer sends before it commits: a claim that missed may have raced an uncommitted
# dispatch. Taking the row locks waits for that commit (milliseconds); the claim is then
# retried in the same transaction with a fresh snapshot.
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s::int || 'ms', true)"

WAIT_FOR_DISPATCH_COMMIT = """
SELECT id FROM tock_jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE
"""

# Why a message claimed nothing: for the log line and the counter (a finished job may be
# in the history already).
EXPLAIN_UNCLAIMED = """
SELECT id, state, dispatch_token FROM tock_jobs WHERE id = ANY(%(ids)s)
UNION ALL
SELECT id, state, dispatch_token FROM tock_history_jobs WHERE id = ANY(%(ids)s)
"""

# Where a dispatched job belongs, for a message that names it with its token yet claimed
# nothing (another kind named, or another queue's consumer).
JOB_ROUTES = "SELECT id, kind, queue FROM tock_jobs WHERE id = ANY(%(ids)s)"

# A worker's heartbeat: one row, however many jobs it runs. It refreshes the worker's
# lease (which every job it holds hangs off) and reports which of the leases it believes
# it holds it still holds; the rest were lost (cancelled, or expired and taken over). Of its
# lingering handlers (lingering_sql), those no longer %(running)s have returned: their slots
# are free again.
WORKER_BEAT = f"""
WITH beat AS (
    INSERT INTO tock_workers (id, host, pid, queues, kinds, concurrency, in_flight, started_at,
                              last_heartbeat, lease_expires_at)
    VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(kinds)s, %(concurrency)s, %(in_flight)s,
            {NOW}, {NOW}, {NOW} + make_interval(secs => %(lease_seconds)s))
    ON CONFLICT (id) DO UPDATE
    SET in_flight = EXCLUDED.in_flight, last_heartbeat = EXCLUDED.last_heartbeat,
        lease_expires_at = EXCLUDED.lease_expires_at, kinds = EXCLUDED.kinds, stopped_at = NULL
), {FORGET_RETURNED}
SELECT j.id
FROM tock_jobs j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[], %(tokens)s::uuid[]) AS m(id, attempt, token)
  ON j.id = m.id
WHERE {state_is('j', 'running')} AND j.lease_owner = %(id)s
  AND j.attempt = m.attempt AND j.dispatch_token = m.token AND NOT j.lease_detached
"""

# Of the claims a heartbeat found lost, those an operator cancelled while they ran: the
# job, in the hot table or the history a cancel moves it to, is cancelled under that claim.
CANCELLED_CLAIMS = """
SELECT m.id
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS m(id, token)
WHERE EXISTS (SELECT 1 FROM tock_jobs_all j
              WHERE j.id = m.id AND j.dispatch_token = m.token AND j.state = 'cancelled')
"""

# A consumer's start: take its worker id, unless another process holds it (a row not
# stopped, its lease running, announced by another host or pid: the jobs a worker runs are
# known by its id alone, so two live processes must never share one). Concurrent starts
# with one id serialize on the row; the second sees the first's and takes nothing. A
# container restarted in place (the same host name, pid 1) takes its id back at once.
TAKE_WORKER_ID = f"""
INSERT INTO tock_workers AS w (id, host, pid, queues, kinds, concurrency, in_flight,
                               started_at, last_heartbeat, lease_expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(kinds)s, %(concurrency)s, 0,
        {NOW}, {NOW}, {NOW} + make_interval(secs => %(lease_seconds)s))
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    kinds = EXCLUDED.kinds, concurrency = EXCLUDED.concurrency, in_flight = 0,
    started_at = EXCLUDED.started_at, last_heartbeat = EXCLUDED.last_heartbeat,
    lease_expires_at = EXCLUDED.lease_expires_at, stopped_at = NULL
WHERE w.stopped_at IS NOT NULL OR w.lease_expires_at <= {NOW}
   OR (w.host, w.pid) = (EXCLUDED.host, EXCLUDED.pid)
RETURNING true
"""

WORKER_HOLDER = f"""
SELECT host, pid, last_heartbeat, extract(epoch FROM lease_expires_at - {NOW})::float8
FROM tock_workers WHERE id = %(id)s
"""

# Running jobs a live worker owns in the database but does not hold: a claim that
# committed while its reply was lost with the connection (the consumer saw an error and let
# the message go), or an outcome a database crash took after the consumer moved on. The
# worker's lease, renewed by every beat, would keep them from the rescuer for ever, and
# nothing would finish them: they are detached to expire one lease from now, as a stuck
# handler's job is. Only claims older than %(older_than)s count, so one the worker is still
# registering is not taken for one. tock_jobs_owner_idx: this worker's running rows.
RELEASE_UNTRACKED = f"""
UPDATE tock_jobs j
SET lease_detached = true, lease_expires_at = {NOW} + make_interval(secs => %(lease_seconds)s)
WHERE j.state = 'running' AND j.lease_owner = %(worker)s AND NOT j.lease_detached
  AND j.started_at < {NOW} - make_interval(secs => %(older_than)s)
  AND NOT (j.id = ANY(%(tracked)s::bigint[]))
RETURNING j.id, j.attempt
"""

# A handler stuck past its deadline: its job no longer hangs off the worker's lease, and
# expires one lease from now unless its outcome is written first.
DETACH_LEASE = f"""
UPDATE tock_jobs
SET lease_detached = true, lease_expires_at = {NOW} + make_interval(secs => %(lease_seconds)s)
WHERE id = %(id)s AND {state_is('tock_jobs', 'running')} AND lease_owner = %(worker)s
  AND attempt = %(attempt)s
  AND dispatch_token = %(token)s
RETURNING id
"""

# Kinds some consumer announced within the last day (TOCK_REJECT_UNKNOWN_KINDS).
KNOWN_KINDS = f"""
SELECT DISTINCT k FROM tock_workers, unnest(kinds) AS k
WHERE last_heartbeat > {NOW} - interval '24 hours'
ORDER BY k
"""

# A worker that stops gives up its lease: anything it still holds (a stuck handler) is
# rescued at its own expiry, and its handlers (its threads) end with it.
STOP_WORKER = f"""
WITH gone AS (DELETE FROM tock_lingering WHERE worker = %(id)s)
UPDATE tock_workers SET stopped_at = {NOW}, in_flight = 0, lease_expires_at = {NOW}
WHERE id = %(id)s
"""

# Outcomes of many attempts in one statement, each fenced on (state, owner, attempt, token):
# a worker whose lease expired and was taken over matches nothing and writes nothing.
# `refund` gives the attempt back (a release on shutdown is not a failure). A job that
# finishes (succeeded, dead) is not updated but moved to the history with its attempts
# (history_sql): a delete here (no index entry written) and an insert into a small day
# partition with fewer indexes, instead of an update of every index of the hot table.
_FINISH_FENCE = f"""j.id = r.id AND {state_is('j', 'running')}
      AND j.lease_owner = %(worker)s AND j.attempt = r.attempt AND j.dispatch_token = r.token"""

_FINISHED = {"state": "r.state", "last_error": "coalesce(r.error, j.last_error)",
             "lease_owner": "NULL::text", "lease_expires_at": "NULL::timestamptz",
             "lease_detached": "false", "finished_at": NOW, "updated_at": NOW}
"""What an outcome writes to a job that finishes (the columns of the update above)."""

FINISH_ATTEMPTS = unindented(f"""
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(tokens)s::uuid[],
                         %(states)s::tock_job_state[], %(delays)s::float8[],
                         %(outcomes)s::tock_attempt_outcome[], %(errors)s::text[],
                         %(tracebacks)s::text[], %(refunds)s::bool[])
         AS t(id, attempt, token, state, delay, outcome, error, traceback, refund)
), upd AS (
    UPDATE tock_jobs j
    SET state = r.state,
        attempt = j.attempt - CASE WHEN r.refund THEN 1 ELSE 0 END,
        run_at = CASE WHEN r.state IN ('retrying', 'scheduled')
                      THEN {NOW} + make_interval(secs => r.delay) ELSE j.run_at END,
        last_error = coalesce(r.error, j.last_error),
        lease_owner = NULL, lease_expires_at = NULL, lease_detached = false,
        finished_at = CASE WHEN r.state IN ('succeeded', 'dead') THEN {NOW} END,
        updated_at = {NOW}
    FROM r
    WHERE {_FINISH_FENCE} AND NOT (r.state IN {FINISHED} AND {movable("j")})
    RETURNING j.id, j.started_at
), gone AS (
    DELETE FROM tock_jobs j USING r
    WHERE {_FINISH_FENCE} AND r.state IN {FINISHED} AND {movable("j")}
    RETURNING {final_row("j", _FINISHED)}
), {to_history("gone")}, finished_in_history AS (
    INSERT INTO tock_history_attempts (job_id, attempt, worker, started_at, finished_at,
                                       outcome, error, traceback, job_state, job_finished_at)
    SELECT g.id, r.attempt, %(worker)s, g.started_at, g.finished_at, r.outcome, r.error,
           r.traceback, g.state, g.finished_at
    FROM gone g JOIN r ON r.id = g.id
), finished AS (
    INSERT INTO tock_attempts (job_id, attempt, worker, started_at, finished_at, outcome,
                               error, traceback)
    SELECT upd.id, r.attempt, %(worker)s, upd.started_at, {NOW}, r.outcome, r.error,
           r.traceback
    FROM upd JOIN r ON r.id = upd.id
)
SELECT id FROM upd UNION ALL SELECT id FROM gone
""")
