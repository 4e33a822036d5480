-- Recurring schedules (see shared/schedules.py): one row per schedule, advanced by the timers
-- one slot range at a time, and an audit trail of every slot that did not become a job.

CREATE TYPE tock_schedule_misfire AS ENUM ('skip', 'latest', 'all');
CREATE TYPE tock_schedule_overlap AS ENUM ('allow', 'skip', 'buffer_one');
CREATE TYPE tock_schedule_dst_gap AS ENUM ('shift', 'skip');
CREATE TYPE tock_schedule_dst_fold AS ENUM ('once', 'twice');

CREATE TABLE tock_schedules (
    name                  text PRIMARY KEY,
    kind                  text NOT NULL,
    queue                 text NOT NULL DEFAULT 'default',
    payload               jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority              smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    max_attempts          integer CHECK (max_attempts >= 1),
    timeout_seconds       double precision CHECK (timeout_seconds > 0),
    tenant                text,
    -- Exactly one of cron (local wall time in tz) and every (absolute elapsed time from anchor).
    cron                  text,
    every                 interval CHECK (every >= interval '1 second'),
    anchor                timestamptz,
    tz                    text NOT NULL DEFAULT 'UTC',
    misfire               tock_schedule_misfire NOT NULL DEFAULT 'skip',
    misfire_grace_seconds double precision NOT NULL DEFAULT 60 CHECK (misfire_grace_seconds >= 0),
    backfill_max          integer NOT NULL DEFAULT 100 CHECK (backfill_max >= 1),
    backfill_gap_seconds  double precision NOT NULL DEFAULT 1 CHECK (backfill_gap_seconds >= 0),
    overlap               tock_schedule_overlap NOT NULL DEFAULT 'allow',
    dst_gap               tock_schedule_dst_gap NOT NULL DEFAULT 'shift',
    dst_fold              tock_schedule_dst_fold NOT NULL DEFAULT 'once',
    spread_seconds        double precision NOT NULL DEFAULT 0 CHECK (spread_seconds >= 0),
    jitter_seconds        double precision NOT NULL DEFAULT 0 CHECK (jitter_seconds >= 0),
    paused                boolean NOT NULL DEFAULT false,
    -- Every slot at or before the cursor has been handled (fired or audited).
    cursor_at             timestamptz NOT NULL,
    -- The first slot after the cursor, and when it fires (slot + spread offset): the due index.
    next_slot             timestamptz,
    next_fire_at          timestamptz,
    -- overlap=buffer_one: the one slot waiting for the running job to finish.
    buffered_slot         timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every IS NULL)),
    CHECK (every IS NULL OR anchor IS NOT NULL)
);

CREATE INDEX tock_schedules_due_idx ON tock_schedules (next_fire_at) WHERE NOT paused;
CREATE INDEX tock_schedules_buffered_idx ON tock_schedules (name)
    WHERE buffered_slot IS NOT NULL AND NOT paused;

-- Which schedule made a job: the overlap policies look for its unfinished runs.
ALTER TABLE tock_jobs ADD COLUMN schedule_name text;
CREATE INDEX tock_jobs_schedule_active_idx ON tock_jobs (schedule_name)
    WHERE schedule_name IS NOT NULL
      AND state IN ('scheduled', 'retrying', 'dispatched', 'running');

-- Slots that did not become a job, with the reason; a run of consecutive slots with one reason
-- (an outage of hours) is one row with its first and last slot and how many there were.
CREATE TABLE tock_schedule_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule    text NOT NULL REFERENCES tock_schedules (name) ON DELETE CASCADE,
    reason      text NOT NULL,
    first_slot  timestamptz NOT NULL,
    last_slot   timestamptz NOT NULL,
    -- NULL when the run was too long to count slot by slot (see schedule_policies.MAX_SCAN).
    slot_count  integer CHECK (slot_count >= 1),
    detail      text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CHECK (first_slot <= last_slot)
);
CREATE INDEX tock_schedule_audit_schedule_idx ON tock_schedule_audit (schedule, id);
