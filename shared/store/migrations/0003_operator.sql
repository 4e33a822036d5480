-- Indexes for the operator surface (dashboard, `tock jobs`, cluster gauges).
-- Every index here costs a little on each state transition (a state change is never a HOT
-- update), so only filters and windows that operators use constantly get one.

-- Job list filtered by queue or tenant, newest first (keyset on id).
CREATE INDEX tock_jobs_queue_idx ON tock_jobs (queue, id);
CREATE INDEX tock_jobs_tenant_idx ON tock_jobs (tenant, id) WHERE tenant IS NOT NULL;

-- Throughput and latency of the last minutes: jobs and attempts finished in a time window.
CREATE INDEX tock_jobs_finished_idx ON tock_jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX tock_attempts_finished_idx ON tock_attempts (finished_at);
