-- Handlers still running for jobs their worker no longer holds: the job was cancelled by an
-- operator, or its handler ran past its deadline by more than a lease and the job was
-- detached to be recovered elsewhere, or the lease was lost to a takeover. The job row has
-- moved on (cancelled, retrying, running elsewhere), but the handler is still busy on the
-- worker, so it keeps its concurrency slot: the limit counts these rows beside the jobs in
-- flight, while their worker's lease is alive.
--
-- Written by the cancel itself (so no slot is free for a moment) and by the worker's
-- heartbeat, which also deletes the rows of handlers that have returned. A row's worker
-- going away (its row pruned) takes the row with it.
CREATE TABLE tock_lingering (
    worker          text NOT NULL REFERENCES tock_workers (id) ON DELETE CASCADE,
    job_id          bigint NOT NULL,
    attempt         integer NOT NULL,
    kind            text NOT NULL,
    tenant          text NOT NULL,   -- coalesce(tenant, ''), as the limits key tenants
    concurrency_key text,
    reason          text NOT NULL CHECK (reason IN ('cancelled', 'stuck', 'lease_lost')),
    since           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker, job_id)
);
