"""Concurrency and rate limits, from the timer's side, with real consumers: at most N jobs
of a kind (or a tenant) dispatched or running across the fleet, the rest waiting in
Postgres; a slot comes back when a job finishes or its worker's lease expires; a lowered
limit lets the running jobs finish; two timers together never go over; a rate limit
dispatches as tokens come. Real timer and consumer code, real Postgres, real SQS
(LocalStack); time is pinned through `now=` and `clock`."""

from __future__ import annotations

import threading
from datetime import timedelta

from shared.core.states import JobState
from shared.ops import explain
from shared.store.operator_store import OperatorStore
from shared.transport.base import EntryFailure
from tests.support.drive import dispatch, race_timers, receive, run_all, timer_running
from tests.support.wait import wait_for
from timer_service.service import Timer


def _in_flight(db, kind: str = "k") -> int:
    return db.execute("SELECT count(*) FROM tock_jobs WHERE kind = %s AND state IN "
                      "('dispatched', 'running')", (kind,)).fetchone()[0]


def test_a_kind_limit_holds_the_rest_in_postgres_until_slots_free(
        client, db, timer, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    registry.add("free", lambda payload, ctx: None)
    client.set_limit("kind", "k", max_running=3)
    jobs = [client.schedule("k") for _ in range(8)]
    others = [client.schedule("free") for _ in range(4)]
    assert dispatch(timer, clock.now) == 3 + 4, "the limit holds k only"
    assert dispatch(timer, clock.now) == 0
    assert _in_flight(db) == 3
    consumer = consumers(clock)
    entries = receive(consumer, 7)
    assert dispatch(timer, clock.now) == 0, "running jobs hold their slots"
    run_all(consumer, entries)
    assert dispatch(timer, clock.now) == 3, "finished jobs free theirs"
    run_all(consumer, receive(consumer, 3))
    assert dispatch(timer, clock.now) == 2
    run_all(consumer, receive(consumer, 2))
    states = {client.get(j.id).state for j in jobs + others}
    assert states == {JobState.SUCCEEDED}


def test_an_expired_lease_frees_its_slot(client, db, timer, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    client.set_limit("kind", "k", max_running=1)
    first, second = client.schedule("k"), client.schedule("k")
    worker = consumers(clock)
    assert dispatch(timer, clock.now) == 1
    receive(worker, 1)  # claimed, then the worker dies: no heartbeat, no outcome
    assert timer.run_once(clock.now + timedelta(seconds=29)).dispatched == 0
    result = timer.run_once(clock.now + timedelta(seconds=31))
    assert result.rescued == 1 and result.dispatched == 1, "the rescue freed the slot"
    states = {j.id: client.get(j.id).state for j in (first, second)}
    assert sorted(states.values()) == [JobState.DISPATCHED, JobState.RETRYING]


def test_a_lowered_limit_lets_running_jobs_finish_and_dispatches_no_more(
        client, db, timer, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    client.set_limit("kind", "k", max_running=3)
    for _ in range(6):
        client.schedule("k")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 3)
    client.set_limit("kind", "k", max_running=1)
    assert dispatch(timer, clock.now) == 0, "3 running, limit 1"
    run_all(consumer, entries[:2])
    assert dispatch(timer, clock.now) == 0, "1 running, limit 1"
    run_all(consumer, entries[2:])
    assert dispatch(timer, clock.now) == 1
    assert _in_flight(db) == 1


def test_a_tenant_limit_holds_only_that_tenant(client, db, timer, clock):
    client.set_limit("tenant", "acme", max_running=2)
    client.set_limit("tenant", None, max_running=1)
    for tenant in ["acme"] * 5 + ["other"] * 5 + [None] * 3:
        client.schedule("k", tenant=tenant)
    assert dispatch(timer, clock.now) == 2 + 5 + 1
    by_tenant = dict(db.execute("SELECT coalesce(tenant, ''), count(*) FROM tock_jobs WHERE "
                                "state = 'dispatched' GROUP BY 1").fetchall())
    assert by_tenant == {"acme": 2, "other": 5, "": 1}


def test_every_limit_listed_can_be_removed_by_the_key_it_is_listed_with(client):
    """limits() names the no-tenant limit '' (as the store keeps it); remove_limit refused
    '' ("must be a non-empty string"), so a loop over limits() failed on it."""
    client.set_limit("tenant", None, max_running=1)
    client.set_limit("kind", "k", max_running=3)
    listed = client.limits()
    assert sorted((lim.scope, lim.key) for lim in listed) == [("kind", "k"), ("tenant", "")]
    for limit in listed:
        assert client.remove_limit(limit.scope, limit.key)
    assert client.limits() == []
    client.set_limit("tenant", "", max_running=2)  # and set by it
    assert [(lim.scope, lim.key, lim.max_running) for lim in client.limits()] == [("tenant", "", 2)]


def test_two_timers_together_never_go_over_a_limit(client, db, timer_settings, transport,
                                                     clock):
    client.set_limit("kind", "k", max_running=7)
    for _ in range(200):
        client.schedule("k")
    race_timers(timer_settings.model_copy(update={"batch_size": 3}), transport, clock.now)
    assert _in_flight(db) == 7


def test_a_rate_limit_dispatches_as_tokens_come(client, db, timer, clock):
    client.set_limit("kind", "api", rate=2, per=1, burst=2)
    for _ in range(10):
        client.schedule("api")
    t = clock.now
    assert timer.run_once(t).dispatched == 2, "a full bucket: the burst"
    assert timer.run_once(t).dispatched == 0
    assert timer.run_once(t + timedelta(seconds=0.5)).dispatched == 1
    assert timer.run_once(t + timedelta(seconds=1.5)).dispatched == 2
    assert timer.run_once(t + timedelta(seconds=60)).dispatched == 2, "never past the burst"


def test_explain_says_which_limit_a_due_job_waits_for(client, db, database, timer, clock):
    client.set_limit("kind", "k", max_running=2)
    jobs = [client.schedule("k") for _ in range(4)]
    dispatch(timer, clock.now)
    waiting = next(j for j in jobs if client.get(j.id).state is JobState.SCHEDULED)
    store = OperatorStore(database)
    with store.transaction() as tx:
        job = client.get(waiting.id)
        story = explain.explain(job, explain.gather(tx, job))
    assert "waiting for a concurrency slot of kind k (2/2 running)" in story.summary
    # Both are only in SQS: 'running' counts them, which the details say (a walkthrough
    # read "2/2 running" with no consumer up as wrong).
    assert any("includes jobs sent to SQS that no consumer has started" in d
               for d in story.details), story.details
    client.set_limit("kind", "k", rate=1, per=60, burst=1)
    client.remove_limit("kind", "k")
    with store.transaction() as tx:
        assert explain.gather(tx, client.get(waiting.id)).held_by is None


def test_at_most_n_run_at_once_across_two_live_consumers(
        client, db, timer_settings, transport, registry, running):
    lock, now_running, peak = threading.Lock(), [0], [0]

    def slow(payload, ctx):
        with lock:
            now_running[0] += 1
            peak[0] = max(peak[0], now_running[0])
        ctx.cancelled.wait(0.2)  # a handler doing work for a while
        with lock:
            now_running[0] -= 1

    registry.add("slow", slow)
    client.set_limit("kind", "slow", max_running=2)
    jobs = [client.schedule("slow") for _ in range(8)]
    running(concurrency=4)
    running(concurrency=4)
    with timer_running(timer_settings.model_copy(update={"max_idle_seconds": 0.2}), transport):
        wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED for j in jobs),
                 timeout=30, message="all 8 jobs succeeded")
    assert peak[0] == 2, "8 free slots in the fleet, the limit is 2"


class _RefuseAll:
    """SQS refusing every entry (throttled)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def send_batch(self, queue, entries):
        return [EntryFailure(e[0], "Throttled", "slow down") for e in entries]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_refused_send_spends_no_rate_token(client, timer_settings, transport, clock):
    client.set_limit("kind", "api", rate=1, per=60, burst=2)
    for _ in range(3):
        client.schedule("api")
    refusing = Timer(timer_settings, _RefuseAll(transport))
    try:
        assert refusing.run_once(clock.now).refused == 2
    finally:
        refusing.close()
    (limit,) = client.limits()
    assert limit.tokens == 2.0, "nothing was sent: the bucket is still full"
