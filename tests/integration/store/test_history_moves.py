"""Conformance of the statements that move jobs between the hot table and the history
(migration 0007, shared/store/history_sql.py) against the real Postgres: an outcome, a
rescue and a cancel move a finished job with its attempts into its (state, day)
partition; a retry brings it back with its id and attempts; a job whose key has no row in
tock_keys (older than 0007) finishes in place; every read finds a job on either side."""

from __future__ import annotations

from uuid import uuid4

import pytest

from shared.core.jobs import Attempt
from shared.core.states import AttemptOutcome, JobState
from shared.store.rows import AttemptResult, NewJob, Rescue
from tests.integration.store.helpers import (
    add_finished,
    add_history_attempt,
    add_job,
    add_running,
    attempt_rows,
    attempt_sides,
    day_table,
    insert_row,
    job_row,
    keys,
    secs,
    side_of,
)


def _legacy(db, job_id: int) -> None:
    """Make the job look older than migration 0007: its key has no row in tock_keys."""
    db.execute("DELETE FROM tock_keys WHERE job_id = %s", (job_id,))


# --- finish_attempts ----------------------------------------------------------------------


def test_finish_attempts_moves_a_succeeded_job_to_its_day_partition_with_its_attempts(
        job_store, db, now):
    lease = add_running(db, now, attempt=2, unique_key="k1", tenant="acme")
    insert_row(db, "tock_attempts", job_id=lease.job_id, attempt=1, worker="w0",
               started_at=now - secs(90), finished_at=now - secs(80), outcome="failed",
               error="boom")
    written = job_store.finish_attempts([AttemptResult(
        lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w1", now=now)
    assert written == {lease.job_id}
    assert side_of(db, lease.job_id) == day_table("tock_history_jobs", "succeeded", now)
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["finished_at"], row["updated_at"],
            row["lease_owner"], row["lease_expires_at"], row["unique_key"], row["tenant"]) == (
        "succeeded", 2, now, now, None, None, "k1", "acme")
    sides = attempt_sides(db, lease.job_id)
    assert [s for _, s in sides] == [day_table("tock_history_attempts", "succeeded", now)] * 2
    assert [(a["attempt"], a["outcome"], a["worker"]) for a in attempt_rows(db, lease.job_id)
            ] == [(1, "failed", "w0"), (2, "succeeded", "w1")], "ids keep the order"
    assert keys(db) == {"k1": lease.job_id}, "the key stays with its job"


def test_finish_attempts_moves_the_finished_and_keeps_the_unfinished_hot(job_store, db, now):
    dead, retrying, released = (add_running(db, now) for _ in range(3))
    written = job_store.finish_attempts([
        AttemptResult(dead, JobState.DEAD, AttemptOutcome.PERMANENT, error="no"),
        AttemptResult(retrying, JobState.RETRYING, AttemptOutcome.FAILED, delay_seconds=5.0,
                      error="again"),
        AttemptResult(released, JobState.SCHEDULED, AttemptOutcome.RELEASED, refund=True),
    ], "w1", now=now)
    assert written == {dead.job_id, retrying.job_id, released.job_id}
    assert side_of(db, dead.job_id) == day_table("tock_history_jobs", "dead", now)
    assert job_row(db, dead.job_id)["last_error"] == "no"
    assert [side_of(db, j.job_id) for j in (retrying, released)] == ["hot", "hot"]
    assert attempt_sides(db, retrying.job_id)[0][1] == "hot"
    assert job_row(db, released.job_id)["attempt"] == 0


def test_finish_attempts_leaves_a_job_older_than_the_keys_table_in_place(job_store, db, now):
    lease = add_running(db, now, unique_key="old")
    _legacy(db, lease.job_id)
    job_store.finish_attempts([AttemptResult(lease, JobState.SUCCEEDED,
                                             AttemptOutcome.SUCCEEDED)], "w1", now=now)
    assert side_of(db, lease.job_id) == "hot", "moved only once its key has a row"
    assert job_row(db, lease.job_id)["state"] == "succeeded"
    assert keys(db) == {}


def test_finish_attempts_on_a_day_without_partition_lands_in_the_default(job_store, db, now):
    lease = add_running(db, now)
    later = now + secs(86400 * 40)  # partitions exist for today + 2 days only
    job_store.finish_attempts([AttemptResult(lease, JobState.SUCCEEDED,
                                             AttemptOutcome.SUCCEEDED)], "w1", now=later)
    assert side_of(db, lease.job_id) == "tock_history_jobs_succeeded_default"
    assert attempt_sides(db, lease.job_id)[0][1] == "tock_history_attempts_succeeded_default"


def test_finish_attempts_of_a_moved_job_matches_nothing(job_store, db, now):
    lease = add_running(db, now)
    result = AttemptResult(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    assert job_store.finish_attempts([result], "w1", now=now) == {lease.job_id}
    assert job_store.finish_attempts([result], "w1", now=now) == set()
    assert len(attempt_rows(db, lease.job_id)) == 1


# --- rescue_expired / cancel_job ---------------------------------------------------------


def test_rescue_expired_moves_a_dead_job_with_its_lost_attempt(job_store, db, now):
    lease = add_running(db, now, attempt=3, lease_until=now - secs(5), max_attempts=3)
    with job_store.transaction() as tx:
        tx.expired_leases(10, 5, now=now)
        done = tx.rescue_expired([Rescue(lease.job_id, 3, JobState.DEAD, 0, "lost", "w1")],
                                 now=now)
    assert done == {lease.job_id}
    assert side_of(db, lease.job_id) == day_table("tock_history_jobs", "dead", now)
    row = job_row(db, lease.job_id)
    assert (row["state"], row["last_error"], row["lease_owner"], row["finished_at"]) == (
        "dead", "lost", None, now)
    (lost,) = attempt_rows(db, lease.job_id)
    assert (lost["outcome"], lost["worker"], lost["error"], lost["finished_at"]) == (
        "lease_expired", "w1", "lost", now)


@pytest.mark.parametrize("state", ["scheduled", "dispatched", "running"])
def test_cancel_job_moves_the_job_to_the_history(job_store, db, now, state):
    job = add_job(db, run_at=now, state=state, unique_key=f"c-{state}", lease_owner="w1")
    insert_row(db, "tock_attempts", job_id=job, attempt=1, finished_at=now - secs(9),
               outcome="failed")
    cancelled = job_store.cancel_job(job, now=now + secs(5))
    assert cancelled is not None
    assert (cancelled.id, cancelled.state, cancelled.finished_at, cancelled.lease_owner) == (
        job, JobState.CANCELLED, now + secs(5), "w1")
    assert side_of(db, job) == day_table("tock_history_jobs", "cancelled", now + secs(5))
    assert cancelled == job_store.get_job(job)
    assert [a["outcome"] for a in attempt_rows(db, job)] == ["failed"]
    assert keys(db) == {f"c-{state}": job}


def test_cancel_job_of_a_job_older_than_the_keys_table_cancels_in_place(job_store, db, now):
    job = add_job(db, run_at=now, unique_key="old")
    _legacy(db, job)
    cancelled = job_store.cancel_job(job, now=now)
    assert cancelled is not None and cancelled.state is JobState.CANCELLED
    assert side_of(db, job) == "hot"


# --- retry_job ----------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["dead", "cancelled"])
def test_retry_job_brings_a_job_back_from_the_history_with_its_id_and_attempts(
        job_store, db, now, state):
    job = add_finished(db, state=state, finished_at=now - secs(60), unique_key="r1",
                       attempt=2, last_error="boom [attempt 2 of 2, giving up]",
                       dispatch_token=uuid4(), tenant="t", dispatch_failures=2,
                       dispatched_at=now - secs(66), started_at=now - secs(65))
    add_history_attempt(db, job, attempt=1, outcome="failed", finished_at=now - secs(70))
    add_history_attempt(db, job, attempt=2, outcome="permanent", finished_at=now - secs(60))
    before = [a for a, _ in attempt_sides(db, job)]
    retried = job_store.retry_job(job, now=now)
    assert retried is not None
    # Nothing of the run it had: its error and times stay with its attempts.
    assert (retried.id, retried.state, retried.run_at, retried.attempt, retried.finished_at,
            retried.dispatch_token, retried.last_error, retried.tenant, retried.started_at,
            retried.dispatched_at) == (
        job, JobState.SCHEDULED, now, 0, None, None, None, "t", None, None)
    assert job_row(db, job)["dispatch_failures"] == 0
    assert side_of(db, job) == "hot"
    assert attempt_sides(db, job) == [(a, "hot") for a in before]
    assert keys(db) == {"r1": job}, "the key never left its job"
    assert job_store.get_job(job) == retried


def test_retry_job_refuses_a_succeeded_job_in_the_history(job_store, db, now):
    job = add_finished(db, state="succeeded", finished_at=now)
    assert job_store.retry_job(job, now=now) is None
    assert side_of(db, job) == day_table("tock_history_jobs", "succeeded", now)


# --- reads of both sides ------------------------------------------------------------------


def test_get_job_attempts_and_jobs_by_key_read_both_sides(job_store, db, now):
    hot = add_job(db, run_at=now, unique_key="hot")
    moved = add_finished(db, state="succeeded", finished_at=now, unique_key="moved")
    add_history_attempt(db, moved, attempt=1, outcome="succeeded", finished_at=now,
                        worker="w1")
    assert job_store.get_job(moved).state is JobState.SUCCEEDED
    assert job_store.get_job(hot).state is JobState.SCHEDULED
    assert job_store.attempts(moved) == [
        Attempt(1, "w1", None, now, AttemptOutcome.SUCCEEDED, None, None)]
    found = {j.unique_key: (j.id, j.created) for j in job_store.jobs_by_key(
        ["hot", "moved", "none"])}
    assert found == {"hot": (hot, False), "moved": (moved, False)}
    assert job_store.job_states([hot, moved, moved + 99]) == {
        hot: (JobState.SCHEDULED, None), moved: (JobState.SUCCEEDED, None)}


def test_insert_jobs_skips_a_key_held_by_a_job_in_the_history(job_store, db, now):
    moved = add_finished(db, state="succeeded", finished_at=now, unique_key="k")
    assert job_store.insert_jobs([NewJob("a", "default", "{}", unique_key="k")], now=now) == []
    assert [j.id for j in job_store.jobs_by_key(["k"])] == [moved]
    assert keys(db) == {"k": moved}


def test_insert_jobs_skips_a_key_held_by_a_job_older_than_the_keys_table(job_store, db, now):
    old = add_job(db, run_at=now, unique_key="k")
    _legacy(db, old)
    assert job_store.insert_jobs([NewJob("a", "default", "{}", unique_key="k")], now=now) == []
    assert keys(db) == {}, "no row pointing at a job that was never made"


def test_reclaim_keys_frees_only_keys_no_job_holds(job_store, db, now):
    hot = add_job(db, run_at=now, unique_key="hot")
    moved = add_finished(db, state="dead", finished_at=now, unique_key="moved")
    insert_row(db, "tock_keys", unique_key="orphan", job_id=424242)
    assert job_store.reclaim_keys(["hot", "moved", "orphan", "never"]) == ["orphan"]
    assert keys(db) == {"hot": hot, "moved": moved}
