-- Concurrency limits per (kind, key): "at most N running per account of kind sync", the
-- key being whatever the producer passes as schedule(concurrency_key=...).

ALTER TABLE tock_jobs ADD COLUMN concurrency_key text;
ALTER TABLE tock_history_jobs ADD COLUMN concurrency_key text;

-- The timer walks the keys with due work of one (kind, tenant) at a level, one probe per
-- key, and takes each key's oldest jobs. Partial: jobs without a key cost nothing here.
-- Newest first within a key, as tock_jobs_fair_idx (0010): the walk's probes land on live
-- rows, not on the dead entries the claimed ones leave until vacuum.
CREATE INDEX tock_jobs_key_due_idx
    ON tock_jobs (kind, priority, (coalesce(tenant, '')), concurrency_key, run_at DESC,
                  id DESC)
    WHERE concurrency_key IS NOT NULL AND state IN ('scheduled', 'retrying');

-- Jobs holding a slot of their key, counted per (kind, key).
CREATE INDEX tock_jobs_key_in_flight_idx ON tock_jobs (kind, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('dispatched', 'running');

-- scope 'kind_key': key is the kind; max_running applies to each of its concurrency keys.
ALTER TABLE tock_limits DROP CONSTRAINT tock_limits_scope_check;
ALTER TABLE tock_limits ADD CONSTRAINT tock_limits_scope_check
    CHECK (scope IN ('kind', 'tenant', 'kind_key'));
ALTER TABLE tock_limits ADD CONSTRAINT tock_limits_kind_key_check
    CHECK (scope <> 'kind_key' OR (max_running IS NOT NULL AND rate IS NULL));

CREATE OR REPLACE VIEW tock_jobs_all AS
    SELECT id, kind, queue, payload, priority, state, run_at, attempt, max_attempts,
           timeout_seconds, unique_key, tenant, lease_owner, lease_expires_at, dispatch_token,
           dispatched_at, last_error, created_at, updated_at, started_at, finished_at,
           schedule_name, dispatch_failures, lease_detached, concurrency_key
    FROM tock_jobs
    UNION ALL
    SELECT id, kind, queue, payload, priority, state, run_at, attempt, max_attempts,
           timeout_seconds, unique_key, tenant, lease_owner, lease_expires_at, dispatch_token,
           dispatched_at, last_error, created_at, updated_at, started_at, finished_at,
           schedule_name, dispatch_failures, lease_detached, concurrency_key
    FROM tock_history_jobs;
