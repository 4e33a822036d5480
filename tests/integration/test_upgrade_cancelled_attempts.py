"""Upgrading a database from the 0012 schema while a worker runs a job: migration 0013 adds
the attempt outcome `cancelled`, and a cancel of that running job right after the upgrade
keeps the attempt it ended."""

from __future__ import annotations

from shared.core.states import AttemptOutcome, JobState
from shared.store import Database, JobStore
from tests.integration.store.helpers import running_before_upgrade, secs

BEFORE = "0012_lingering_handlers.sql"


def test_0013_keeps_the_attempt_of_a_job_cancelled_right_after_the_upgrade(old_url):
    now, lease = running_before_upgrade(old_url, BEFORE)
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
