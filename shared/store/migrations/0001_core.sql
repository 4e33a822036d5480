-- Core schema: jobs, their attempt history, and the workers that run them.

CREATE TYPE tock_job_state AS ENUM (
    'scheduled', 'retrying', 'dispatched', 'running', 'succeeded', 'dead', 'cancelled'
);

CREATE TYPE tock_attempt_outcome AS ENUM (
    'succeeded', 'failed', 'timed_out', 'permanent', 'no_handler', 'lease_expired', 'released'
);

CREATE TABLE tock_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text NOT NULL,
    queue            text NOT NULL DEFAULT 'default',
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority         smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    state            tock_job_state NOT NULL DEFAULT 'scheduled',
    run_at           timestamptz NOT NULL,
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- NULL: the task's default, written in at claim time by the consumer that knows the task.
    max_attempts     integer CHECK (max_attempts >= 1),
    timeout_seconds  double precision CHECK (timeout_seconds > 0),
    unique_key       text,
    tenant           text,
    lease_owner      text,
    lease_expires_at timestamptz,
    -- New on every dispatch: a message carrying an older token can claim nothing.
    dispatch_token   uuid,
    dispatched_at    timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);

-- The due scan walks one priority level at a time in run_at order (see sql.CLAIM_DUE),
-- so far-future rows at a higher priority never sit in front of due ones.
CREATE INDEX tock_jobs_due_idx ON tock_jobs (priority, run_at)
    WHERE state IN ('scheduled', 'retrying');
CREATE INDEX tock_jobs_lease_idx ON tock_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX tock_jobs_dispatched_idx ON tock_jobs (dispatched_at) WHERE state = 'dispatched';
CREATE UNIQUE INDEX tock_jobs_unique_key_idx ON tock_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
-- Listing and filtering for operators: newest first within a kind or state.
CREATE INDEX tock_jobs_kind_idx ON tock_jobs (kind, id);
CREATE INDEX tock_jobs_state_idx ON tock_jobs (state, id);

-- One row per finished attempt, so a job's story can be told later. The attempt in
-- progress is described by the job row itself (lease_owner, started_at).
CREATE TABLE tock_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint NOT NULL REFERENCES tock_jobs (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    worker      text,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL,
    outcome     tock_attempt_outcome NOT NULL,
    error       text,
    traceback   text
);
CREATE INDEX tock_attempts_job_idx ON tock_attempts (job_id, id);

-- Consumers announce themselves here on each heartbeat.
CREATE TABLE tock_workers (
    id             text PRIMARY KEY,
    host           text NOT NULL,
    pid            integer NOT NULL,
    queues         text[] NOT NULL,
    concurrency    integer NOT NULL,
    in_flight      integer NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now(),
    stopped_at     timestamptz
);

-- Wake the timers when work that is due soon is inserted. NOTIFY is delivered at commit, so a
-- rolled-back enqueue wakes nobody; one notification per statement, however many rows.
CREATE FUNCTION tock_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE run_at <= now() + interval '60 seconds') THEN
        PERFORM pg_notify('tock_due', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tock_jobs_notify_due AFTER INSERT ON tock_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tock_notify_due();
