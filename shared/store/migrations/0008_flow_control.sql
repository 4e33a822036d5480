-- Flow control at dispatch: fair share between tenants, concurrency and rate limits.

-- The timer walks the (kind, tenant) pairs with due work at a priority level, one index
-- probe per step, and takes each pair's oldest jobs.
CREATE INDEX tock_jobs_fair_idx ON tock_jobs (priority, kind, (coalesce(tenant, '')), run_at, id)
    WHERE state IN ('scheduled', 'retrying');

-- Jobs holding a concurrency slot, counted per kind (and per kind and tenant).
CREATE INDEX tock_jobs_in_flight_idx ON tock_jobs (kind, (coalesce(tenant, '')))
    WHERE state IN ('dispatched', 'running');

-- Weights of tenants (default 1); '' is the tenant of jobs enqueued without one.
CREATE TABLE tock_tenant_weights (
    tenant     text PRIMARY KEY,
    weight     integer NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- At most max_running jobs of a kind (or tenant) dispatched or running at once, and/or
-- at most `rate` dispatches per second from a bucket of `burst` tokens.
CREATE TABLE tock_limits (
    scope       text NOT NULL CHECK (scope IN ('kind', 'tenant')),
    key         text NOT NULL,
    max_running integer CHECK (max_running >= 0),
    rate        double precision CHECK (rate > 0),
    burst       integer CHECK (burst >= 1),
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key),
    CHECK (max_running IS NOT NULL OR rate IS NOT NULL),
    CHECK ((rate IS NULL) = (burst IS NULL))
);
