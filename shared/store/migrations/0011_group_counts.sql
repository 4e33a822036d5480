-- Bounded counts of unfinished work for the dashboard, `tock stats` and /metrics.
--
-- Their per-(queue, kind) figures were one aggregate over every unfinished row: 600 ms a
-- snapshot at 1M jobs, growing with the backlog. This index lets them walk the (queue,
-- kind) pairs with unfinished jobs (a loose scan, one probe a pair), count each state of a
-- pair up to a bound (a range of it), and read each pair's oldest waiting job exactly (the
-- first entry of a state's range), so the autoscaling signal stays exact when counts past
-- the bound are estimated.
--
-- Building it takes a lock that holds back writes to tock_jobs while it runs (about a
-- second per million unfinished jobs).
CREATE INDEX tock_jobs_group_idx ON tock_jobs (queue, kind, state, run_at);

-- Queue, kind and state are far from independent (a kind usually lives on one queue): with
-- a multi-column list of their common combinations the planner's estimate of a big pair's
-- count, which the figures past the bound use, is that pair's share, not a product.
CREATE STATISTICS tock_jobs_group_stats (mcv) ON queue, kind, state FROM tock_jobs;
