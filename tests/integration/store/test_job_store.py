"""Conformance of `JobStore` (shared.store.job_store / jobs_sql) against the real Postgres:
one test (or a small parametrized group) per method, each guard of a guarded statement
exercised on its own. Rows are arranged and inspected with plain SQL on `db`; time is
pinned through `now=` (the database clock at the start of the test, plus offsets)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from shared.core.errors import LockTimeout
from shared.core.jobs import Attempt
from shared.core.reports import Worker
from shared.core.states import AttemptOutcome, JobState
from shared.store import JobStore
from shared.store import job_store as job_store_module
from shared.store.rows import (
    AttemptResult,
    Claim,
    ClaimedJob,
    DueJob,
    ExpiredLease,
    Lease,
    NewJob,
    Refused,
    Rescue,
)
from tests.integration.store.helpers import (
    add_dispatched,
    add_job,
    add_running,
    attempt_rows,
    count,
    insert_row,
    job_row,
    run_blocked,
    secs,
)
from tests.support.drive import db_now

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


# --- claim_due --------------------------------------------------------------------------------


def _ids(due: list[DueJob]) -> list[int]:
    return sorted(d.id for d in due)


def test_claim_due_takes_the_highest_priority_first_then_the_oldest(job_store, db, now):
    m = secs(60)
    low_old = add_job(db, run_at=now - 10 * m, priority=0)
    high_new = add_job(db, run_at=now - 1 * m, priority=9)
    mid = add_job(db, run_at=now - 5 * m, priority=5)
    high_old = add_job(db, run_at=now - 2 * m, priority=9)
    low_new = add_job(db, run_at=now - 9 * m, priority=0)
    later = add_job(db, run_at=now + secs(30), priority=9)
    mid_twin = add_job(db, run_at=now - 5 * m, priority=5)  # same run_at: id order
    order = [job_store.claim_due(1, now=now) for _ in range(6)]
    assert [_ids(o) for o in order] == [[high_old], [high_new], [mid], [mid_twin], [low_old],
                                        [low_new]]
    assert job_store.claim_due(10, now=now + secs(29)) == [], "not due yet"
    assert _ids(job_store.claim_due(10, now=now + secs(30))) == [later]


def test_claim_due_respects_the_limit_across_levels(job_store, db, now):
    jobs = [add_job(db, run_at=now - secs(i), priority=i % 3) for i in range(1, 7)]
    first = job_store.claim_due(4, now=now)
    assert len(first) == 4
    rest = job_store.claim_due(4, now=now)
    assert sorted(_ids(first) + _ids(rest)) == sorted(jobs)


def test_claim_due_marks_jobs_dispatched_with_fresh_tokens(job_store, db, now):
    retrying = add_job(db, run_at=now - secs(5), state="retrying", kind="email", queue="mail",
                       attempt=1)
    scheduled = add_job(db, run_at=now - secs(2))
    for state in ("dispatched", "running", "succeeded", "dead", "cancelled"):
        add_job(db, run_at=now - secs(100), state=state)
    due = {d.id: d for d in job_store.claim_due(10, now=now)}
    assert set(due) == {retrying, scheduled}, "only scheduled and retrying jobs are claimed"
    d = due[retrying]
    assert (d.kind, d.queue, d.prev_state, d.lag_seconds) == (
        "email", "mail", JobState.RETRYING, 5.0)
    assert due[scheduled].prev_state is JobState.SCHEDULED
    assert due[retrying].token != due[scheduled].token
    for job_id, claimed in due.items():
        row = job_row(db, job_id)
        assert (row["state"], row["dispatch_token"], row["dispatched_at"],
                row["updated_at"]) == ("dispatched", claimed.token, now, now)


def test_claim_due_skips_a_row_another_transaction_holds(impatient, db, other, now):
    locked = add_job(db, run_at=now - secs(120))
    free = add_job(db, run_at=now - secs(60))
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (locked,))
    assert _ids(JobStore.on(impatient).claim_due(10, now=now)) == [free]
    assert job_row(db, locked)["state"] == "scheduled"
    other.rollback()
    assert _ids(JobStore.on(impatient).claim_due(10, now=now)) == [locked]


def test_claim_due_of_two_timers_side_by_side_takes_each_row_once(impatient, db, other, now):
    jobs = [add_job(db, run_at=now - secs(i)) for i in range(1, 6)]
    theirs = JobStore.on(other).claim_due(3, now=now)  # not committed yet
    ours = JobStore.on(impatient).claim_due(10, now=now)
    other.commit()
    assert len(theirs) == 3 and len(ours) == 2
    assert sorted(_ids(theirs) + _ids(ours)) == sorted(jobs)
    assert count(db, "tock_jobs", "state = 'dispatched'") == 5


# --- undo_dispatch ----------------------------------------------------------------------------

BACKOFF = {"backoff_base_seconds": 2.0, "backoff_cap_seconds": 10.0}


def test_undo_dispatch_puts_refused_jobs_back_with_the_reason_after_a_backoff(
        job_store, db, now):
    scheduled = add_job(db, run_at=now - secs(5))
    retrying = add_job(db, run_at=now - secs(5), state="retrying", attempt=1)
    assert _ids(job_store.claim_due(10, now=now)) == sorted([scheduled, retrying])
    failures = job_store.undo_dispatch([Refused(scheduled, JobState.SCHEDULED, "queue missing"),
                                        Refused(retrying, JobState.RETRYING, "throttled")],
                                       now=now + secs(1), **BACKOFF)
    assert failures == {scheduled: 1, retrying: 1}
    for job_id, state, error in ((scheduled, "scheduled", "queue missing"),
                                 (retrying, "retrying", "throttled")):
        row = job_row(db, job_id)
        assert (row["state"], row["dispatch_token"], row["dispatched_at"], row["last_error"],
                row["dispatch_failures"], row["updated_at"]) == (
            state, None, None, error, 1, now + secs(1))
        assert row["run_at"] == now + secs(3), "due again after base * 2^0"
    assert job_store.claim_due(10, now=now + secs(2)) == [], "waiting out the backoff"


def test_undo_dispatch_backs_off_per_failure_in_a_row_up_to_the_cap(job_store, db, now):
    job = add_job(db, run_at=now - secs(5))
    t = now
    for failures, delay in ((1, 2), (2, 4), (3, 8), (4, 10), (5, 10)):
        assert _ids(job_store.claim_due(10, now=t)) == [job]
        assert job_store.undo_dispatch([Refused(job, JobState.SCHEDULED, "refused")],
                                       now=t, **BACKOFF) == {job: failures}
        row = job_row(db, job)
        assert (row["dispatch_failures"], row["run_at"]) == (failures, t + secs(delay))
        t = row["run_at"]


def test_undo_dispatch_keeps_a_later_run_at(job_store, db, now):
    job, _ = add_dispatched(db, now, run_at=now + secs(100))
    job_store.undo_dispatch([Refused(job, JobState.SCHEDULED, "refused")], now=now, **BACKOFF)
    assert job_row(db, job)["run_at"] == now + secs(100)


@pytest.mark.parametrize("state", ["running", "scheduled", "succeeded", "cancelled"])
def test_undo_dispatch_leaves_a_job_no_longer_dispatched(job_store, db, now, state):
    job = add_job(db, run_at=now - secs(5), state=state, dispatch_token=uuid4(),
                  dispatched_at=now - secs(1), last_error="earlier")
    before = job_row(db, job)
    assert job_store.undo_dispatch([Refused(job, JobState.SCHEDULED, "refused")], now=now,
                                   **BACKOFF) == {}
    assert job_row(db, job) == before


# --- next_due_at ------------------------------------------------------------------------------


def test_next_due_at_with_nothing_due_is_none_and_the_clock(job_store, db):
    before = db_now(db)
    due, clock = job_store.next_due_at()
    assert due is None
    assert before <= clock <= db_now(db)


def test_next_due_at_is_the_earliest_scheduled_or_retrying_run_at(job_store, db, now):
    add_job(db, run_at=now + secs(10), priority=0)
    add_job(db, run_at=now + secs(5), priority=7, state="retrying")
    add_job(db, run_at=now + secs(8), priority=9)
    for state in ("dispatched", "running", "succeeded", "dead", "cancelled"):
        add_job(db, run_at=now - secs(100), state=state)
    due, _ = job_store.next_due_at()
    assert due == now + secs(5)


# --- stuck_queues / queue_expected / redispatch_stuck ------------------------------------------


def test_stuck_queues_counts_jobs_dispatched_too_long_ago_per_queue(job_store, db, now):
    for queue, ago in (("a", 120), ("a", 61), ("a", 60), ("b", 90), ("c", 10)):
        add_dispatched(db, now, queue=queue, dispatched_at=now - secs(ago))
    add_job(db, run_at=now - secs(300), state="running", queue="d",
            dispatched_at=now - secs(300))
    assert job_store.stuck_queues(60, now=now) == {"a": 2, "b": 1}
    assert job_store.stuck_queues(3600, now=now) == {}


def test_queue_expected_counts_dispatched_and_running_jobs_of_the_queue(job_store, db, now):
    for state, queue in (("dispatched", "a"), ("dispatched", "a"), ("running", "a"),
                         ("dispatched", "b"), ("scheduled", "a"), ("succeeded", "a")):
        add_job(db, run_at=now, state=state, queue=queue)
    assert job_store.queue_expected("a") == (2, 1)
    assert job_store.queue_expected("b") == (1, 0)
    assert job_store.queue_expected("empty") == (0, 0)


def test_redispatch_stuck_makes_only_the_queues_jobs_dispatched_too_long_ago_due_again(
        job_store, db, now):
    first, _ = add_dispatched(db, now, dispatched_at=now - secs(120), attempt=0)
    retried, _ = add_dispatched(db, now, dispatched_at=now - secs(90), attempt=2)
    edge, _ = add_dispatched(db, now, dispatched_at=now - secs(60))
    fresh, _ = add_dispatched(db, now, dispatched_at=now - secs(10))
    elsewhere, _ = add_dispatched(db, now, dispatched_at=now - secs(300), queue="other")
    running = add_job(db, run_at=now - secs(300), state="running",
                      dispatched_at=now - secs(300), dispatch_token=uuid4())
    untouched = {j: job_row(db, j) for j in (edge, fresh, elsewhere, running)}
    assert sorted(job_store.redispatch_stuck("default", 60.0, 10, now=now)) == sorted(
        [first, retried])
    assert job_row(db, first)["state"] == "scheduled", "never attempted: scheduled"
    assert job_row(db, retried)["state"] == "retrying", "attempted before: retrying"
    for job_id in (first, retried):
        row = job_row(db, job_id)
        assert row["dispatch_token"] is None
        assert "not claimed within 60 s" in row["last_error"]
        assert row["updated_at"] == now
    assert {j: job_row(db, j) for j in untouched} == untouched


def test_redispatch_stuck_takes_the_oldest_first_up_to_the_limit(job_store, db, now):
    newer, _ = add_dispatched(db, now, dispatched_at=now - secs(100))
    oldest, _ = add_dispatched(db, now, dispatched_at=now - secs(200))
    assert job_store.redispatch_stuck("default", 60, 1, now=now) == [oldest]
    assert job_store.redispatch_stuck("default", 60, 1, now=now) == [newer]
    assert job_store.redispatch_stuck("default", 60, 1, now=now) == []


def test_redispatch_stuck_skips_a_row_another_transaction_holds(impatient, db, other, now):
    held, _ = add_dispatched(db, now, dispatched_at=now - secs(200))
    free, _ = add_dispatched(db, now, dispatched_at=now - secs(100))
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (held,))
    assert JobStore.on(impatient).redispatch_stuck("default", 60, 10, now=now) == [free]


# --- expired_leases / rescue_expired ----------------------------------------------------------


def test_expired_leases_lists_running_jobs_past_their_lease_oldest_first(job_store, db, now):
    a = add_running(db, now, worker="w1", attempt=1, lease_until=now - secs(10),
                    started_at=now - secs(60), max_attempts=3)
    b = add_running(db, now, worker="w2", attempt=2, lease_until=now - secs(20),
                    started_at=now - secs(100))
    add_running(db, now, lease_until=now + secs(10))
    add_running(db, now, lease_until=now)  # expires exactly now: not yet expired
    add_job(db, run_at=now, state="retrying", lease_expires_at=now - secs(30))
    assert job_store.expired_leases(10, default_max_attempts=4, now=now) == [
        ExpiredLease(b.job_id, 2, 4, "w2", now - secs(100), now - secs(20)),
        ExpiredLease(a.job_id, 1, 3, "w1", now - secs(60), now - secs(10)),
    ]
    assert [e.job_id for e in job_store.expired_leases(1, 4, now=now)] == [b.job_id]


def test_expired_leases_skips_a_row_another_transaction_holds(impatient, db, other, now):
    a = add_running(db, now, lease_until=now - secs(10))
    b = add_running(db, now, lease_until=now - secs(20))
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (b.job_id,))
    expired = JobStore.on(impatient).expired_leases(10, 3, now=now)
    assert [e.job_id for e in expired] == [a.job_id]


def test_rescue_expired_moves_jobs_on_and_records_the_lost_attempts(job_store, db, now):
    a = add_running(db, now, worker="w1", attempt=1, max_attempts=3,
                    lease_until=now - secs(10), started_at=now - secs(60))
    last = add_running(db, now, worker="w2", attempt=3, max_attempts=3,
                       lease_until=now - secs(5), started_at=now - secs(40),
                       run_at=now - secs(90))
    with job_store.transaction() as tx:
        expired = tx.expired_leases(10, 3, now=now)
        assert {e.job_id for e in expired} == {a.job_id, last.job_id}
        rescued = tx.rescue_expired([
            Rescue(a.job_id, 1, JobState.RETRYING, 5.0, "lease expired", "w1"),
            Rescue(last.job_id, 3, JobState.DEAD, 0.0, "lease expired; giving up", "w2"),
        ], now=now)
    assert rescued == {a.job_id, last.job_id}
    row = job_row(db, a.job_id)
    assert (row["state"], row["run_at"], row["last_error"], row["finished_at"],
            row["updated_at"]) == ("retrying", now + secs(5), "lease expired", None, now)
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    row = job_row(db, last.job_id)
    assert (row["state"], row["run_at"], row["finished_at"], row["lease_owner"]) == (
        "dead", now - secs(90), now, None), "the last attempt: dead, run_at kept"
    assert attempt_rows(db, a.job_id) == [{
        "job_id": a.job_id, "attempt": 1, "worker": "w1", "started_at": now - secs(60),
        "finished_at": now, "outcome": "lease_expired", "error": "lease expired",
        "traceback": None}]
    assert [(r["attempt"], r["worker"], r["outcome"], r["error"])
            for r in attempt_rows(db, last.job_id)] == [
        (3, "w2", "lease_expired", "lease expired; giving up")]


def test_rescue_expired_leaves_a_lease_renewed_since_the_select(job_store, db, now):
    lease = add_running(db, now, worker="w1", lease_until=now - secs(1))
    assert [e.job_id for e in job_store.expired_leases(10, 3, now=now)] == [lease.job_id]
    assert job_store.heartbeat([lease], "w1", 30, now=now) == {lease.job_id}
    rescued = job_store.rescue_expired(
        [Rescue(lease.job_id, 1, JobState.RETRYING, 0.0, "lease expired", "w1")], now=now)
    assert rescued == set()
    row = job_row(db, lease.job_id)
    assert (row["state"], row["lease_owner"], row["lease_expires_at"]) == (
        "running", "w1", now + secs(30))
    assert attempt_rows(db) == []


@pytest.mark.parametrize("change", [
    "state = 'cancelled'",  # cancelled meanwhile
    "attempt = 2",  # rescued and claimed again meanwhile
])
def test_rescue_expired_leaves_a_job_that_moved_on(job_store, db, now, change):
    lease = add_running(db, now, lease_until=now - secs(1))
    db.execute(f"UPDATE tock_jobs SET {change} WHERE id = %s", (lease.job_id,))
    before = job_row(db, lease.job_id)
    assert job_store.rescue_expired(
        [Rescue(lease.job_id, 1, JobState.RETRYING, 0.0, "lease expired", "w1")],
        now=now) == set()
    assert job_row(db, lease.job_id) == before
    assert attempt_rows(db) == []


# --- claim_messages / job_states --------------------------------------------------------------


def test_claim_messages_claims_on_id_and_token_and_fills_task_defaults(job_store, db, now):
    bare, bare_token = add_dispatched(db, now, kind="email", queue="mail", tenant="acme",
                                      unique_key="welcome:1", payload={"n": 1},
                                      run_at=now - secs(3), dispatch_failures=3)
    set_, set_token = add_dispatched(db, now, max_attempts=2, timeout_seconds=10.0,
                                     run_at=now - secs(1))
    claimed = job_store.claim_messages([Claim(bare, bare_token, 5, 30.0),
                                        Claim(set_, set_token, 5, 30.0)],
                                       "w1", 60, now=now)
    by_id = {c.id: c for c in claimed}
    assert by_id[bare] == ClaimedJob(
        id=bare, kind="email", payload={"n": 1}, attempt=1, max_attempts=5,
        timeout_seconds=30.0, run_at=now - secs(3), token=bare_token, queue="mail",
        tenant="acme", key="welcome:1", lag_seconds=3.0)
    assert (by_id[set_].max_attempts, by_id[set_].timeout_seconds) == (2, 10.0), \
        "the job's own values win over the task defaults"
    for job_id, (max_attempts, timeout) in ((bare, (5, 30.0)), (set_, (2, 10.0))):
        row = job_row(db, job_id)
        assert (row["state"], row["attempt"], row["lease_owner"], row["lease_expires_at"],
                row["started_at"], row["updated_at"]) == (
            "running", 1, "w1", now + secs(60), now, now)
        assert (row["max_attempts"], row["timeout_seconds"]) == (max_attempts, timeout)
        assert row["dispatch_failures"] == 0, "a claimed send is no longer a refused one"


@pytest.mark.parametrize("case", ["wrong token", "running", "cancelled", "scheduled",
                                  "no such job"])
def test_claim_messages_matches_nothing_without_id_token_and_dispatched(
        job_store, db, now, case):
    job, token = add_dispatched(db, now)
    claim_id, claim_token = job, token
    if case == "wrong token":
        claim_token = uuid4()
    elif case == "no such job":
        claim_id = job + 1000
    else:
        db.execute("UPDATE tock_jobs SET state = %s WHERE id = %s", (case, job))
    before = job_row(db, job)
    assert job_store.claim_messages([Claim(claim_id, claim_token, 3, 30.0)], "w1", 60,
                                    now=now) == []
    assert job_row(db, job) == before


def test_claim_messages_waiting_for_locks_claims_when_nothing_is_locked(job_store, db, now):
    job, token = add_dispatched(db, now)
    claimed = job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60, now=now,
                                       wait_for_locks=True)
    assert [c.id for c in claimed] == [job]
    assert job_row(db, job)["state"] == "running"


def test_claim_messages_waiting_for_a_locked_row_gives_up_with_lock_timeout(
        job_store, db, other, now, monkeypatch):
    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 100)
    job, token = add_dispatched(db, now)
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (job,))
    before = job_row(db, job)
    with pytest.raises(LockTimeout) as caught:
        job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60, now=now,
                                 wait_for_locks=True)
    assert caught.value.sqlstate == "55P03"
    assert not isinstance(caught.value, psycopg.Error)
    other.rollback()
    assert job_row(db, job) == before
    # The lock timeout was local to the claim's transaction: the next claim goes through.
    assert [c.id for c in job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60,
                                                   now=now)] == [job]


def test_claim_messages_waiting_for_locks_sees_the_dispatch_once_it_commits(
        job_store, db, other, now, monkeypatch):
    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 10_000)
    job = add_job(db, run_at=now - secs(1))
    (due,) = JobStore.on(other).claim_due(1, now=now)  # dispatched, not yet committed
    claim = Claim(job, due.token, 3, 30.0)
    assert job_store.claim_messages([claim], "w1", 60, now=now) == [], \
        "without waiting, the uncommitted dispatch is invisible"
    claimed = run_blocked(db, other, lambda: job_store.claim_messages(
        [claim], "w1", 60, now=now, wait_for_locks=True), other.commit)
    assert [c.id for c in claimed] == [job]
    assert job_row(db, job)["state"] == "running"


def test_job_states_reads_state_and_token_of_existing_jobs(job_store, db, now):
    scheduled = add_job(db, run_at=now)
    dispatched, token = add_dispatched(db, now)
    assert job_store.job_states([scheduled, dispatched, dispatched + 1000]) == {
        scheduled: (JobState.SCHEDULED, None), dispatched: (JobState.DISPATCHED, token)}
    assert job_store.job_states([]) == {}


# --- heartbeat --------------------------------------------------------------------------------


def test_heartbeat_extends_every_lease_the_worker_holds(job_store, db, now):
    a = add_running(db, now, worker="w1", lease_until=now + secs(10))
    b = add_running(db, now, worker="w1", attempt=2, lease_until=now + secs(3))
    assert job_store.heartbeat([a, b], "w1", 30, now=now + secs(5)) == {a.job_id, b.job_id}
    for lease in (a, b):
        assert job_row(db, lease.job_id)["lease_expires_at"] == now + secs(35)


@pytest.mark.parametrize("case", ["owner", "attempt", "token", "state"])
def test_heartbeat_is_fenced_on_owner_attempt_token_and_state(job_store, db, now, case):
    good = add_running(db, now, worker="w1")
    lost = add_running(db, now, worker="w1", attempt=2, lease_until=now + secs(10))
    sent = lost
    if case == "owner":
        db.execute("UPDATE tock_jobs SET lease_owner = 'w2' WHERE id = %s", (lost.job_id,))
    elif case == "attempt":
        sent = Lease(lost.job_id, 1, lost.token)
    elif case == "token":
        sent = Lease(lost.job_id, lost.attempt, uuid4())
    else:
        db.execute("UPDATE tock_jobs SET state = 'cancelled' WHERE id = %s", (lost.job_id,))
    before = job_row(db, lost.job_id)
    assert job_store.heartbeat([good, sent], "w1", 30, now=now) == {good.job_id}
    assert job_row(db, lost.job_id) == before


def test_heartbeat_of_no_leases_runs_no_statement(database_url):
    closed = psycopg.connect(database_url)
    closed.close()
    assert JobStore.on(closed).heartbeat([], "w1", 30) == set()


# --- upsert_worker / stop_worker --------------------------------------------------------------


def _worker(db: Any, worker_id: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM tock_workers WHERE id = %s", (worker_id,)).fetchone()
    return row


def test_upsert_worker_announces_then_refreshes_a_worker(job_store, db, now):
    job_store.upsert_worker(Worker("w1", "host-a", 101, ["default", "mail"], ["email"], 8, 0),
                            now=now)
    assert _worker(db, "w1") == {
        "id": "w1", "host": "host-a", "pid": 101, "queues": ["default", "mail"],
        "concurrency": 8, "in_flight": 0, "started_at": now, "last_heartbeat": now,
        "stopped_at": None, "kinds": ["email"]}
    job_store.upsert_worker(
        Worker("w1", "host-a", 101, ["default", "mail"], ["email", "sms"], 8, 5),
        now=now + secs(10))
    row = _worker(db, "w1")
    assert row is not None
    assert (row["in_flight"], row["last_heartbeat"], row["started_at"], row["kinds"]) == (
        5, now + secs(10), now, ["email", "sms"])
    assert count(db, "tock_workers") == 1


def test_stop_worker_marks_it_stopped_and_an_upsert_revives_it(job_store, db, now):
    job_store.upsert_worker(Worker("w1", "h", 1, ["default"], [], 4, 3), now=now)
    job_store.upsert_worker(Worker("w2", "h", 2, ["default"], [], 4, 1), now=now)
    job_store.stop_worker("w1", now=now + secs(20))
    row = _worker(db, "w1")
    assert row is not None and (row["stopped_at"], row["in_flight"]) == (now + secs(20), 0)
    other_row = _worker(db, "w2")
    assert other_row is not None and other_row["stopped_at"] is None
    job_store.upsert_worker(Worker("w1", "h", 1, ["default"], [], 4, 2), now=now + secs(30))
    row = _worker(db, "w1")
    assert row is not None and (row["stopped_at"], row["in_flight"]) == (None, 2)
    job_store.stop_worker("nobody", now=now)
    assert count(db, "tock_workers") == 2


# --- finish_attempts --------------------------------------------------------------------------


def _result(lease: Lease, state: JobState, outcome: AttemptOutcome, **kw: Any) -> AttemptResult:
    return AttemptResult(lease, state, outcome, **kw)


def test_finish_attempts_writes_success_with_its_attempt_row(job_store, db, now):
    lease = add_running(db, now, worker="w1", started_at=now - secs(4), run_at=now - secs(9),
                        last_error="earlier failure")
    written = job_store.finish_attempts(
        [_result(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w1", now=now)
    assert written == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"],
            row["updated_at"]) == ("succeeded", 1, now - secs(9), now, now)
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert row["last_error"] == "earlier failure", "no error: the last one is kept"
    assert attempt_rows(db, lease.job_id) == [{
        "job_id": lease.job_id, "attempt": 1, "worker": "w1", "started_at": now - secs(4),
        "finished_at": now, "outcome": "succeeded", "error": None, "traceback": None}]


def test_finish_attempts_retrying_runs_again_after_the_delay(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=2)
    assert job_store.finish_attempts(
        [_result(lease, JobState.RETRYING, AttemptOutcome.FAILED, delay_seconds=7.5,
                 error="boom", traceback="Traceback ...")], "w1", now=now) == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"],
            row["last_error"]) == ("retrying", 2, now + secs(7.5), None, "boom")
    assert [(r["attempt"], r["outcome"], r["error"], r["traceback"])
            for r in attempt_rows(db, lease.job_id)] == [
        (2, "failed", "boom", "Traceback ...")]


def test_finish_attempts_dead_is_finished(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=3)
    job_store.finish_attempts([_result(lease, JobState.DEAD, AttemptOutcome.PERMANENT,
                                       error="bad address")], "w1", now=now)
    row = job_row(db, lease.job_id)
    assert (row["state"], row["finished_at"], row["last_error"]) == ("dead", now, "bad address")
    assert [r["outcome"] for r in attempt_rows(db, lease.job_id)] == ["permanent"]


def test_finish_attempts_refund_gives_the_attempt_back(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=2)
    assert job_store.finish_attempts(
        [_result(lease, JobState.SCHEDULED, AttemptOutcome.RELEASED, refund=True,
                 error="worker shutting down")], "w1", now=now) == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"]) == (
        "scheduled", 1, now, None)
    assert [(r["attempt"], r["outcome"]) for r in attempt_rows(db, lease.job_id)] == [
        (2, "released")], "the attempt row still says which attempt was released"


@pytest.mark.parametrize("case", ["worker", "attempt", "token", "state"])
def test_finish_attempts_is_fenced_on_worker_attempt_token_and_state(job_store, db, now, case):
    good = add_running(db, now, worker="w1")
    lost = add_running(db, now, worker="w1", attempt=2)
    sent, worker = lost, "w1"
    if case == "worker":
        db.execute("UPDATE tock_jobs SET lease_owner = 'w2' WHERE id = %s", (lost.job_id,))
    elif case == "attempt":
        sent = Lease(lost.job_id, 3, lost.token)
    elif case == "token":
        sent = Lease(lost.job_id, lost.attempt, uuid4())
    else:
        db.execute("UPDATE tock_jobs SET state = 'cancelled' WHERE id = %s", (lost.job_id,))
    before = job_row(db, lost.job_id)
    written = job_store.finish_attempts(
        [_result(good, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
         _result(sent, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], worker, now=now)
    assert written == {good.job_id}
    assert job_row(db, lost.job_id) == before
    assert attempt_rows(db, lost.job_id) == []
    assert [r["job_id"] for r in attempt_rows(db)] == [good.job_id], \
        "one attempt row per written job"


def test_finish_attempts_of_another_worker_writes_nothing(job_store, db, now):
    lease = add_running(db, now, worker="w1")
    assert job_store.finish_attempts(
        [_result(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w2", now=now) == set()
    assert job_row(db, lease.job_id)["state"] == "running"
    assert attempt_rows(db) == []

