-- One heartbeat row per worker: a running job's lease is its worker's, so a heartbeat
-- writes one row however many jobs the worker runs, instead of one row per job.
--   a job's lease holds while   now <= its own lease_expires_at (set by the claim)
--                           or  now <= its worker's lease_expires_at (set by each beat),
--   unless the job is detached from its worker (a handler stuck past its deadline), when
--   only its own lease_expires_at counts.
ALTER TABLE tock_workers ADD COLUMN lease_expires_at timestamptz;
UPDATE tock_workers SET lease_expires_at = last_heartbeat WHERE stopped_at IS NULL;
ALTER TABLE tock_jobs ADD COLUMN lease_detached boolean NOT NULL DEFAULT false;

-- The rescuer finds expired leases by worker: the distinct owners of running jobs (a
-- loose index scan), those whose worker lease ran out, and their jobs; detached jobs by
-- their own expiry. The old per-job expiry index was updated by every heartbeat.
CREATE INDEX tock_jobs_owner_idx ON tock_jobs (lease_owner) WHERE state = 'running';
CREATE INDEX tock_jobs_detached_idx ON tock_jobs (lease_expires_at)
    WHERE state = 'running' AND lease_detached;
DROP INDEX tock_jobs_lease_idx;

-- Leave room on each page, so updates that change no indexed column can stay on the page
-- (HOT): a worker's heartbeat, a job's bookkeeping columns.
ALTER TABLE tock_jobs SET (fillfactor = 85);
ALTER TABLE tock_workers SET (fillfactor = 50);
