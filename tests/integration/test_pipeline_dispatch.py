"""The core pipeline, one step at a time, from the timer's side: the order jobs are claimed
and dispatched in, and the crash points around a dispatch (a timer dying after the send,
before the commit; a message received before the dispatch commits). Real timer and
consumer code, real Postgres, real SQS (LocalStack). Time is pinned through `now=` (timer)
and `clock` (consumer), so lease, backoff and due-time logic is tested without waiting."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest

from shared.core.states import JobState
from tests.support.drive import dispatch, receive, run_all
from tests.support.wait import wait_for
from timer_service.service import Timer


def _dispatched(db) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT id FROM tock_jobs WHERE state = 'dispatched' ORDER BY id")]


def test_claim_order_is_priority_then_due_time_and_delay_is_respected(
        client, db, timer_settings, transport, clock):
    # No consumer takes what is sent, and `now` jumps 30 s ahead: the dispatch window's
    # age would hold the tenant whenever a pass happens to recount it (every 20 ms).
    timer = Timer(timer_settings.model_copy(update={"batch_size": 2,
                                                    "dispatch_window_seconds": 0}), transport)
    t = clock.now
    low_old = client.schedule("k", at=t - timedelta(minutes=10), priority=0)
    high_new = client.schedule("k", at=t - timedelta(minutes=1), priority=9)
    mid = client.schedule("k", at=t - timedelta(minutes=5), priority=5)
    high_old = client.schedule("k", at=t - timedelta(minutes=2), priority=9)
    low_new = client.schedule("k", at=t - timedelta(minutes=9), priority=0)
    later = client.schedule("k", at=t + timedelta(seconds=30), priority=9)
    try:
        assert timer.run_once(t).dispatched == 2
        assert _dispatched(db) == sorted([high_old.id, high_new.id])
        assert timer.run_once(t).dispatched == 2
        assert _dispatched(db) == sorted([high_old.id, high_new.id, mid.id, low_old.id])
        assert timer.run_once(t).dispatched == 1
        assert low_new.id in _dispatched(db)
        assert timer.run_once(t + timedelta(seconds=29)).dispatched == 0, "not due yet"
        assert timer.run_once(t + timedelta(seconds=30)).dispatched == 1
        assert later.id in _dispatched(db)
    finally:
        timer.close()


class _SendThenCrash:
    """Sends for real, then dies before the dispatcher can commit (as a kill would)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def send_batch(self, queue, entries):
        self.inner.send_batch(queue, entries)
        raise SystemExit("timer killed after send, before commit")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_timer_dying_after_send_before_commit_loses_nothing_and_runs_once(
        client, db, timer_settings, transport, registry, consumers, clock):
    ran = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    job = client.schedule("work")
    crashing = Timer(timer_settings, _SendThenCrash(transport))
    with pytest.raises(SystemExit):
        crashing.run_once(clock.now)
    crashing.close()
    assert client.get(job.id).state is JobState.SCHEDULED, "the claim was rolled back"
    consumer = consumers(clock)
    assert receive(consumer, 1, rounds=3) == [], "the orphan message claims nothing"
    healthy = Timer(timer_settings, transport)
    try:
        assert dispatch(healthy, clock.now) == 1
    finally:
        healthy.close()
    run_all(consumer, receive(consumer, 1))
    assert ran == [job.id]
    assert client.get(job.id).state is JobState.SUCCEEDED


class _SendThenWait:
    """Sends, then holds the claiming transaction open until told to go on."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.sent = threading.Event()
        self.proceed = threading.Event()

    def send_batch(self, queue, entries):
        failures = self.inner.send_batch(queue, entries)
        self.sent.set()
        assert self.proceed.wait(30)
        return failures

    def __getattr__(self, name):
        return getattr(self.inner, name)


@contextmanager
def _dispatch_held_open(client, timer_settings, transport, clock):
    """A timer pass that has sent one job's message and not yet committed; the pass is
    let go when the block ends."""
    job = client.schedule("work")
    slow = _SendThenWait(transport)
    timer = Timer(timer_settings, slow)
    passing = threading.Thread(target=timer.run_once, args=(clock.now,))
    passing.start()
    try:
        assert slow.sent.wait(30)
        yield job, slow
    finally:
        slow.proceed.set()
        passing.join(30)
        timer.close()


def test_message_received_before_the_dispatch_commits_is_still_claimed(
        client, timer_settings, transport, registry, consumers, clock):
    registry.add("work", lambda payload, ctx: None)
    with _dispatch_held_open(client, timer_settings, transport, clock) as (job, slow):
        consumer = consumers(clock)
        claimed: list[int] = []
        receiving = threading.Thread(target=lambda: claimed.append(
            consumer.receive_once("default", wait_seconds=5)))
        receiving.start()
        wait_for(lambda: client.get(job.id).state is JobState.SCHEDULED, timeout=5)
        slow.proceed.set()
        receiving.join(30)
    assert claimed == [1]
    assert client.get(job.id).state is JobState.RUNNING


def test_claim_gives_up_waiting_on_a_slow_dispatch_and_the_message_comes_back(
        client, timer_settings, transport, registry, consumers, clock, monkeypatch):
    import shared.store.job_store as job_store_module

    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 100)
    registry.add("work", lambda payload, ctx: None)
    consumer = consumers(clock)
    with _dispatch_held_open(client, timer_settings, transport, clock) as (job, _):
        assert consumer.receive_once("default", wait_seconds=5) == 0, "deferred, not dropped"
    assert client.get(job.id).state is JobState.DISPATCHED
    run_all(consumer, receive(consumer, 1))
    assert client.get(job.id).state is JobState.SUCCEEDED
