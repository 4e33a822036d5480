"""Upgrading a database from the 0012 schema while a worker runs a job: migration 0013 adds
the attempt outcome `cancelled`, and a cancel of that running job right after the upgrade
keeps the attempt it ended."""

from __future__ import annotations

import psycopg

from shared.core.states import AttemptOutcome, JobState
from shared.store import Database, JobStore
from shared.store.migrate import available, migrate
from tests.integration.store.helpers import add_running, secs
from tests.support.drive import db_now

BEFORE = "0012_lingering_handlers.sql"


def test_0013_keeps_the_attempt_of_a_job_cancelled_right_after_the_upgrade(old_url):
    with psycopg.connect(old_url, autocommit=True) as conn:
        now = db_now(conn)
        conn.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, "
                     "in_flight, started_at, last_heartbeat, lease_expires_at) "
                     "VALUES ('w1', 'h', 1, '{default}', 4, 1, %s, %s, %s)",
                     (now, now, now + secs(30)))
        lease = add_running(conn, now, kind="report")
    names = [name for name, _ in available()]
    assert migrate(old_url) == names[names.index(BEFORE) + 1:]
    db = Database(old_url)
    try:
        jobs = JobStore(db)
        cancelled = jobs.cancel_job(lease.job_id, now=now + secs(1))
        assert cancelled is not None and cancelled.state is JobState.CANCELLED
        [attempt] = jobs.attempts(lease.job_id)
        assert (attempt.attempt, attempt.worker, attempt.outcome, attempt.finished_at) == (
            1, "w1", AttemptOutcome.CANCELLED, now + secs(1))
    finally:
        db.close()
