-- History out of the hot table. A job that finishes (succeeded, dead, cancelled) leaves
-- tock_jobs, with its attempts, for tables partitioned first by its final state (LIST) and
-- then by the day it finished (RANGE on finished_at, UTC days), so that each final state
-- keeps its own retention and a day past it is dropped whole: no DELETE, no VACUUM. The
-- hot table keeps only unfinished work, so its indexes and its visibility map stay small.
--
-- This migration only creates: existing finished rows are moved by the timer's retention
-- loop afterwards, in bounded batches (timer_service/retention.py), so upgrading never
-- holds a lock on a big tock_jobs. Every lock taken here lasts milliseconds.

-- --- keys -------------------------------------------------------------------------------
-- The authority for idempotency keys across the hot table and the history: a key stays
-- here, untouched, while its job moves in either direction, so no moment exists in which
-- neither table holds it. Removed only when the partition holding the job is dropped.
CREATE TABLE tock_keys (
    unique_key text PRIMARY KEY,
    job_id     bigint NOT NULL
);

-- Every insert into tock_jobs takes its key here first, whoever inserts (this version's
-- producers and timers, a producer of an earlier version during a rolling upgrade, a
-- script): a key already taken skips the row exactly as ON CONFLICT DO NOTHING would
-- (BEFORE ROW returning NULL), and the caller reads the existing job. The PRIMARY KEY
-- makes a concurrent insert of the same key wait for the first one's commit.
CREATE FUNCTION tock_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A job inserted before this migration holds its key in tock_jobs only (its row here
    -- is written when it moves); the unique index would refuse this row anyway.
    IF EXISTS (SELECT 1 FROM tock_jobs WHERE unique_key = NEW.unique_key) THEN
        RETURN NULL;
    END IF;
    INSERT INTO tock_keys (unique_key, job_id) VALUES (NEW.unique_key, NEW.id)
    ON CONFLICT (unique_key) DO NOTHING;
    -- Taken: by this very job (a retry bringing it back from the history), or another.
    IF FOUND OR EXISTS (SELECT 1 FROM tock_keys
                        WHERE unique_key = NEW.unique_key AND job_id = NEW.id) THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tock_jobs_claim_key BEFORE INSERT ON tock_jobs
    FOR EACH ROW WHEN (NEW.unique_key IS NOT NULL) EXECUTE FUNCTION tock_claim_key();

-- --- history ----------------------------------------------------------------------------
-- The columns of tock_jobs, in its order; finished_at is the partition key, so NOT NULL.
CREATE TABLE tock_history_jobs (
    id                bigint NOT NULL,
    kind              text NOT NULL,
    queue             text NOT NULL,
    payload           jsonb NOT NULL,
    priority          smallint NOT NULL,
    state             tock_job_state NOT NULL,
    run_at            timestamptz NOT NULL,
    attempt           integer NOT NULL,
    max_attempts      integer,
    timeout_seconds   double precision,
    unique_key        text,
    tenant            text,
    lease_owner       text,
    lease_expires_at  timestamptz,
    dispatch_token    uuid,
    dispatched_at     timestamptz,
    last_error        text,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz NOT NULL,
    schedule_name     text,
    dispatch_failures integer NOT NULL,
    lease_detached    boolean NOT NULL,
    -- A unique constraint on a partitioned table must hold its partition keys; id leads,
    -- so this index also serves lookups by id and the keyset order of the job list.
    PRIMARY KEY (id, state, finished_at)
) PARTITION BY LIST (state);

-- The operator filters (the same as the hot table's), the key lookups, schedule runs, and
-- the timeline's window on finished_at. History is appended in finished_at order, so a
-- BRIN index is nearly free to maintain and narrows "the last ten minutes" to a few pages.
CREATE INDEX tock_history_jobs_kind_idx ON tock_history_jobs (kind, id);
CREATE INDEX tock_history_jobs_queue_idx ON tock_history_jobs (queue, id);
CREATE INDEX tock_history_jobs_tenant_idx ON tock_history_jobs (tenant, id)
    WHERE tenant IS NOT NULL;
CREATE INDEX tock_history_jobs_key_idx ON tock_history_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
CREATE INDEX tock_history_jobs_schedule_idx ON tock_history_jobs (schedule_name, run_at, id)
    WHERE schedule_name IS NOT NULL;
CREATE INDEX tock_history_jobs_finished_idx ON tock_history_jobs USING brin (finished_at)
    WITH (autosummarize = on);

-- Attempts carry their job's final state and finished_at, so they sit in the partition of
-- the same (state, day) and are dropped with it. Ids continue tock_attempts' sequence, so
-- a job's attempts keep their order wherever they are.
CREATE TABLE tock_history_attempts (
    id              bigint NOT NULL DEFAULT nextval('tock_attempts_id_seq'),
    job_id          bigint NOT NULL,
    attempt         integer NOT NULL,
    worker          text,
    started_at      timestamptz,
    finished_at     timestamptz NOT NULL,
    outcome         tock_attempt_outcome NOT NULL,
    error           text,
    traceback       text,
    job_state       tock_job_state NOT NULL,
    job_finished_at timestamptz NOT NULL
) PARTITION BY LIST (job_state);

CREATE INDEX tock_history_attempts_job_idx ON tock_history_attempts (job_id, id);
CREATE INDEX tock_history_attempts_finished_idx ON tock_history_attempts
    USING brin (job_finished_at) WITH (autosummarize = on);

-- One partition per final state, each split by day. The DEFAULT partitions catch a row
-- whose day has no partition (the retention loop was not running, a clock far off), so
-- writing an outcome never fails for want of a partition; the loop moves such rows into
-- the day's partition when it creates it, and deletes them once past retention.
CREATE TABLE tock_history_jobs_succeeded PARTITION OF tock_history_jobs
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE tock_history_jobs_dead PARTITION OF tock_history_jobs
    FOR VALUES IN ('dead') PARTITION BY RANGE (finished_at);
CREATE TABLE tock_history_jobs_cancelled PARTITION OF tock_history_jobs
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE tock_history_jobs_succeeded_default PARTITION OF tock_history_jobs_succeeded
    DEFAULT;
CREATE TABLE tock_history_jobs_dead_default PARTITION OF tock_history_jobs_dead DEFAULT;
CREATE TABLE tock_history_jobs_cancelled_default PARTITION OF tock_history_jobs_cancelled
    DEFAULT;

CREATE TABLE tock_history_attempts_succeeded PARTITION OF tock_history_attempts
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (job_finished_at);
CREATE TABLE tock_history_attempts_dead PARTITION OF tock_history_attempts
    FOR VALUES IN ('dead') PARTITION BY RANGE (job_finished_at);
CREATE TABLE tock_history_attempts_cancelled PARTITION OF tock_history_attempts
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (job_finished_at);
CREATE TABLE tock_history_attempts_succeeded_default PARTITION OF
    tock_history_attempts_succeeded DEFAULT;
CREATE TABLE tock_history_attempts_dead_default PARTITION OF tock_history_attempts_dead
    DEFAULT;
CREATE TABLE tock_history_attempts_cancelled_default PARTITION OF
    tock_history_attempts_cancelled DEFAULT;

-- The day partitions of one final state (jobs and attempts): tock_history_jobs_dead_p20261202
-- holds the dead jobs that finished on 2026-12-02 (UTC). Built apart and then attached:
-- ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which no reader or writer waits for
-- (CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE). Rows of that day already in
-- the DEFAULT partition move in first (ATTACH refuses while the default holds any).
-- Returns false when the partition exists. The retention loop calls it for today and the
-- next days, and for the days of the rows it moves.
CREATE FUNCTION tock_history_partition(final tock_job_state, day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    suffix text := final::text || '_p' || to_char(day, 'YYYYMMDD');
    jobs   text := 'tock_history_jobs_' || suffix;
    atts   text := 'tock_history_attempts_' || suffix;
    lo     timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi     timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF final NOT IN ('succeeded', 'dead', 'cancelled') THEN
        RAISE EXCEPTION 'state % is not final: it has no history', final;
    END IF;
    IF to_regclass(jobs) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- No row may reach the DEFAULT partitions between the adoption below and the ATTACH
    -- (another timer moving rows of this day): ATTACH would then refuse. EXCLUSIVE lets
    -- readers through; writers of the default (rare: rows without a day partition) wait.
    EXECUTE format('LOCK TABLE %I, %I IN EXCLUSIVE MODE',
                   'tock_history_jobs_' || final || '_default',
                   'tock_history_attempts_' || final || '_default');
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)',
                   jobs, 'tock_history_jobs_' || final);
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)',
                   atts, 'tock_history_attempts_' || final);
    EXECUTE format('WITH m AS (DELETE FROM %I WHERE finished_at >= $1 AND finished_at < $2 '
                   'RETURNING *) INSERT INTO %I SELECT * FROM m',
                   'tock_history_jobs_' || final || '_default', jobs) USING lo, hi;
    EXECUTE format('WITH m AS (DELETE FROM %I WHERE job_finished_at >= $1 '
                   'AND job_finished_at < $2 RETURNING *) INSERT INTO %I SELECT * FROM m',
                   'tock_history_attempts_' || final || '_default', atts) USING lo, hi;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   'tock_history_jobs_' || final, jobs, lo, hi);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   'tock_history_attempts_' || final, atts, lo, hi);
    RETURN true;
END
$$;

-- A day past retention: its jobs partition is detached and renamed tock_expired_jobs_...,
-- which takes its jobs out of every read at once; its attempts partition is dropped. The
-- retention loop then frees the expired jobs' keys in bounded batches and drops the table.
-- Detaching takes ACCESS EXCLUSIVE on the state's parent for an instant: the caller sets
-- a short lock_timeout and tries again on its next pass rather than queue writers behind it.
CREATE FUNCTION tock_expire_history_partition(final tock_job_state, day date)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    suffix text := final::text || '_p' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass('tock_history_jobs_' || suffix) IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I',
                   'tock_history_jobs_' || final, 'tock_history_jobs_' || suffix);
    EXECUTE format('ALTER TABLE %I RENAME TO %I',
                   'tock_history_jobs_' || suffix, 'tock_expired_jobs_' || suffix);
    EXECUTE format('DROP TABLE IF EXISTS %I', 'tock_history_attempts_' || suffix);
    RETURN true;
END
$$;

-- The first days: today (UTC) and the next two, for every final state.
SELECT tock_history_partition(s.final, d.day::date)
FROM unnest(ARRAY['succeeded', 'dead', 'cancelled']::tock_job_state[]) AS s(final)
CROSS JOIN generate_series((now() AT TIME ZONE 'UTC')::date,
                           (now() AT TIME ZONE 'UTC')::date + 2, interval '1 day') AS d(day);

-- --- reading both ------------------------------------------------------------------------
-- Every job and every attempt, wherever it is now: for psql and scripts (tock itself reads
-- the two tables in one statement, which is what makes a move invisible to a reader).
CREATE VIEW tock_jobs_all AS
    SELECT id, kind, queue, payload, priority, state, run_at, attempt, max_attempts,
           timeout_seconds, unique_key, tenant, lease_owner, lease_expires_at, dispatch_token,
           dispatched_at, last_error, created_at, updated_at, started_at, finished_at,
           schedule_name, dispatch_failures, lease_detached
    FROM tock_jobs
    UNION ALL
    SELECT id, kind, queue, payload, priority, state, run_at, attempt, max_attempts,
           timeout_seconds, unique_key, tenant, lease_owner, lease_expires_at, dispatch_token,
           dispatched_at, last_error, created_at, updated_at, started_at, finished_at,
           schedule_name, dispatch_failures, lease_detached
    FROM tock_history_jobs;

CREATE VIEW tock_attempts_all AS
    SELECT id, job_id, attempt, worker, started_at, finished_at, outcome, error, traceback
    FROM tock_attempts
    UNION ALL
    SELECT id, job_id, attempt, worker, started_at, finished_at, outcome, error, traceback
    FROM tock_history_attempts;

-- --- pruning ------------------------------------------------------------------------------
-- Audit records are pruned by age (TOCK_RETENTION_AUDIT_HOURS), oldest first.
CREATE INDEX tock_schedule_audit_recorded_idx ON tock_schedule_audit (recorded_at);
