-- tock_jobs_fair_idx gains the queue after the kind: the timer's fair walk and claim go by
-- (kind, queue) lanes, so that the dispatch window can hold back a kind on one queue (its
-- consumers are behind, or there are none) while the same kind goes out on another.
-- Before, the window counted a kind on every queue together, and its jobs waiting on a
-- queue nobody consumed held it back everywhere.
--
-- Rebuilding takes a lock that holds back writes to tock_jobs while it runs (about a
-- second per million unfinished jobs).
DROP INDEX tock_jobs_fair_idx;
CREATE INDEX tock_jobs_fair_idx
    ON tock_jobs (priority, kind, queue, (coalesce(tenant, '')), run_at DESC, id DESC)
    WHERE state IN ('scheduled', 'retrying');
