"""Conformance of `JobStore` (shared.store.job_store / jobs_sql) against the real Postgres,
the timer's statements: the claim (due_levels, claim_tenants; the tenant side is in
test_job_store_fair_share.py), undo_dispatch, next_due_at, stuck_queues,
queue_expected, redispatch_stuck, expired_leases and rescue_expired. One test (or a small
parametrized group) per method, each guard of a guarded statement exercised on its own.
Rows are arranged and inspected with plain SQL on `db`; time is pinned through `now=` (the
database clock at the start of the test, plus offsets)."""

from __future__ import annotations

from uuid import uuid4

import pytest

from shared.core.reports import Worker
from shared.core.states import JobState
from shared.store import JobStore
from shared.store.rows import DueJob, ExpiredLease, Refused, Rescue
from tests.integration.store.helpers import (
    add_dispatched,
    add_job,
    add_running,
    attempt_rows,
    claim,
    count,
    job_row,
    secs,
)
from tests.support.drive import db_now

# --- claim (due_levels + claim_tenants) -----------------------------------------------------


def _ids(due: list[DueJob]) -> list[int]:
    return sorted(d.id for d in due)


def test_claim_takes_the_highest_priority_first_then_the_oldest(job_store, db, now):
    m = secs(60)
    low_old = add_job(db, run_at=now - 10 * m, priority=0)
    high_new = add_job(db, run_at=now - 1 * m, priority=9)
    mid = add_job(db, run_at=now - 5 * m, priority=5)
    high_old = add_job(db, run_at=now - 2 * m, priority=9)
    low_new = add_job(db, run_at=now - 9 * m, priority=0)
    later = add_job(db, run_at=now + secs(30), priority=9)
    mid_twin = add_job(db, run_at=now - 5 * m, priority=5)  # same run_at: id order
    order = [claim(job_store, 1, now) for _ in range(6)]
    assert [_ids(o) for o in order] == [[high_old], [high_new], [mid], [mid_twin], [low_old],
                                        [low_new]]
    assert claim(job_store, 10, now + secs(29)) == [], "not due yet"
    assert _ids(claim(job_store, 10, now + secs(30))) == [later]


def test_claim_respects_the_limit_across_levels(job_store, db, now):
    jobs = [add_job(db, run_at=now - secs(i), priority=i % 3) for i in range(1, 7)]
    first = claim(job_store, 4, now)
    assert len(first) == 4
    rest = claim(job_store, 4, now)
    assert sorted(_ids(first) + _ids(rest)) == sorted(jobs)


def test_claim_marks_jobs_dispatched_with_fresh_tokens(job_store, db, now):
    retrying = add_job(db, run_at=now - secs(5), state="retrying", kind="email", queue="mail",
                       attempt=1, created_at=now - secs(60))
    scheduled = add_job(db, run_at=now - secs(2), created_at=now - secs(1))
    for state in ("dispatched", "running", "succeeded", "dead", "cancelled"):
        add_job(db, run_at=now - secs(100), state=state)
    due = {d.id: d for d in claim(job_store, 10, now)}
    assert set(due) == {retrying, scheduled}, "only scheduled and retrying jobs are claimed"
    d = due[retrying]
    assert (d.kind, d.queue, d.prev_state, d.lag_seconds) == (
        "email", "mail", JobState.RETRYING, 5.0)
    assert due[scheduled].prev_state is JobState.SCHEDULED
    assert due[scheduled].lag_seconds == 1.0, \
        "enqueued after its run_at: late from the enqueue (columns.due_since)"
    assert due[retrying].token != due[scheduled].token
    for job_id, claimed in due.items():
        row = job_row(db, job_id)
        assert (row["state"], row["dispatch_token"], row["dispatched_at"],
                row["updated_at"]) == ("dispatched", claimed.token, now, now)


def test_claim_skips_a_row_another_transaction_holds(impatient, db, other, now):
    locked = add_job(db, run_at=now - secs(120))
    free = add_job(db, run_at=now - secs(60))
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (locked,))
    assert _ids(claim(JobStore.on(impatient), 10, now)) == [free]
    assert job_row(db, locked)["state"] == "scheduled"
    other.rollback()
    assert _ids(claim(JobStore.on(impatient), 10, now)) == [locked]


def test_claim_of_two_timers_side_by_side_takes_each_row_once(impatient, db, other, now):
    jobs = [add_job(db, run_at=now - secs(i)) for i in range(1, 6)]
    theirs = claim(JobStore.on(other), 3, now)  # not committed yet
    ours = claim(JobStore.on(impatient), 10, now)
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
    assert _ids(claim(job_store, 10, now)) == sorted([scheduled, retrying])
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
    assert claim(job_store, 10, now + secs(2)) == [], "waiting out the backoff"


def test_undo_dispatch_backs_off_per_failure_in_a_row_up_to_the_cap(job_store, db, now):
    job = add_job(db, run_at=now - secs(5))
    t = now
    for failures, delay in ((1, 2), (2, 4), (3, 8), (4, 10), (5, 10)):
        assert _ids(claim(job_store, 10, t)) == [job]
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
    worker = Worker("w1", "h", 1, ["default"], [], 4, 1)
    assert job_store.heartbeat(worker, [lease], 30, now=now) == {lease.job_id}
    rescued = job_store.rescue_expired(
        [Rescue(lease.job_id, 1, JobState.RETRYING, 0.0, "lease expired", "w1")], now=now)
    assert rescued == set()
    row = job_row(db, lease.job_id)
    assert (row["state"], row["lease_owner"]) == ("running", "w1")
    assert attempt_rows(db) == []


def test_a_live_workers_lease_covers_its_jobs_past_their_own(job_store, db, now):
    held = add_running(db, now, worker="w1", lease_until=now - secs(50))
    job_store.heartbeat(Worker("w1", "h", 1, ["default"], [], 4, 1), [held], 30,
                        now=now - secs(10))
    assert job_store.expired_leases(10, 3, now=now) == [], "w1's lease runs to now + 20"
    assert [e.job_id for e in job_store.expired_leases(10, 3, now=now + secs(21))] == [
        held.job_id]


def test_after_an_outage_a_worker_is_stale_only_once_it_had_a_whole_lease_to_renew(
        job_store, db, now):
    """`since_back`: seconds since the database came back. A worker with a 30 s lease whose
    lease ran out while nobody could renew one keeps its jobs until 30 s after that; a job
    of a worker with no row is not held."""
    held = add_running(db, now, worker="w1", lease_until=now - secs(50))
    job_store.heartbeat(Worker("w1", "h", 1, ["default"], [], 4, 1), [held], 30,
                        now=now - secs(40))  # expired 10 s ago
    orphan = add_running(db, now, worker="gone", lease_until=now - secs(1))
    found = [e.job_id for e in job_store.expired_leases(10, 3, now=now, since_back=29.0)]
    assert found == [orphan.job_id]
    found = [e.job_id for e in job_store.expired_leases(10, 3, now=now, since_back=31.0)]
    assert sorted(found) == sorted([held.job_id, orphan.job_id])
    assert len(job_store.expired_leases(10, 3, now=now)) == 2, "None: no outage"


def test_a_detached_job_expires_on_its_own_lease_whatever_its_worker(job_store, db, now):
    stuck = add_running(db, now, worker="w1", lease_until=now + secs(60))
    job_store.heartbeat(Worker("w1", "h", 1, ["default"], [], 4, 1), [stuck], 300, now=now)
    assert job_store.detach_lease(stuck, "w1", 5, now=now)
    assert job_store.expired_leases(10, 3, now=now + secs(4)) == []
    (found,) = job_store.expired_leases(10, 3, now=now + secs(6))
    assert found.job_id == stuck.job_id
    assert job_store.rescue_expired(
        [Rescue(stuck.job_id, 1, JobState.RETRYING, 0.0, "stuck", "w1")],
        now=now + secs(6)) == {stuck.job_id}


def test_a_detached_job_of_a_dead_worker_is_found_once(job_store, db, now):
    """A job its worker let go (Abandon, a stuck handler) whose worker then died matches
    both the dead worker's expired jobs and the detached ones: one rescue, not two (two
    `lease_expired` lines and two counts of tock_lease_expiries_total, seen under make
    run after a kill -9 of a consumer)."""
    let_go = add_running(db, now, worker="w1", lease_until=now + secs(60))
    job_store.heartbeat(Worker("w1", "h", 1, ["default"], [], 4, 1), [let_go], 3, now=now)
    assert job_store.detach_lease(let_go, "w1", 3, now=now)
    found = job_store.expired_leases(10, 3, now=now + secs(10))  # w1 silent since now
    assert [e.job_id for e in found] == [let_go.job_id]


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
