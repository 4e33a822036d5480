-- Missed recurring runs coalesce by default: after an outage a schedule runs once, for its
-- latest missed slot, then goes on on its grid (only the column default; every schedule
-- stores its own policy).
ALTER TABLE tock_schedules ALTER COLUMN misfire SET DEFAULT 'latest';

-- The kinds each consumer has handlers for, announced with every heartbeat, so producers
-- can refuse a kind no consumer knows (TOCK_REJECT_UNKNOWN_KINDS).
ALTER TABLE tock_workers ADD COLUMN kinds text[] NOT NULL DEFAULT '{}';
