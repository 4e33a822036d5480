"""Conformance of `OperatorStore` (shared.store.operator_store / operator_sql) against the
real Postgres: listing and counting by filter, bulk batches (with their state re-check),
statistics, workers, the timeline and the facts behind `explain`."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest

from shared.core.filters import JobFilter, action_states
from shared.core.reports import QueueKindStats
from shared.core.states import JobState
from shared.schedules.spec import make_spec
from shared.store.rows import Cursor
from tests.integration.store.helpers import (
    add_job,
    add_running,
    insert_row,
    job_row,
    run_blocked,
    secs,
)
from tests.support.drive import db_now

M = timedelta(minutes=1)
RETRY = action_states("retry")
CANCEL = action_states("cancel")


def test_database_now_is_the_database_clock(operator_store, db):
    before = db_now(db)
    value = operator_store.database_now()
    assert before <= value <= db_now(db)
    assert value.tzinfo is not None


# --- list_jobs / count_matching ---------------------------------------------------------------


@pytest.fixture
def listed(db, now) -> dict[str, int]:
    """Five jobs created a minute apart (j1 oldest)."""
    jobs = {
        "j1": add_job(db, run_at=now, kind="a", queue="q1", tenant="t1"),
        "j2": add_job(db, run_at=now, kind="b", state="dead"),
        "j3": add_job(db, run_at=now, kind="a", state="dead", unique_key="k3"),
        "j4": add_job(db, run_at=now, kind="a", state="succeeded", queue="q2"),
        "j5": add_job(db, run_at=now, kind="a", tenant="t2"),
    }
    for i, job_id in enumerate(jobs.values()):
        db.execute("UPDATE tock_jobs SET created_at = %s WHERE id = %s",
                   (now - (5 - i) * M, job_id))
    return jobs


def _listed(store, where: JobFilter, limit: int = 50, before_id: int | None = None
            ) -> list[int]:
    return [j.id for j in store.list_jobs(where, limit=limit, before_id=before_id)]


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, ["j5", "j4", "j3", "j2", "j1"]),
    ({"kind": "a"}, ["j5", "j4", "j3", "j1"]),
    ({"states": "dead"}, ["j3", "j2"]),
    ({"states": ["dead", "scheduled"]}, ["j5", "j3", "j2", "j1"]),
    ({"queue": "q2"}, ["j4"]),
    ({"tenant": "t1"}, ["j1"]),
    ({"key": "k3"}, ["j3"]),
    ({"kind": "a", "states": "dead"}, ["j3"]),
    ({"kind": "nope"}, []),
])
def test_list_jobs_filters_newest_first(operator_store, listed, fields, expected):
    assert _listed(operator_store, JobFilter.of(**fields)) == [listed[j] for j in expected]


def test_list_jobs_filters_on_creation_time(operator_store, listed, now):
    after = JobFilter.of(created_after=now - 3 * M)
    before = JobFilter.of(created_before=now - 3 * M)
    assert _listed(operator_store, after) == [listed[j] for j in ("j5", "j4", "j3")]
    assert _listed(operator_store, before) == [listed[j] for j in ("j2", "j1")]


def test_list_jobs_pages_with_a_keyset_cursor(operator_store, listed):
    where = JobFilter.of(kind="a")
    page1 = operator_store.list_jobs(where, limit=2)
    assert [j.id for j in page1] == [listed["j5"], listed["j4"]]
    page2 = _listed(operator_store, where, limit=2, before_id=page1[-1].id)
    assert page2 == [listed["j3"], listed["j1"]]
    assert _listed(operator_store, where, limit=2, before_id=listed["j1"]) == []


def test_list_jobs_returns_whole_jobs(operator_store, job_store, listed):
    (job,) = operator_store.list_jobs(JobFilter.of(key="k3"), limit=1)
    assert job == job_store.get_job(listed["j3"])


@pytest.mark.parametrize(("fields", "only", "expected"), [
    ({"kind": "a"}, RETRY, ["j3"]),
    ({}, RETRY, ["j2", "j3"]),
    ({}, CANCEL, ["j1", "j5"]),
    ({"states": ["dead", "scheduled"]}, RETRY, ["j2", "j3"]),
    ({"states": "succeeded"}, RETRY, []),
    ({"tenant": "nobody"}, CANCEL, []),
])
def test_count_matching_counts_the_filter_within_the_action_states(
        operator_store, listed, fields, only, expected):
    # The bound is the newest job's id, matching or not: jobs created later stay out, and
    # an older one that comes to match before the action is in.
    assert operator_store.count_matching(JobFilter.of(**fields), only, cap=100) == (
        len(expected), False, max(listed.values()))


def test_count_matching_stops_counting_past_its_cap_and_still_bounds_by_the_newest_id(
        operator_store, listed):
    newest = max(listed.values())
    assert operator_store.count_matching(JobFilter(), CANCEL, cap=1) == (1, True, newest)
    assert operator_store.count_matching(JobFilter(), CANCEL, cap=2) == (2, False, newest)


# --- bulk_batch -------------------------------------------------------------------------------


def _finished(db, now, state: str, kind: str = "a") -> int:
    return add_job(db, run_at=now - 10 * M, kind=kind, state=state, attempt=3,
                   lease_owner="w1", dispatch_token=uuid4(), finished_at=now - M,
                   last_error="boom", dispatched_at=now - 3 * M, started_at=now - 2 * M,
                   dispatch_failures=1)


def test_bulk_batch_retry_goes_in_id_order_in_batches(operator_store, db, now):
    d1, d2 = _finished(db, now, "dead"), _finished(db, now, "dead")
    c1 = _finished(db, now, "cancelled")
    d3 = _finished(db, now, "dead")
    other_kind = _finished(db, now, "dead", kind="b")
    scheduled = add_job(db, run_at=now, kind="a")
    untouched = {j: job_row(db, j) for j in (other_kind, scheduled)}
    where = JobFilter.of(kind="a")
    before = db_now(db)
    first = operator_store.bulk_batch("retry", where, RETRY, after=0, up_to_id=None,
                                      batch_size=2)
    assert sorted(first) == [d1, d2]
    second = operator_store.bulk_batch("retry", where, RETRY, after=max(first),
                                       up_to_id=c1, batch_size=2)
    assert second == [c1], "nothing above up_to_id"
    assert operator_store.bulk_batch("retry", where, RETRY, after=c1, up_to_id=None,
                                     batch_size=2) == [d3]
    assert operator_store.bulk_batch("retry", where, RETRY, after=d3, up_to_id=None,
                                     batch_size=2) == []
    for job_id in (d1, d2, c1, d3):
        row = job_row(db, job_id)
        assert (row["state"], row["attempt"], row["lease_owner"], row["lease_expires_at"],
                row["dispatch_token"], row["finished_at"], row["last_error"],
                row["started_at"], row["dispatched_at"], row["dispatch_failures"]) == (
            "scheduled", 0, None, None, None, None, None, None, None, 0)
        assert before <= row["run_at"] <= db_now(db)
    assert {j: job_row(db, j) for j in untouched} == untouched


def test_bulk_batch_cancel_cancels_only_unfinished_jobs(operator_store, db, now):
    unfinished = [add_job(db, run_at=now, state=s)
                  for s in ("scheduled", "retrying", "dispatched", "running")]
    finished = [_finished(db, now, s) for s in ("succeeded", "dead", "cancelled")]
    before = {j: job_row(db, j) for j in finished}
    changed = operator_store.bulk_batch("cancel", JobFilter.of(), CANCEL, after=0,
                                        up_to_id=None, batch_size=100)
    assert sorted(changed) == unfinished
    for job_id in unfinished:
        row = job_row(db, job_id)
        assert row["state"] == "cancelled" and row["finished_at"] is not None
    assert {j: job_row(db, j) for j in finished} == before


def test_bulk_batch_applies_only_to_the_action_states_whatever_the_filter(
        operator_store, db, now):
    dead = _finished(db, now, "dead")
    running = add_running(db, now).job_id
    before = job_row(db, running)
    changed = operator_store.bulk_batch("retry", JobFilter.of(states=["dead", "running"]),
                                        RETRY, after=0, up_to_id=None, batch_size=10)
    assert changed == [dead]
    assert job_row(db, running) == before


def test_bulk_batch_rechecks_the_state_of_a_row_changed_while_it_waited(
        operator_store, db, other, now):
    raced = _finished(db, now, "dead")
    dead = _finished(db, now, "dead")
    # Another transaction takes the dead job back to running (retried and claimed by w9)
    # and has not committed when the bulk retry reaches the row.
    other.execute("UPDATE tock_jobs SET state = 'running', lease_owner = 'w9' WHERE id = %s",
                  (raced,))
    changed = run_blocked(db, other, lambda: operator_store.bulk_batch(
        "retry", JobFilter.of(), RETRY, after=0, up_to_id=None, batch_size=10), other.commit)
    assert changed == [dead]
    row = job_row(db, raced)
    assert (row["state"], row["lease_owner"], row["attempt"]) == ("running", "w9", 3)


# --- queue_stats / counts_by_state_kind -------------------------------------------------------


def test_queue_stats_counts_unfinished_work_per_queue_and_kind(operator_store, db, now):
    add_job(db, run_at=now - secs(30), queue="q1", kind="a")
    add_job(db, run_at=now - secs(10), queue="q1", kind="a", state="retrying")
    add_job(db, run_at=now + secs(60), queue="q1", kind="a")
    add_job(db, run_at=now - secs(50), queue="q1", kind="a", state="dispatched")
    add_job(db, run_at=now - secs(100), queue="q1", kind="a", state="running")
    add_job(db, run_at=now - secs(500), queue="q1", kind="b", state="running")
    add_job(db, run_at=now + secs(5), queue="q2", kind="a", state="retrying")
    add_job(db, run_at=now + secs(5), queue="q2", kind="c", state="dispatched")
    for state in ("succeeded", "dead", "cancelled"):
        add_job(db, run_at=now - secs(900), queue="q3", kind="a", state=state)
    assert operator_store.queue_stats(now=now) == [
        QueueKindStats("q1", "a", due=2, dispatched=1, running=1, future=1,
                       oldest_due_age_seconds=50.0),
        QueueKindStats("q1", "b", 0, 0, 1, 0, 0.0),
        QueueKindStats("q2", "a", 0, 0, 0, 1, 0.0),
        QueueKindStats("q2", "c", 0, 1, 0, 0, 0.0),  # dispatched ahead of its run_at: not < 0
    ]


def test_queue_stats_of_no_unfinished_work_is_empty(operator_store, db, now):
    add_job(db, run_at=now, state="succeeded")
    assert operator_store.queue_stats(now=now) == []


def test_counts_by_state_kind_counts_only_the_states_asked(operator_store, db, now):
    for state, kind in (("succeeded", "a"), ("succeeded", "a"), ("dead", "a"), ("dead", "b"),
                        ("running", "a"), ("scheduled", "b"), ("running", "a")):
        add_job(db, run_at=now, state=state, kind=kind)
    assert operator_store.counts_by_state_kind([JobState.RUNNING, JobState.SCHEDULED]) == {
        ("running", "a"): 2, ("scheduled", "b"): 1}
    assert operator_store.counts_by_state_kind([JobState.RETRYING]) == {}
    # Finished rows left in tock_jobs (by an earlier version) count as finished ones.
    assert operator_store.finished_counts([JobState.SUCCEEDED, JobState.DEAD]) == ({
        ("succeeded", "a"): 2, ("dead", "a"): 1, ("dead", "b"): 1}, set())
    with pytest.raises(ValueError, match="finished_counts"):
        operator_store.counts_by_state_kind([JobState.DEAD])


# --- workers ----------------------------------------------------------------------------------


def test_workers_are_alive_stale_or_stopped_live_ones_first(operator_store, db, now):
    def worker(worker_id: str, heartbeat: timedelta, stopped: timedelta | None = None) -> None:
        insert_row(db, "tock_workers", id=worker_id, host="h", pid=7, queues=["default"],
                   concurrency=4, in_flight=1, started_at=now - 3 * 60 * M,
                   last_heartbeat=now - heartbeat,
                   stopped_at=None if stopped is None else now - stopped)

    worker("stale", secs(60))
    worker("stopped", secs(10), stopped=secs(10))
    worker("alive", secs(5))
    worker("long-gone", 2 * 60 * M, stopped=2 * 60 * M)
    worker("beat-since", -secs(0.2))  # committed after the reading transaction began
    infos = operator_store.workers(stale_after_seconds=30, now=now)
    assert [(w.id, w.status, w.heartbeat_age_seconds) for w in infos] == [
        ("beat-since", "alive", 0.0), ("alive", "alive", 5.0), ("stale", "stale", 60.0),
        ("stopped", "stopped", 10.0)]
    infos = infos[1:]
    alive = infos[0]
    assert (alive.host, alive.pid, alive.queues, alive.concurrency, alive.in_flight,
            alive.started_at, alive.last_heartbeat, alive.stopped_at) == (
        "h", 7, ["default"], 4, 1, now - 3 * 60 * M, now - secs(5), None)
    assert infos[2].stopped_at == now - secs(10)


def test_a_worker_is_stale_once_its_own_lease_expires_or_after_the_bound(
        operator_store, db, now):
    """kill -9 under 3 s leases: stale 3 s after its last beat (when the timer rescues its
    jobs), not after the 30 s bound; the bound still covers a long lease and a row written
    before worker leases (no lease_expires_at)."""
    def worker(worker_id: str, heartbeat: float, lease: float | None) -> None:
        insert_row(db, "tock_workers", id=worker_id, host="h", pid=7, queues=["default"],
                   concurrency=4, in_flight=1, started_at=now - 3 * 60 * M,
                   last_heartbeat=now - secs(heartbeat),
                   lease_expires_at=None if lease is None else now - secs(heartbeat - lease))

    worker("killed", heartbeat=4, lease=3)  # its lease ran out 1 s ago
    worker("beating", heartbeat=1, lease=3)
    worker("long-lease", heartbeat=45, lease=600)  # silent past the bound
    worker("no-lease", heartbeat=5, lease=None)
    worker("no-lease-silent", heartbeat=40, lease=None)
    status = {w.id: w.status for w in operator_store.workers(stale_after_seconds=30, now=now)}
    assert status == {"killed": "stale", "beating": "alive", "long-lease": "stale",
                      "no-lease": "alive", "no-lease-silent": "stale"}
    infos = operator_store.workers(stale_after_seconds=30, now=now)
    assert [w.status for w in infos] == ["alive", "alive", "stale", "stale", "stale"], (
        "live ones first")
    # The same worker just before its lease ran out was alive.
    earlier = {w.id: w.status for w in operator_store.workers(stale_after_seconds=30,
                                                              now=now - secs(1.5))}
    assert earlier["killed"] == "alive"


# --- throughput / latency ---------------------------------------------------------------------


def test_throughput_counts_finished_attempts_per_bucket_and_outcome(operator_store, db, now):
    job = add_job(db, run_at=now, state="dead")
    for finished, outcome in ((secs(10), "succeeded"), (secs(70), "failed"),
                              (secs(75), "failed"), (secs(119), "lease_expired"),
                              (secs(180), "succeeded"), (secs(-1), "succeeded")):
        insert_row(db, "tock_attempts", job_id=job, attempt=1, finished_at=now + finished,
                   outcome=outcome)
    rows = operator_store.throughput(now, now + secs(180), 60)
    assert sorted(rows) == [(0, "succeeded", 1), (1, "failed", 2), (1, "lease_expired", 1)]


def test_latency_gives_start_lag_and_run_time_percentiles_of_succeeded_jobs(
        operator_store, db, now):
    def job(run_at: float, started: float | None, finished: float,
            state: str = "succeeded") -> None:
        add_job(db, run_at=now + secs(run_at), state=state, created_at=now - secs(3600),
                started_at=None if started is None else now + secs(started),
                finished_at=now + secs(finished))

    job(0, 1, 3)  # bucket 0: lag 1, run 2
    job(0, 3, 7)  # bucket 0: lag 3, run 4
    job(70, 65, 75)  # bucket 1: started before its run_at: lag 0, run 10
    job(0, 1, 10, state="dead")
    job(0, None, 10)
    job(0, 1, 200)  # after `until`
    job(-100, -90, -1)  # before `since`
    stats = operator_store.latency(now, now + secs(180), 60)
    assert set(stats) == {0, 1}
    assert stats[0] == (2, pytest.approx(2.0), pytest.approx(2.9), pytest.approx(3.0),
                        pytest.approx(3.9))
    assert stats[1] == (1, pytest.approx(0.0), pytest.approx(0.0), pytest.approx(10.0),
                        pytest.approx(10.0))


# --- due_ahead / schedule_of -----------------------------------------------------------------


def test_due_ahead_counts_due_jobs_the_timer_takes_first(operator_store, job_store, db, now):
    target_id = add_job(db, run_at=now - secs(10), priority=5)
    add_job(db, run_at=now - secs(1), priority=9)  # higher priority
    add_job(db, run_at=now - secs(20), priority=5)  # same priority, older
    add_job(db, run_at=now - secs(5), priority=6, state="retrying")  # higher, retrying
    add_job(db, run_at=now - secs(5), priority=5)  # newer
    add_job(db, run_at=now - secs(10), priority=5)  # same run_at: not ahead
    add_job(db, run_at=now - secs(100), priority=4)  # lower priority
    add_job(db, run_at=now + secs(10), priority=9)  # not due
    add_job(db, run_at=now - secs(100), priority=9, state="dispatched")  # already sent
    target = job_store.get_job(target_id)
    assert operator_store.due_ahead(target, now) == 3


def test_schedule_of_names_the_schedule_that_made_the_job_and_its_state(
        operator_store, schedule_store, db, now):
    for name in ("paused", "running"):
        schedule_store.insert(make_spec(name, "report", every=60),
                              Cursor(now, now + M, now + M), now)
    db.execute("UPDATE tock_schedules SET paused = true WHERE name = 'paused'")
    of_paused = add_job(db, run_at=now, schedule_name="paused")
    of_running = add_job(db, run_at=now, schedule_name="running")
    of_deleted = add_job(db, run_at=now, schedule_name="gone")
    plain = add_job(db, run_at=now)
    assert operator_store.schedule_of(of_paused) == ("paused", True, False)
    assert operator_store.schedule_of(of_running) == ("running", False, False)
    assert operator_store.schedule_of(of_deleted) == ("gone", False, True)
    assert operator_store.schedule_of(plain) is None
    assert operator_store.schedule_of(plain + 1000) is None


def test_a_stale_or_stopped_worker_shows_the_jobs_it_still_holds_not_its_last_report(
        operator_store, db, now):
    """A worker killed with 8 jobs in hand last reported 8; once the timer rescued them it
    holds none, and `tock workers` and the dashboard say so instead of "8/8 busy"."""
    for worker_id, heartbeat in (("killed", 60), ("alive", 1)):
        insert_row(db, "tock_workers", id=worker_id, host="h", pid=7, queues=["default"],
                   concurrency=8, in_flight=8, started_at=now - 3 * 60 * M,
                   last_heartbeat=now - secs(heartbeat))
    held = add_running(db, now, worker="killed")
    add_running(db, now, worker="alive")
    busy = {w.id: w.in_flight for w in operator_store.workers(stale_after_seconds=30, now=now)}
    assert busy == {"alive": 8, "killed": 1}, "alive: its report; killed: what it holds"
    db.execute("UPDATE tock_jobs SET state = 'retrying', lease_owner = NULL WHERE id = %s",
               (held.job_id,))
    busy = {w.id: w.in_flight for w in operator_store.workers(stale_after_seconds=30, now=now)}
    assert busy == {"alive": 8, "killed": 0}
