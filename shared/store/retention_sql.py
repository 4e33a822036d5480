"""The statements of the timer's retention loop (timer_service/retention.py): day partitions
of the history created ahead and expired whole, finished rows left in tock_jobs moved in
bounded batches, expired keys freed, stopped workers and old audit records pruned.

Every batch is bounded by a LIMIT and takes its rows with SKIP LOCKED, so several timers
share the work; the partition DDL runs one timer at a time under an advisory lock taken
with `pg_try_advisory_xact_lock` (the DDL's SKIP LOCKED: a timer that does not get it does
the rest of its pass). None of it touches a row the dispatcher or a consumer works on.
"""

from psycopg import sql as pgsql

from shared.store.columns import NOW
from shared.store.history_sql import final_row, to_history

PARTITIONS_AHEAD_DAYS = 2
"""Day partitions exist from today (UTC) to today + this: migration 0007 makes the first
ones, the retention loop the next."""

DB_NOW = f"SELECT {NOW}"

DDL_LOCK = 0x746F636B68  # "tockh": the history's partition DDL
TRY_DDL_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"

SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s::int || 'ms', true)"

# The partition functions of migration 0007 (create: built apart, filled from the DEFAULT
# partition, attached; expire: detached and renamed tock_expired_jobs_..., attempts dropped).
ENSURE_PARTITION = ("SELECT tock_history_partition(%(state)s::tock_job_state, "
                    "%(day)s::date)")
EXPIRE_PARTITION = ("SELECT tock_expire_history_partition(%(state)s::tock_job_state, "
                    "%(day)s::date)")

# The day partitions of the jobs history, by name (tock_history_jobs_<state>_pYYYYMMDD).
DAY_PARTITIONS = r"""
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent IN ('tock_history_jobs_succeeded'::regclass,
                      'tock_history_jobs_dead'::regclass,
                      'tock_history_jobs_cancelled'::regclass)
  AND c.relname ~ '_p[0-9]{8}$'
ORDER BY c.relname
"""

# Detached day partitions whose keys are still being freed.
EXPIRED_TABLES = r"""
SELECT relname FROM pg_class
WHERE relkind = 'r' AND relname ~ '^tock_expired_jobs_(succeeded|dead|cancelled)_p[0-9]{8}$'
ORDER BY relname
"""

# --- finished rows still in tock_jobs (before migration 0007, or written by a process of an
# earlier version during an upgrade) ---------------------------------------------------------

# The UTC days the next batch would go to, so their partitions exist before it moves.
FINISHED_DAYS = """
SELECT DISTINCT (coalesce(finished_at, updated_at) AT TIME ZONE 'UTC')::date FROM (
    SELECT finished_at, updated_at FROM tock_jobs WHERE state = %(state)s::tock_job_state
    ORDER BY id LIMIT %(limit)s
) b
"""

# Lock a batch (the state index, in id order; SKIP LOCKED: another timer takes the next)
# and give each keyed job its key's row, pointing at it. A statement of its own, before the
# move: a producer inserting one of these keys meanwhile either waits for this commit and
# finds the key taken, or took it first and is not waiting for us (the job row is only
# locked, not deleted, until the next statement), so neither waits for the other.
PICK_FINISHED = """
WITH picked AS (
    SELECT id, unique_key FROM tock_jobs WHERE state = %(state)s::tock_job_state
    ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), keys AS (
    INSERT INTO tock_keys (unique_key, job_id)
    SELECT unique_key, id FROM picked WHERE unique_key IS NOT NULL
    ON CONFLICT (unique_key) DO UPDATE SET job_id = EXCLUDED.job_id
    WHERE tock_keys.job_id <> EXCLUDED.job_id
)
SELECT id FROM picked
"""

# The locked batch: a job whose day is still kept goes to the history with its attempts;
# one whose day is past retention is deleted (its attempts by the foreign key's cascade)
# and its key freed. finished_at is never NULL in the history (its partition key).
MOVE_FINISHED = f"""
WITH gone AS (
    DELETE FROM tock_jobs j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('succeeded', 'dead', 'cancelled')
    RETURNING {final_row("j", {"finished_at": "coalesce(j.finished_at, j.updated_at)"})}
), kept AS (
    SELECT * FROM gone
    WHERE finished_at >= CASE state WHEN 'succeeded' THEN %(keep_succeeded)s::timestamptz
                                    WHEN 'dead' THEN %(keep_dead)s::timestamptz
                                    ELSE %(keep_cancelled)s::timestamptz END
), {to_history("kept")}, freed AS (
    DELETE FROM tock_keys k USING gone g
    WHERE k.unique_key = g.unique_key AND k.job_id = g.id
      AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.id = g.id)
)
SELECT (SELECT count(*) FROM kept), (SELECT count(*) FROM gone)
"""


def prune_expired(table: str) -> pgsql.Composed:
    """Free the keys of a batch of an expired table's keyed jobs (deleting those rows, so
    the next batch starts past them); the caller drops the table once none is left. In
    key order: the partial key index it inherited walks past the rows already done."""
    return pgsql.SQL("""
WITH batch AS (
    DELETE FROM {t} e
    WHERE e.ctid = ANY(ARRAY(SELECT ctid FROM {t} WHERE unique_key IS NOT NULL
                             ORDER BY unique_key LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING e.id, e.unique_key
), freed AS (
    DELETE FROM tock_keys k USING batch b WHERE k.unique_key = b.unique_key AND k.job_id = b.id
)
SELECT count(*) FROM batch
""").format(t=pgsql.Identifier(table))


def drop_expired(table: str) -> pgsql.Composed:
    """An expired table goes once its keys are freed (nothing refers to it any more)."""
    return pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(table))


def sweep_default(state: str) -> pgsql.Composed:
    """Delete a batch of a DEFAULT partition's rows whose day is past retention (rows that
    found no day partition), with their attempts and keys."""
    jobs = pgsql.Identifier(f"tock_history_jobs_{state}_default")
    attempts = pgsql.Identifier(f"tock_history_attempts_{state}_default")
    return pgsql.SQL("""
WITH gone AS (
    DELETE FROM {jobs} d
    WHERE d.ctid = ANY(ARRAY(SELECT ctid FROM {jobs} WHERE finished_at < %(keep_from)s
                             LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.unique_key, d.finished_at
), attempts AS (
    DELETE FROM {attempts} a USING gone g
    WHERE a.job_id = g.id AND a.job_finished_at = g.finished_at
), freed AS (
    DELETE FROM tock_keys k USING gone g WHERE k.unique_key = g.unique_key AND k.job_id = g.id
)
SELECT count(*) FROM gone
""").format(jobs=jobs, attempts=attempts)


# --- workers and audit records ------------------------------------------------------------

# Stopped, or silent, for longer than the retention, and holding no running job (the
# owner index): a worker that comes back simply inserts its row again with its next beat.
PRUNE_WORKERS = """
WITH gone AS (
    DELETE FROM tock_workers WHERE id IN (
        SELECT w.id FROM tock_workers w
        WHERE coalesce(w.stopped_at, w.last_heartbeat) < %(cutoff)s
          AND NOT EXISTS (SELECT 1 FROM tock_jobs j
                          WHERE j.state = 'running' AND j.lease_owner = w.id)
        ORDER BY coalesce(w.stopped_at, w.last_heartbeat)
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone
"""

PRUNE_AUDIT = """
WITH gone AS (
    DELETE FROM tock_schedule_audit WHERE id IN (
        SELECT id FROM tock_schedule_audit WHERE recorded_at < %(cutoff)s
        ORDER BY recorded_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
