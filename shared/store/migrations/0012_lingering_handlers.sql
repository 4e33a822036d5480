-- Handlers still running for jobs their worker no longer holds: the job was cancelled by an
-- operator, or its handler ran past its deadline by more than a lease and the job was
-- detached to be recovered elsewhere, or the lease was lost to a takeover. The job row has
-- moved on (cancelled, retrying, running elsewhere), but the handler is still busy on the
-- worker, so it keeps its concurrency slot: the limit counts these rows beside the jobs in
-- flight, until the handler returns, its worker stops, or a timer finds its worker dead.
--
-- Written by the cancel itself (so no slot is free for a moment), by the worker's
-- heartbeat, which also deletes the rows of handlers that have returned, and by a stopping
-- worker for the jobs it gives back while their handlers still run (until it stops). A
-- row's worker going away (its row pruned) takes the row with it.
--
-- A row is one claim's handler: its dispatch token, unique to the claim. Neither the job id
-- nor its attempt is (a stuck handler's job can be retried onto the same worker beside it,
-- and a retried job counts its attempts from 1 again).
CREATE TABLE tock_lingering (
    worker          text NOT NULL REFERENCES tock_workers (id) ON DELETE CASCADE,
    job_id          bigint NOT NULL,
    attempt         integer NOT NULL,
    token           uuid NOT NULL,   -- the claim's dispatch token
    kind            text NOT NULL,
    tenant          text NOT NULL,   -- coalesce(tenant, ''), as the limits key tenants
    concurrency_key text,
    reason          text NOT NULL CHECK (reason IN ('cancelled', 'stuck', 'lease_lost',
                                                'released')),
    since           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker, token)
);
