-- SQS refusing a job's send (its queue missing, throttling): how many times in a row. The
-- timer puts such a job back with a backoff of its own, so one job on a missing queue never
-- blocks the others, and `explain` can say why it has not left.
ALTER TABLE tock_jobs ADD COLUMN dispatch_failures integer NOT NULL DEFAULT 0;

-- First in, first out among equals: jobs of the same priority and run_at are claimed in id
-- order (jobs_sql.CLAIM_DUE orders by run_at, id).
DROP INDEX tock_jobs_due_idx;
CREATE INDEX tock_jobs_due_idx ON tock_jobs (priority, run_at, id)
    WHERE state IN ('scheduled', 'retrying');
