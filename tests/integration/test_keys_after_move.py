"""Idempotency keys after a job moved to the history (migration 0007): `schedule(key=K)`
keeps returning the job wherever it is, with no window while it moves, also when two
producers race the move on connections of their own; a recurring slot's run key never
makes a second run once the first finished; a retry keeps the key; a key whose job's day
expired is free again."""

from __future__ import annotations

import threading
from datetime import UTC, timedelta
from typing import Any

import psycopg
import pytest

from shared.client import Client
from shared.core.states import AttemptOutcome, JobState
from shared.runtime.settings import ClientSettings
from shared.schedules.slots import slot_key
from shared.store import JobStore
from shared.store.retention_store import RetentionStore
from shared.store.rows import AttemptResult, Lease, NewJob, SlotJob
from tests.integration.store.helpers import (
    add_finished,
    add_job,
    add_running,
    keys,
    run_blocked,
    side_of,
)
from tests.support.wait import wait_for
from timer_service.scheduler import Scheduler

M = timedelta(minutes=1)


def _finish(store: JobStore, lease: Lease, now) -> set[int]:
    return store.finish_attempts([AttemptResult(lease, JobState.SUCCEEDED,
                                                AttemptOutcome.SUCCEEDED)], "w1", now=now)


def _jobs_with_key(db, key: str) -> list[int]:
    return [r[0] for r in db.execute("SELECT id FROM tock_jobs_all WHERE unique_key = %s",
                                     (key,))]


def test_schedule_with_a_key_returns_the_job_after_it_moved(client, job_store, db, now):
    first = client.schedule("email", {"n": 1}, key="welcome:1")
    db.execute("UPDATE tock_jobs SET state = 'running', attempt = 1, lease_owner = 'w1', "
               "dispatch_token = gen_random_uuid() WHERE id = %s", (first.id,))
    token = db.execute("SELECT dispatch_token FROM tock_jobs WHERE id = %s",
                       (first.id,)).fetchone()[0]
    _finish(job_store, Lease(first.id, 1, token), now)
    assert side_of(db, first.id) != "hot"
    again = client.schedule("email", {"n": 2}, key="welcome:1")
    assert (again.id, again.created, again.state) == (first.id, False, JobState.SUCCEEDED)
    many = client.schedule_many([{"kind": "email", "key": "welcome:1"},
                                 {"kind": "email", "key": "welcome:2"}])
    assert [(j.id == first.id, j.created) for j in many] == [(True, False), (False, True)]
    assert _jobs_with_key(db, "welcome:1") == [first.id]


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_producers_during_an_uncommitted_move_find_the_job(
        client, db, other, now, outcome):
    lease = add_running(db, now, unique_key="k")
    assert _finish(JobStore.on(other), lease, now) == {lease.job_id}  # moved, not committed
    during = client.schedule("k2", key="k")  # the old row is still what others see
    getattr(other, outcome)()
    after = client.schedule("k2", key="k")
    assert (during.id, during.created) == (after.id, after.created) == (lease.job_id, False)
    assert after.state is (JobState.SUCCEEDED if outcome == "commit" else JobState.RUNNING)
    assert _jobs_with_key(db, "k") == [lease.job_id]


def test_a_producer_waits_for_a_concurrent_insert_of_the_key_then_finds_it(
        client, db, other, now):
    JobStore.on(other).insert_jobs([NewJob("theirs", "default", "{}", unique_key="k")],
                                   now=now)
    ours = run_blocked(db, other, lambda: client.schedule("ours", key="k"), other.commit)
    assert (ours.kind, ours.created) == ("theirs", False)


def test_producers_racing_moves_never_make_a_second_job(database_url, db, now):
    """Each round: one connection moves a keyed job to the history (its outcome) while two
    producers, each on a pool of its own, schedule the same key at the same instant."""
    rounds = 25
    leases = [add_running(db, now, unique_key=f"race-{i}") for i in range(rounds)]
    mover_conn = psycopg.connect(database_url, autocommit=True)
    mover = JobStore.on(mover_conn)
    producers = [Client(ClientSettings(database_url=database_url)) for _ in range(2)]
    errors: list[BaseException] = []
    got: dict[int, list[int]] = {i: [] for i in range(rounds)}
    try:
        for i, lease in enumerate(leases):
            start = threading.Barrier(3)

            def produce(c: Client, i: int = i, start: threading.Barrier = start) -> None:
                try:
                    start.wait()
                    job = c.schedule("race", key=f"race-{i}")
                    assert not job.created
                    got[i].append(job.id)
                except BaseException as exc:  # re-raised below
                    errors.append(exc)

            threads = [threading.Thread(target=produce, args=(c,)) for c in producers]
            for t in threads:
                t.start()
            start.wait()
            _finish(mover, lease, now)
            for t in threads:
                t.join(timeout=30)
    finally:
        for c in producers:
            c.close()
        mover_conn.close()
    assert not errors, errors
    for i, lease in enumerate(leases):
        assert got[i] == [lease.job_id] * 2
        assert _jobs_with_key(db, f"race-{i}") == [lease.job_id]
        assert side_of(db, lease.job_id) != "hot"


def test_a_job_older_than_the_keys_table_keeps_its_key_while_the_timer_moves_it(
        client, db, other, now):
    legacy = add_job(db, run_at=now, state="dead", finished_at=now, unique_key="legacy")
    db.execute("DELETE FROM tock_keys")  # as before migration 0007
    mover = RetentionStore.on(other)
    (picked,) = mover.pick_finished(JobState.DEAD, 10)  # its key's row written, uncommitted
    assert client.schedule("x", key="legacy").id == legacy  # no wait: the row is still hot
    keep = {s: now - timedelta(days=30) for s in (JobState.SUCCEEDED, JobState.DEAD,
                                                  JobState.CANCELLED)}
    assert mover.move_finished([picked], keep) == (1, 1)
    other.commit()
    assert side_of(db, legacy) != "hot"
    again = client.schedule("x", key="legacy")
    assert (again.id, again.created, again.state) == (legacy, False, JobState.DEAD)
    assert keys(db) == {"legacy": legacy}


def test_a_recurring_slot_never_runs_twice_once_its_run_moved(
        client, job_store, schedule_store, db, now):
    client.recurring("pulse", "ping", every=60, now=now - 5 * M)
    assert Scheduler(schedule_store, lookahead_seconds=0).step(now) >= 1
    (job_id, key) = db.execute("SELECT id, unique_key FROM tock_jobs "
                               "WHERE schedule_name = 'pulse' ORDER BY run_at LIMIT 1").fetchone()
    db.execute("UPDATE tock_jobs SET state = 'running', attempt = 1, lease_owner = 'w1', "
               "dispatch_token = gen_random_uuid() WHERE id = %s", (job_id,))
    token = db.execute("SELECT dispatch_token FROM tock_jobs WHERE id = %s",
                       (job_id,)).fetchone()[0]
    _finish(job_store, Lease(job_id, 1, token), now)
    slot = db.execute("SELECT run_at FROM tock_jobs_all WHERE id = %s", (job_id,)).fetchone()[0]
    assert key == slot_key("pulse", slot)
    # A timer that lost its cursor (or raced another one) makes the same slot again.
    assert schedule_store.insert_slot_jobs([SlotJob("pulse", slot, key)]) == []
    db.execute("UPDATE tock_schedules SET cursor_at = %s - interval '1 second', "
               "next_slot = %s, next_fire_at = %s", (slot, slot, slot))
    Scheduler(schedule_store, lookahead_seconds=0).step(now)
    assert _jobs_with_key(db, key) == [job_id]
    runs = client.schedule_runs("pulse")
    assert [r.state for r in runs if r.job_id == job_id] == ["succeeded"]


def test_a_retried_job_keeps_its_key(client, db, now):
    dead = add_finished(db, state="dead", finished_at=now, unique_key="r")
    retried = client.retry(dead)
    assert retried.state is JobState.SCHEDULED and side_of(db, dead) == "hot"
    assert client.schedule("x", key="r").id == dead
    assert keys(db) == {"r": dead}


def test_a_key_whose_day_expired_is_free_again_before_its_keys_are_pruned(
        client, database, db, now):
    old = add_finished(db, state="succeeded", finished_at=now, unique_key="old")
    store = RetentionStore(database)
    # Its day is detached (past retention); the retention loop has not freed its keys yet.
    store.expire_partition(JobState.SUCCEEDED, now.astimezone(UTC).date())
    assert keys(db) == {"old": old}
    fresh = client.schedule("again", key="old")
    assert fresh.created and fresh.id != old
    assert keys(db) == {"old": fresh.id}
    (table,) = store.expired_tables()
    store.prune_expired(table, 100)
    assert keys(db) == {"old": fresh.id}, "the pruner frees only the expired job's key"


def test_batches_sharing_keys_in_opposite_orders_do_not_deadlock(client, db, other, now):
    """Keys are locked as their rows go in. Batch 1 [a, c, b] holds a and waits for c (held
    by an open transaction); batch 2 [b, a] takes b and waits for a. When c is let go,
    batch 1 would wait for b: a deadlock, unless both take their keys in one order."""
    JobStore.on(other).insert_jobs([NewJob("held", "default", "{}", unique_key="c")], now=now)
    results: dict[str, Any] = {}

    def batch(name: str, keys: list[str]) -> None:
        try:
            results[name] = client.schedule_many([{"kind": name, "key": k} for k in keys])
        except Exception as exc:  # reported below
            results[name] = exc

    def waiting() -> int:
        return db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                          "'Lock' AND application_name = 'tock-client'").fetchone()[0]

    first = threading.Thread(target=batch, args=("one", ["a", "c", "b"]))
    first.start()
    wait_for(lambda: waiting() == 1, timeout=10, interval=0.005, message="batch 1 waits")
    second = threading.Thread(target=batch, args=("two", ["b", "a"]))
    second.start()
    wait_for(lambda: waiting() == 2, timeout=10, interval=0.005, message="batch 2 waits")
    other.rollback()  # c is free: batch 1 goes on
    first.join(15)
    second.join(15)
    assert not isinstance(results["one"], Exception), results["one"]
    assert not isinstance(results["two"], Exception), results["two"]
    one, two = ({j.unique_key: j for j in results[n]} for n in ("one", "two"))
    for key in ("a", "b"):
        assert one[key].id == two[key].id and one[key].created != two[key].created
        assert len(_jobs_with_key(db, key)) == 1
    assert one["c"].created


def test_a_batch_keeps_its_input_order_in_ids_with_keys_and_without(client):
    jobs = client.schedule_many([{"kind": "k", "key": "z"}, {"kind": "k"},
                                 {"kind": "k", "key": "a"}, {"kind": "k"}])
    assert [j.unique_key for j in jobs] == ["z", None, "a", None]
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
