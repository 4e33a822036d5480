-- Fair share between tenants: the timer walks the tenants with due work at a priority level
-- (one index probe per tenant) and takes each one's oldest jobs, in proportion to weights.
CREATE INDEX tock_jobs_fair_idx ON tock_jobs (priority, (coalesce(tenant, '')), run_at, id)
    WHERE state IN ('scheduled', 'retrying');

-- Weights of tenants (default 1); '' is the tenant of jobs enqueued without one.
CREATE TABLE tock_tenant_weights (
    tenant     text PRIMARY KEY,
    weight     integer NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);
