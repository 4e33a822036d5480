"""Upgrading a database from the 0011 schema while a worker runs a job: migration 0012
adds tock_lingering, and the worker's next heartbeat, a cancel of its running job and the
limits' counts all work on it at once (the worker's row, written before the upgrade, is
what the new rows hang off)."""

from __future__ import annotations

from shared.core.reports import Worker
from shared.store import Database, JobStore
from shared.store.flow_store import FlowStore
from tests.integration.store.helpers import running_before_upgrade, secs

BEFORE = "0011_group_counts.sql"


def test_0012_counts_the_handler_of_a_job_cancelled_right_after_the_upgrade(old_url):
    worker = Worker("w1", "h", 1, ["default"], [], 4, 1)
    now, lease = running_before_upgrade(old_url, BEFORE)
    db = Database(old_url)
    try:
        jobs, flow = JobStore(db), FlowStore(db)
        assert jobs.heartbeat(worker, [lease], 30, now=now,
                              running=[lease]) == {lease.job_id}
        flow.set_limit("kind", "report", max_running=1, rate_per_second=None, burst=None)
        assert jobs.cancel_job(lease.job_id, now=now) is not None
        [limit] = flow.limits(now=now)
        assert (limit.in_flight, limit.lingering) == (1, 1)
        jobs.heartbeat(worker, [], 30, now=now + secs(3))
        [limit] = flow.limits(now=now + secs(3))
        assert (limit.in_flight, limit.lingering) == (0, 0)
    finally:
        db.close()
