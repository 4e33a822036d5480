"""Conformance of `JobStore` (shared.store.job_store / jobs_sql) against the real Postgres,
the statements of the producer and the operator: insert_jobs, jobs_by_key, get_job,
attempts, cancel_job, retry_job and notify_due. One test (or a small parametrized group)
per method, each guard of a guarded statement exercised on its own. Rows are arranged and
inspected with plain SQL on `db`; time is pinned through `now=` (the database clock at the
start of the test, plus offsets)."""

from __future__ import annotations

from uuid import uuid4

import pytest

from shared.core.jobs import Attempt
from shared.core.states import AttemptOutcome, JobState
from shared.store import JobStore
from shared.store.rows import NewJob
from tests.integration.store.helpers import (
    add_job,
    attempt_rows,
    count,
    insert_row,
    job_row,
    run_blocked,
    secs,
)

# --- insert_jobs / jobs_by_key / get_job / attempts --------------------------------------------


def test_insert_jobs_returns_each_inserted_job(job_store, db, now):
    jobs = job_store.insert_jobs([
        NewJob("email", "mail", '{"to": "a@example.com"}', priority=3, at=now + secs(60),
               delay_seconds=999, max_attempts=5, timeout_seconds=2.5, unique_key="welcome:1",
               tenant="acme"),
        NewJob("sms", "default", "{}", delay_seconds=30),
    ], now=now)
    by_kind = {j.kind: j for j in jobs}
    assert set(by_kind) == {"email", "sms"}
    email, sms = by_kind["email"], by_kind["sms"]
    assert (email.queue, email.payload, email.priority, email.state) == (
        "mail", {"to": "a@example.com"}, 3, JobState.SCHEDULED)
    assert email.run_at == now + secs(60), "`at` wins over the delay"
    assert (email.attempt, email.max_attempts, email.timeout_seconds) == (0, 5, 2.5)
    assert (email.unique_key, email.tenant, email.created) == ("welcome:1", "acme", True)
    assert (email.lease_owner, email.dispatch_token, email.finished_at,
            email.dispatch_failures) == (None, None, None, 0)
    assert sms.run_at == now + secs(30), "no `at`: now + delay"
    assert (sms.max_attempts, sms.timeout_seconds, sms.unique_key, sms.tenant) == (
        None, None, None, None)
    rows = db.execute("SELECT id, kind, state::text, run_at FROM tock_jobs ORDER BY id").fetchall()
    assert sorted(rows) == sorted((j.id, j.kind, "scheduled", j.run_at) for j in jobs)


def test_insert_jobs_skips_a_taken_unique_key(job_store, db, now):
    (first,) = job_store.insert_jobs([NewJob("a", "default", "{}", unique_key="k1")], now=now)
    again = job_store.insert_jobs([
        NewJob("b", "default", "{}", unique_key="k1"),
        NewJob("c", "default", "{}", unique_key="k2"),
        NewJob("d", "default", "{}"),
    ], now=now)
    assert sorted(j.kind for j in again) == ["c", "d"], "nothing comes back for the taken key"
    assert db.execute("SELECT id, kind FROM tock_jobs WHERE unique_key = 'k1'").fetchall() == [
        (first.id, "a")]
    assert count(db, "tock_jobs") == 3


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_insert_jobs_waits_for_a_concurrent_insert_of_the_same_key(
        job_store, db, other, now, outcome):
    JobStore.on(other).insert_jobs([NewJob("theirs", "default", "{}", unique_key="k1")],
                                   now=now)
    inserted = run_blocked(db, other, lambda: job_store.insert_jobs(
        [NewJob("ours", "default", "{}", unique_key="k1")], now=now),
        getattr(other, outcome))
    kinds = [r[0] for r in db.execute("SELECT kind FROM tock_jobs WHERE unique_key = 'k1'")]
    if outcome == "commit":
        assert inserted == [], "the key was taken once the other insert committed"
        assert kinds == ["theirs"]
    else:
        assert [j.kind for j in inserted] == ["ours"], "the other insert went away"
        assert kinds == ["ours"]


def test_insert_jobs_with_one_key_twice_in_a_batch_inserts_it_once(job_store, db, now):
    jobs = job_store.insert_jobs([NewJob("a", "default", "{}", unique_key="dup"),
                                  NewJob("b", "default", "{}", unique_key="dup")], now=now)
    assert len(jobs) == 1
    assert count(db, "tock_jobs") == 1


def test_insert_jobs_of_an_empty_batch_inserts_nothing(job_store, db, now):
    assert job_store.insert_jobs([], now=now) == []
    assert count(db, "tock_jobs") == 0


def test_jobs_by_key_reads_existing_jobs_as_not_created(job_store, db, now):
    k1 = add_job(db, run_at=now, unique_key="k1")
    k2 = add_job(db, run_at=now, unique_key="k2")
    add_job(db, run_at=now)
    found = job_store.jobs_by_key(["k1", "k2", "nope"])
    assert sorted((j.id, j.unique_key) for j in found) == [(k1, "k1"), (k2, "k2")]
    assert all(j.created is False for j in found)
    assert job_store.jobs_by_key([]) == []


def test_get_job_reads_the_row_or_none(job_store, db, now):
    (job,) = job_store.insert_jobs([NewJob("a", "q", '{"n": 1}', tenant="t")], now=now)
    assert job_store.get_job(job.id) == job
    assert job_store.get_job(job.id + 1000) is None


def test_attempts_are_the_jobs_own_oldest_first(job_store, db, now):
    job = add_job(db, run_at=now, state="dead", attempt=2)
    other_job = add_job(db, run_at=now)
    insert_row(db, "tock_attempts", job_id=job, attempt=1, worker="w1", started_at=now,
               finished_at=now + secs(1), outcome="failed", error="boom", traceback="tb")
    insert_row(db, "tock_attempts", job_id=other_job, attempt=1, worker="w9",
               finished_at=now, outcome="succeeded")
    insert_row(db, "tock_attempts", job_id=job, attempt=2, worker="w2", started_at=None,
               finished_at=now + secs(9), outcome="lease_expired", error="lost")
    assert job_store.attempts(job) == [
        Attempt(1, "w1", now, now + secs(1), AttemptOutcome.FAILED, "boom", "tb"),
        Attempt(2, "w2", None, now + secs(9), AttemptOutcome.LEASE_EXPIRED, "lost", None),
    ]
    assert job_store.attempts(job + 1000) == []


# --- cancel_job / retry_job -------------------------------------------------------------------


@pytest.mark.parametrize("state", ["scheduled", "retrying", "dispatched", "running"])
def test_cancel_job_cancels_an_unfinished_job(job_store, db, now, state):
    job = add_job(db, run_at=now, state=state, dispatch_token=uuid4(), lease_owner="w1")
    cancelled = job_store.cancel_job(job, now=now + secs(5))
    assert cancelled is not None
    assert (cancelled.id, cancelled.state) == (job, JobState.CANCELLED)
    row = job_row(db, job)
    assert (row["state"], row["finished_at"], row["updated_at"]) == (
        "cancelled", now + secs(5), now + secs(5))


@pytest.mark.parametrize("state", ["succeeded", "dead", "cancelled"])
def test_cancel_job_refuses_a_finished_job(job_store, db, now, state):
    job = add_job(db, run_at=now, state=state, finished_at=now - secs(10))
    before = job_row(db, job)
    assert job_store.cancel_job(job, now=now) is None
    assert job_row(db, job) == before


def test_cancel_job_of_a_missing_job_is_none(job_store, now):
    assert job_store.cancel_job(424242, now=now) is None


@pytest.mark.parametrize("state", ["dead", "cancelled"])
def test_retry_job_makes_a_dead_or_cancelled_job_due_now_with_fresh_attempts(
        job_store, db, now, state):
    job = add_job(db, run_at=now - secs(600), state=state, attempt=3, lease_owner="w1",
                  lease_expires_at=now - secs(100), dispatch_token=uuid4(),
                  finished_at=now - secs(50), last_error="boom")
    insert_row(db, "tock_attempts", job_id=job, attempt=3, finished_at=now - secs(50),
               outcome="failed")
    retried = job_store.retry_job(job, now=now)
    assert retried is not None and retried.state is JobState.SCHEDULED
    row = job_row(db, job)
    assert (row["state"], row["run_at"], row["attempt"], row["updated_at"]) == (
        "scheduled", now, 0, now)
    assert (row["lease_owner"], row["lease_expires_at"], row["dispatch_token"],
            row["finished_at"]) == (None, None, None, None)
    assert len(attempt_rows(db, job)) == 1, "the history keeps the earlier attempts"


@pytest.mark.parametrize("state", ["scheduled", "retrying", "dispatched", "running",
                                   "succeeded"])
def test_retry_job_refuses_other_states(job_store, db, now, state):
    job = add_job(db, run_at=now - secs(5), state=state, attempt=1)
    before = job_row(db, job)
    assert job_store.retry_job(job, now=now) is None
    assert job_row(db, job) == before


# --- notify_due -------------------------------------------------------------------------------


def test_notify_due_wakes_a_listener(job_store, db):
    db.execute("LISTEN tock_due")
    job_store.notify_due()
    notes = list(db.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("tock_due", "")]
