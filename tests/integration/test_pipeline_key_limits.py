"""Concurrency limits per (kind, key): `set_limit("kind_key", kind, max_running=N)` lets at
most N jobs of each concurrency key of the kind be dispatched or running at once, across
the fleet; jobs of the kind without a key are not counted. A key with a big backlog at its
limit does not hold the other keys back. Real timer and consumer code, real Postgres, real
SQS; time is pinned through `now=` and `clock`."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest

from shared.core.errors import InvalidInput
from shared.core.states import JobState
from shared.ops import explain
from shared.store.operator_store import OperatorStore
from tests.support.drive import dispatch, race_timers, receive, run_all, timer_running
from tests.support.wait import wait_for
from timer_service.service import Timer


def _in_flight_by_key(db, kind: str = "k") -> Counter[str | None]:
    rows = db.execute("SELECT concurrency_key, count(*) FROM tock_jobs WHERE kind = %s AND "
                      "state IN ('dispatched', 'running') GROUP BY 1", (kind,)).fetchall()
    return Counter({r[0]: r[1] for r in rows})


def test_each_key_runs_at_most_its_limit_and_jobs_without_a_key_run_freely(
        client, db, timer, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    client.set_limit("kind_key", "k", max_running=1)
    jobs = [client.schedule("k", concurrency_key=key)
            for key in ["a", "a", "a", "b", "b", "c", None, None]]
    assert dispatch(timer, clock.now) == 3 + 2, "one per key, and both without a key"
    assert dispatch(timer, clock.now) == 0
    assert _in_flight_by_key(db) == Counter({"a": 1, "b": 1, "c": 1, None: 2})
    consumer = consumers(clock)
    run_all(consumer, receive(consumer, 5))
    assert dispatch(timer, clock.now) == 2, "a and b have a job each left"
    run_all(consumer, receive(consumer, 2))
    assert dispatch(timer, clock.now) == 1
    run_all(consumer, receive(consumer, 1))
    assert {client.get(j.id).state for j in jobs} == {JobState.SUCCEEDED}


def test_a_key_with_a_backlog_at_its_limit_does_not_hold_the_others_back(
        client, db, timer, clock):
    client.set_limit("kind_key", "k", max_running=2)
    client.schedule_many([{"kind": "k", "concurrency_key": "big"} for _ in range(500)])
    assert dispatch(timer, clock.now) == 2
    later = clock.now + timedelta(seconds=1)
    small = client.schedule("k", concurrency_key="small", at=later)
    assert dispatch(timer, later) == 1, "small's job goes at once, past big's 498"
    assert client.get(small.id).state is JobState.DISPATCHED


def test_many_keys_share_the_batches_in_turn(client, db, timer_settings, transport, clock):
    client.set_limit("kind_key", "k", max_running=1)
    client.schedule_many([{"kind": "k", "concurrency_key": f"key-{i:03}"}
                          for i in range(300)])
    small = Timer(timer_settings.model_copy(update={"batch_size": 50}), transport)
    try:
        sent = [small.run_once(clock.now).dispatched for _ in range(8)]
    finally:
        small.close()
    assert sum(sent) == 300 and max(_in_flight_by_key(db).values()) == 1
    assert sent[:6] == [50] * 6, "every pass fills its batch from the keys after the last"


def test_a_lowered_key_limit_lets_running_jobs_finish(client, db, timer, registry,
                                                       consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    client.set_limit("kind_key", "k", max_running=3)
    for _ in range(5):
        client.schedule("k", concurrency_key="a")
    assert dispatch(timer, clock.now) == 3
    consumer = consumers(clock)
    entries = receive(consumer, 3)
    client.set_limit("kind_key", "k", max_running=1)
    run_all(consumer, entries[:2])
    assert dispatch(timer, clock.now) == 0, "1 running, limit 1"
    run_all(consumer, entries[2:])
    assert dispatch(timer, clock.now) == 1


def test_an_expired_lease_frees_its_keys_slot(client, db, timer, consumers, clock):
    client.set_limit("kind_key", "k", max_running=1)
    first, second = (client.schedule("k", concurrency_key="a") for _ in range(2))
    worker = consumers(clock)
    assert dispatch(timer, clock.now) == 1
    receive(worker, 1)  # claimed, then the worker dies: no heartbeat, no outcome
    assert timer.run_once(clock.now + timedelta(seconds=29)).dispatched == 0
    result = timer.run_once(clock.now + timedelta(seconds=31))
    assert result.rescued == 1 and result.dispatched == 1, "the rescue freed the slot"
    states = sorted(client.get(j.id).state for j in (first, second))
    assert states == sorted([JobState.DISPATCHED, JobState.RETRYING])


def test_two_timers_together_never_go_over_a_keys_limit(client, db, timer_settings,
                                                          transport, clock):
    client.set_limit("kind_key", "k", max_running=2)
    client.schedule_many([{"kind": "k", "concurrency_key": f"key-{i % 5}"}
                          for i in range(100)])
    race_timers(timer_settings.model_copy(update={"batch_size": 3}), transport, clock.now)
    assert _in_flight_by_key(db) == Counter({f"key-{i}": 2 for i in range(5)})


def test_explain_names_the_key_a_due_job_waits_for(client, database, timer, clock):
    client.set_limit("kind_key", "k", max_running=1)
    jobs = [client.schedule("k", concurrency_key="acct-7") for _ in range(3)]
    free = client.schedule("k", concurrency_key="acct-8")
    dispatch(timer, clock.now)
    waiting = next(j for j in jobs if client.get(j.id).state is JobState.SCHEDULED)
    store = OperatorStore(database)
    with store.transaction() as tx:
        job = client.get(waiting.id)
        found = explain.explain(job, explain.gather(tx, job))
    assert ("waiting for a concurrency slot of kind k key 'acct-7' (1/1 running)"
            in found.summary)
    assert "2 due job(s) of kind k key 'acct-7' are waiting for it." in found.details
    assert client.get(free.id).state is JobState.DISPATCHED
    (limit,) = client.limits()
    assert (limit.scope, limit.in_flight, limit.keys_at_limit, limit.waiting) == (
        "kind_key", 2, 2, 2)


def test_at_most_n_per_key_run_at_once_across_two_live_consumers(
        client, timer_settings, transport, registry, running):
    lock, now_running, peak = threading.Lock(), Counter[str](), Counter[str]()

    def slow(payload, ctx):
        key = payload["account"]
        with lock:
            now_running[key] += 1
            peak[key] = max(peak[key], now_running[key])
        ctx.cancelled.wait(0.1)  # a handler doing work for a while
        with lock:
            now_running[key] -= 1

    registry.add("sync", slow)
    client.set_limit("kind_key", "sync", max_running=1)
    jobs = client.schedule_many([{"kind": "sync", "payload": {"account": a},
                                  "concurrency_key": a} for a in ["x", "y"] * 4])
    running(concurrency=4)
    running(concurrency=4)
    with timer_running(timer_settings.model_copy(update={"max_idle_seconds": 0.2}), transport):
        wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED for j in jobs),
                 timeout=30, message="all 8 jobs succeeded")
    assert peak == Counter({"x": 1, "y": 1}), "8 free slots, one per account"


@pytest.mark.parametrize("limit, message", [
    (dict(max_running=1, rate=5), "takes max_running only"),
    (dict(rate=5), "takes max_running only"),
    (dict(max_running=-1), "max_running must be between 0"),
])
def test_a_kind_key_limit_takes_max_running_only(client, limit, message):
    with pytest.raises(InvalidInput, match=message):
        client.set_limit("kind_key", "k", **limit)


@pytest.mark.parametrize("key, message", [
    ("", "concurrency_key must be a non-empty string"),
    (7, "concurrency_key must be a non-empty string"),
    ("x" * 256, "concurrency_key must be at most 255 characters"),
])
def test_a_bad_concurrency_key_is_refused(client, key, message):
    with pytest.raises(InvalidInput, match=message):
        client.schedule("k", concurrency_key=key)
