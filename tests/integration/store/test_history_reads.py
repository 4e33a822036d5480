"""Conformance of the operator's and the schedules' statements over both sides (migration
0007): listing and counting by filter with keyset pages across the hot table and the
history, bulk retry bringing jobs back and bulk cancel moving them, the counts, the
timeline, the paused-schedule fact behind `explain`, and a schedule's runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from psycopg import sql as pgsql

from shared.core.filters import JobFilter, action_states
from shared.core.states import FINAL_STATES, JobState
from shared.schedules.spec import make_spec
from shared.store.operator_store import OperatorStore
from shared.store.rows import Cursor
from tests.integration.store.helpers import (
    add_finished,
    add_history_attempt,
    add_job,
    attempt_sides,
    insert_row,
    job_row,
    keys,
    secs,
    side_of,
)
from tests.support.history import fill_history

M = timedelta(minutes=1)
RETRY = action_states("retry")
CANCEL = action_states("cancel")


@pytest.fixture
def mixed(db, now) -> dict[str, int]:
    """Jobs on both sides, ids interleaved: h* in the history, u* unfinished, s1 a finished
    job still in tock_jobs (older than migration 0007)."""
    return {
        "h1": add_finished(db, state="dead", finished_at=now - M, kind="a", queue="q1"),
        "u1": add_job(db, run_at=now, kind="a", queue="q1", tenant="t1"),
        "h2": add_finished(db, state="succeeded", finished_at=now, kind="b", unique_key="k2"),
        "s1": add_job(db, run_at=now, kind="a", state="dead", finished_at=now - M),
        "h3": add_finished(db, state="cancelled", finished_at=now, kind="a", tenant="t1"),
        "u2": add_job(db, run_at=now, kind="b", state="running", lease_owner="w1"),
    }


def _ids(store, where: JobFilter, limit: int = 50, before_id: int | None = None) -> list[int]:
    return [j.id for j in store.list_jobs(where, limit=limit, before_id=before_id)]


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, ["u2", "h3", "s1", "h2", "u1", "h1"]),
    ({"kind": "a"}, ["h3", "s1", "u1", "h1"]),
    ({"states": "dead"}, ["s1", "h1"]),
    ({"states": ["cancelled", "running"]}, ["u2", "h3"]),
    ({"queue": "q1"}, ["u1", "h1"]),
    ({"tenant": "t1"}, ["h3", "u1"]),
    ({"key": "k2"}, ["h2"]),
])
def test_list_jobs_reads_both_sides_newest_first(operator_store, mixed, fields, expected):
    assert _ids(operator_store, JobFilter.of(**fields)) == [mixed[j] for j in expected]


def test_list_jobs_pages_across_both_sides(operator_store, mixed):
    seen, cursor = [], None
    while True:
        page = _ids(operator_store, JobFilter(), limit=2, before_id=cursor)
        if not page:
            break
        seen += page
        cursor = page[-1]
    assert seen == sorted(mixed.values(), reverse=True)


def test_list_jobs_returns_history_jobs_whole(operator_store, job_store, mixed):
    (job,) = operator_store.list_jobs(JobFilter.of(key="k2"), limit=1)
    assert job == job_store.get_job(mixed["h2"])


def test_count_matching_counts_both_sides(operator_store, mixed):
    count = operator_store.count_matching
    newest = max(mixed.values())  # on either side: the bound of a later action
    assert count(JobFilter(), RETRY, cap=10) == (3, False, newest)
    assert count(JobFilter.of(kind="a"), CANCEL, cap=10) == (1, False, newest)
    assert count(JobFilter.of(kind="zzz"), RETRY, cap=10) == (0, False, newest)


def test_count_matching_caps_the_sum_of_both_sides(operator_store, mixed):
    # Three retryable jobs across the two sides, each side counted to at most cap + 1.
    assert operator_store.count_matching(JobFilter(), RETRY, cap=2) == (
        2, True, max(mixed.values()))


def test_bulk_batch_retry_brings_history_jobs_back_in_id_order(operator_store, db, now):
    dead = [add_finished(db, state="dead", finished_at=now, kind="a", unique_key=f"d{i}")
            for i in range(3)]
    straggler = add_job(db, run_at=now - M, kind="a", state="cancelled", finished_at=now)
    add_history_attempt(db, dead[0], attempt=1, outcome="failed", finished_at=now)
    where = JobFilter.of(kind="a")
    first = operator_store.bulk_batch("retry", where, RETRY, after=0, up_to_id=None,
                                      batch_size=2)
    assert sorted(first) == dead[:2]
    rest = operator_store.bulk_batch("retry", where, RETRY, after=max(first),
                                     up_to_id=None, batch_size=2)
    assert sorted(rest) == [dead[2], straggler]
    for job_id in (*dead, straggler):
        assert side_of(db, job_id) == "hot"
        row = job_row(db, job_id)
        assert (row["state"], row["attempt"], row["finished_at"]) == ("scheduled", 0, None)
    assert attempt_sides(db, dead[0])[0][1] == "hot"
    assert keys(db) == {f"d{i}": j for i, j in enumerate(dead)}


def test_bulk_batch_retry_stops_at_up_to_id(operator_store, db, now):
    early, late = (add_finished(db, state="dead", finished_at=now) for _ in range(2))
    done = operator_store.bulk_batch("retry", JobFilter(), RETRY, after=0, up_to_id=early,
                                     batch_size=10)
    assert done == [early]
    assert side_of(db, late) != "hot"


def test_bulk_batch_cancel_moves_jobs_to_the_history(operator_store, db, now):
    jobs = [add_job(db, run_at=now, state=s, unique_key=f"c{i}")
            for i, s in enumerate(("scheduled", "dispatched", "running"))]
    done_dead = add_finished(db, state="dead", finished_at=now)
    changed = operator_store.bulk_batch("cancel", JobFilter(), CANCEL, after=0,
                                        up_to_id=None, batch_size=10)
    assert sorted(changed) == jobs
    for job_id in jobs:
        assert side_of(db, job_id).startswith("tock_history_jobs_cancelled_")
        assert job_row(db, job_id)["state"] == "cancelled"
    assert job_row(db, done_dead)["state"] == "dead"


def test_counts_add_up_both_sides(operator_store, mixed):
    unfinished = [s for s in JobState if s not in FINAL_STATES]
    assert operator_store.counts_by_state_kind(unfinished) == {
        ("scheduled", "a"): 1, ("running", "b"): 1}
    assert operator_store.finished_counts(FINAL_STATES) == ({
        ("dead", "a"): 2, ("succeeded", "b"): 1, ("cancelled", "a"): 1}, set())


def _leaf(db) -> str:
    (leaf,) = db.execute("""
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'tock_history_jobs_succeeded'::regclass
          AND EXISTS (SELECT 1 FROM tock_history_jobs_succeeded s
                      WHERE s.tableoid = c.oid)""").fetchone()
    return leaf


def test_finished_counts_past_the_bound_come_from_the_statistics(operator_store, db, now):
    fill_history(db, n=200, kind="a", at=now)
    fill_history(db, n=100, kind="b", at=now)
    exact = {("succeeded", "a"): 200, ("succeeded", "b"): 100}
    assert operator_store.finished_counts([JobState.SUCCEEDED], exact_up_to=300) == (
        exact, set())
    db.execute(pgsql.SQL("ANALYZE {}").format(pgsql.Identifier(_leaf(db))))
    # Analyzed: the row count and the kinds' shares come from the statistics, unread.
    assert operator_store.finished_counts([JobState.SUCCEEDED], exact_up_to=50) == (
        exact, {"succeeded"})


def test_finished_counts_of_a_never_analyzed_big_partition_are_sampled(
        operator_store, db, now):
    fill_history(db, n=30_000, kind="a", at=now)
    counts, estimated = operator_store.finished_counts([JobState.SUCCEEDED],
                                                       exact_up_to=3000)
    assert estimated == {"succeeded"} and set(counts) == {("succeeded", "a")}
    # Whole pages sampled and scaled: near the truth whatever the planner guessed.
    assert 15_000 <= counts[("succeeded", "a")] <= 60_000


def test_throughput_and_latency_read_the_history(operator_store, db, now):
    moved = add_finished(db, state="succeeded", finished_at=now + secs(70),
                         run_at=now + secs(60), started_at=now + secs(65))
    add_history_attempt(db, moved, attempt=1, outcome="failed", finished_at=now + secs(10))
    add_history_attempt(db, moved, attempt=2, outcome="succeeded", finished_at=now + secs(70))
    hot = add_job(db, run_at=now, state="retrying")
    insert_row(db, "tock_attempts", job_id=hot, attempt=1, finished_at=now + secs(20),
               outcome="failed")
    assert sorted(operator_store.throughput(now, now + secs(120), 60)) == [
        (0, "failed", 2), (1, "succeeded", 1)]
    stats = operator_store.latency(now, now + secs(120), 60)
    assert stats[1][:3] == (1, pytest.approx(5.0), pytest.approx(5.0))


def test_the_schedule_of_a_job_in_the_history(operator_store, schedule_store, db, now):
    schedule_store.insert(make_spec("nightly", "report", every=60), Cursor(now, now + M, now + M),
                          now)
    db.execute("UPDATE tock_schedules SET paused = true")
    moved = add_finished(db, state="succeeded", finished_at=now, schedule_name="nightly")
    assert operator_store.schedule_of(moved) == ("nightly", True, False)


def test_schedule_runs_read_both_sides_newest_slot_first(schedule_store, db, now):
    schedule_store.insert(make_spec("pulse", "ping", every=60), Cursor(now, now + M, now + M),
                          now)
    done = [add_finished(db, state="succeeded", finished_at=now - (3 - i) * M,
                         run_at=now - (3 - i) * M, schedule_name="pulse",
                         unique_key=f"pulse:{i}") for i in range(3)]
    pending = add_job(db, run_at=now + M, schedule_name="pulse", unique_key="pulse:3")
    runs = schedule_store.runs("pulse", 3)
    assert [r.job_id for r in runs] == [pending, done[2], done[1]]
    assert [r.state for r in runs] == ["scheduled", "succeeded", "succeeded"]


def test_finished_counts_skip_a_partition_dropped_while_they_read(database, db, now):
    """The retention loop may drop a day between the listing of the partitions and the
    count of one: that day is skipped, the rest still counted, in the same transaction."""

    class DroppedMeanwhile(OperatorStore):
        def _history_leaves(self, states):
            return [("tock_history_jobs_succeeded_p19990101", "succeeded", 10.0),
                    *super()._history_leaves(states)]

    fill_history(db, n=5, kind="a", at=now)
    store = DroppedMeanwhile(database)
    with store.transaction() as tx:
        assert tx.finished_counts([JobState.SUCCEEDED]) == ({("succeeded", "a"): 5}, set())
        assert tx.database_now() is not None, "the transaction is still usable"
