"""The core pipeline, one step at a time: real timer and consumer code, real Postgres, real
SQS (LocalStack). Time is pinned through `now=` (timer) and `clock` (consumer), so lease,
backoff and due-time logic is tested without waiting."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from consumer.tasks import Registry
from shared.core.errors import Permanent, TransportError
from shared.core.messages import JobMessage
from shared.core.states import AttemptOutcome, JobState
from tests.support.drive import Clock, db_now, dispatch, make_consumer, receive, run_all
from tests.support.wait import wait_for
from timer_service.service import Timer


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _attempts(db, job_id: int) -> list[tuple[Any, ...]]:
    return db.execute("SELECT attempt, worker, outcome FROM tock_attempts WHERE job_id = %s "
                      "ORDER BY id", (job_id,)).fetchall()


def _queue_empty(transport) -> bool:
    attrs = transport.client.get_queue_attributes(
        QueueUrl=transport.url("default"),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return attrs["ApproximateNumberOfMessages"] == "0" and \
        attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


@pytest.fixture
def timer(timer_settings, transport):
    t = Timer(timer_settings, transport)
    yield t
    t.close()


@pytest.fixture
def registry():
    return Registry()


@pytest.fixture
def clock(db):
    # A little ahead of the database clock, so jobs enqueued "now" by the test are due.
    return Clock(db_now(db) + timedelta(seconds=2))


@pytest.fixture
def consumers(consumer_settings, registry, transport):
    made = []

    def make(clock=None, **overrides):
        c = make_consumer(consumer_settings, registry, transport, clock, **overrides)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _dispatched(db) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT id FROM tock_jobs WHERE state = 'dispatched' ORDER BY id")]


def test_claim_order_is_priority_then_due_time_and_delay_is_respected(
        client, db, timer_settings, transport, clock):
    timer = Timer(timer_settings.model_copy(update={"batch_size": 2}), transport)
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


def test_failures_retry_with_backoff_then_go_dead(client, db, timer, registry, consumers,
                                                  clock):
    calls = []

    def always_fails(payload, ctx):
        calls.append(ctx.attempt)
        raise RuntimeError(f"boom {ctx.attempt}")

    registry.add("fails", always_fails)
    job = client.schedule("fails", max_attempts=3)
    consumer = consumers(clock)
    for attempt in (1, 2, 3):
        assert dispatch(timer, clock.now) == 1
        run_all(consumer, receive(consumer, 1))
        row = client.get(job.id)
        if attempt < 3:
            assert row.state is JobState.RETRYING
            delay = (row.run_at - clock.now).total_seconds()
            assert 0.5 <= delay <= 1, "equal jitter: at least half of the 1 s step (and cap)"
            clock.advance(2)
    final = client.get(job.id, with_attempts=True)
    assert calls == [1, 2, 3]
    assert final.state is JobState.DEAD
    assert "giving up" in (final.last_error or "")
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED] * 3
    assert [a.attempt for a in final.attempts] == [1, 2, 3]
    assert final.attempts[-1].traceback and "RuntimeError: boom 3" in final.attempts[-1].traceback


def test_permanent_error_is_not_retried(client, timer, registry, consumers, clock):
    def refuses(payload, ctx):
        raise Permanent("bad address")

    registry.add("perm", refuses)
    job = client.schedule("perm", max_attempts=5)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD and final.attempt == 1
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.PERMANENT]
    assert "bad address" in (final.last_error or "")


def test_expired_lease_is_reclaimed_and_stale_worker_cannot_overwrite(
        client, db, timer, registry, consumers, clock):
    results = []
    registry.add("work", lambda payload, ctx: results.append(ctx.attempt))
    job = client.schedule("work", max_attempts=3)
    worker_a = consumers(clock)
    dispatch(timer, clock.now)
    stale_entries = receive(worker_a, 1)  # A claims, then stalls (no heartbeat)
    assert client.get(job.id).lease_owner == worker_a.worker_id

    assert timer.run_once(clock.now + timedelta(seconds=29)).rescued == 0, "lease still valid"
    rescue_at = clock.now + timedelta(seconds=31)
    assert timer.run_once(rescue_at).rescued == 1
    rescued = client.get(job.id)
    assert rescued.state is JobState.RETRYING and "stopped heartbeating" in rescued.last_error

    clock_b = Clock(rescue_at + timedelta(seconds=5))
    worker_b = consumers(clock_b)
    assert dispatch(timer, clock_b.now) == 1
    run_all(worker_b, receive(worker_b, 1))
    assert client.get(job.id).state is JobState.SUCCEEDED

    # A wakes up and finishes: its fenced completion matches nothing.
    stale_before = _metric("tock_stale_completions_total")
    run_all(worker_a, stale_entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED and final.attempt == 2
    assert [(a.attempt, a.worker, a.outcome) for a in final.attempts] == [
        (1, worker_a.worker_id, AttemptOutcome.LEASE_EXPIRED),
        (2, worker_b.worker_id, AttemptOutcome.SUCCEEDED),
    ]
    assert results == [2, 1], "A ran too (at-least-once), but only B's result was written"
    assert _metric("tock_stale_completions_total") == stale_before + 1


def test_lease_expiry_on_the_last_attempt_is_dead(client, timer, registry, consumers, clock):
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work", max_attempts=1)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    receive(consumer, 1)
    assert timer.run_once(clock.now + timedelta(seconds=31)).rescued == 1
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.LEASE_EXPIRED]


def test_heartbeats_keep_a_job_alive_past_its_lease(client, timer, registry, consumers, clock):
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 1)
    started = clock.now
    for _ in range(4):  # 4 beats, 20 s apart: 80 s in all on a 30 s lease
        clock.advance(20)
        assert consumer.heartbeat_once() == (1, 0)
        assert timer.run_once(clock.now + timedelta(seconds=25)).rescued == 0
    assert clock.now - started > timedelta(seconds=30)
    run_all(consumer, entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.SUCCEEDED]


def test_cancelling_a_running_job_signals_the_handler_and_drops_its_result(
        client, timer, registry, consumers, clock):
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 1)
    item = entries[0][0]
    client.cancel(job.id)
    assert consumer.heartbeat_once() == (0, 1)
    assert item.context.cancelled.is_set() and item.lease_lost
    run_all(consumer, entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.CANCELLED and final.attempts == ()


def test_unknown_kind_is_retried_with_backoff_then_runs_where_a_handler_is(
        client, timer, registry, consumers, clock):
    # A rolling deploy: this consumer does not know the new kind yet; the next one does.
    registry.add("known", lambda payload, ctx: None)
    job = client.schedule("new.kind", max_attempts=3)
    old = consumers(clock)
    dispatch(timer, clock.now)
    run_all(old, receive(old, 1))
    waiting = client.get(job.id, with_attempts=True)
    assert waiting.state is JobState.RETRYING
    assert "no handler for kind 'new.kind'" in waiting.last_error and "known" in waiting.last_error
    delay = (waiting.run_at - clock.now).total_seconds()
    assert 15 <= delay <= 30, "unknown_kind_backoff_seconds (30) with its floor of half"
    assert [a.outcome for a in waiting.attempts] == [AttemptOutcome.NO_HANDLER]
    registry.add("new.kind", lambda payload, ctx: None)
    new = consumers(Clock(clock.advance(31)))
    dispatch(timer, clock.now)
    run_all(new, receive(new, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED and final.attempt == 2


def test_unknown_kind_goes_dead_after_its_last_attempt(client, timer, registry, consumers,
                                                       clock):
    job = client.schedule("mystery", max_attempts=1)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD
    assert "no handler for kind 'mystery'" in final.last_error
    assert "giving up" in final.last_error
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.NO_HANDLER]


def test_forged_stale_and_malformed_messages_change_nothing(
        client, db, timer, transport, registry, consumers, clock):
    ran = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    waiting = client.schedule("work", delay=3600)
    dispatched = client.schedule("work")
    dispatch(timer, clock.now)
    current = client.get(dispatched.id)
    import uuid
    bodies = [
        "not json at all",
        '{"v": 99, "job": 1, "token": "x", "kind": "work"}',
        '["a list"]',
        JobMessage(987654, uuid.uuid4(), "work").encode(),            # unknown job
        JobMessage(waiting.id, uuid.uuid4(), "work").encode(),        # forged: not dispatched
        JobMessage(dispatched.id, uuid.uuid4(), "work").encode(),     # stale token
    ]
    transport.send_batch("default", [(str(i), b) for i, b in enumerate(bodies)])
    before = {r: _metric("tock_messages_dropped_total", reason=r)
              for r in ("malformed", "unknown_job", "stale_token")}
    consumer = consumers(clock)
    entries: list[Any] = []
    for _ in range(20):  # until every message was received and dealt with
        got = receive(consumer, 7, rounds=1)
        run_all(consumer, got)
        entries += got
        if _queue_empty(transport):
            break
    assert [e[0].job_id for e in entries] == [dispatched.id], "only the real message claims"
    assert ran == [dispatched.id]
    assert client.get(waiting.id).state is JobState.SCHEDULED
    after_claim = client.get(dispatched.id)
    assert after_claim.state is JobState.SUCCEEDED and after_claim.attempt == 1
    assert after_claim.dispatch_token == current.dispatch_token
    assert _metric("tock_messages_dropped_total", reason="malformed") == before["malformed"] + 3
    assert _metric("tock_messages_dropped_total", reason="unknown_job") == \
        before["unknown_job"] + 1
    assert _metric("tock_messages_dropped_total", reason="stale_token") == \
        before["stale_token"] + 2
    assert _queue_empty(transport), "dropped messages are deleted"


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


class _RefuseSome:
    def __init__(self, inner, refuse: set[str]) -> None:
        self.inner, self.refuse = inner, refuse

    def send_batch(self, queue, entries):
        from shared.transport.base import EntryFailure
        ok = [e for e in entries if e[0] not in self.refuse]
        self.inner.send_batch(queue, ok)
        return [EntryFailure(e[0], "Throttled", "slow down") for e in entries
                if e[0] in self.refuse]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_entries_sqs_refuses_stay_due_with_the_error(client, timer_settings, transport, clock):
    first, second = client.schedule("k"), client.schedule("k")
    timer = Timer(timer_settings, _RefuseSome(transport, {str(second.id)}))
    try:
        result = timer.run_once(clock.now)
    finally:
        timer.close()
    assert (result.dispatched, result.refused) == (1, 1)
    assert client.get(first.id).state is JobState.DISPATCHED
    refused = client.get(second.id)
    assert refused.state is JobState.SCHEDULED and refused.dispatch_token is None
    assert "Throttled" in refused.last_error


class _VisibilityFails:
    def __init__(self, inner) -> None:
        self.inner = inner

    def change_visibility_batch(self, queue, receipts, timeout_seconds):
        raise TransportError("SQS ChangeMessageVisibilityBatch failed: InvalidParameterValue")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_visibility_extension_failure_is_counted_and_db_lease_stays_authority(
        client, timer, transport, registry, consumer_settings, clock):
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work")
    consumer = make_consumer(consumer_settings, registry, _VisibilityFails(transport), clock)
    try:
        dispatch(timer, clock.now)
        entries = receive(consumer, 1)
        before = _metric("tock_sqs_errors_total", operation="ChangeMessageVisibilityBatch")
        clock.advance(20)
        assert consumer.heartbeat_once() == (1, 0)
        assert _metric("tock_sqs_errors_total", operation="ChangeMessageVisibilityBatch") == \
            before + 1
        assert timer.run_once(clock.now + timedelta(seconds=25)).rescued == 0
        run_all(consumer, entries)
        assert client.get(job.id).state is JobState.SUCCEEDED
    finally:
        consumer.close()


def test_dispatched_job_nobody_claims_is_sent_again_with_a_new_token(
        client, timer, transport, registry, consumers, clock):
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work")
    dispatch(timer, clock.now)
    first_token = client.get(job.id).dispatch_token
    # The message is lost (e.g. purged); the job sits in dispatched.
    transport.client.purge_queue(QueueUrl=transport.url("default"))
    later = clock.now + timedelta(seconds=timer.settings.dispatch_timeout_seconds + 1)
    result = timer.run_once(later)
    assert result.redispatched == 1 and result.dispatched == 1
    again = client.get(job.id)
    assert again.state is JobState.DISPATCHED and again.dispatch_token != first_token
    consumer = consumers(Clock(later))
    run_all(consumer, receive(consumer, 1))
    assert client.get(job.id).state is JobState.SUCCEEDED


def test_handler_past_its_timeout_is_signalled_and_counts_as_failure(
        client, timer, registry, consumers):
    registry.add("hangs", lambda payload, ctx: ctx.cancelled.wait(30))
    job = client.schedule("hangs", timeout=0.3, max_attempts=2)
    consumer = consumers()
    dispatch(timer)
    consumer.start()
    try:
        wait_for(lambda: client.get(job.id).state is JobState.RETRYING, timeout=20)
    finally:
        consumer.stop_flag.set()
        consumer.shutdown()
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert "timed out after 0.3 s" in final.last_error


def test_shutdown_releases_unfinished_jobs_for_others_at_once(
        client, db, timer, transport, registry, consumers):
    started = threading.Event()

    def stubborn(payload, ctx):
        started.set()
        ctx.cancelled.wait(30)

    registry.add("long", stubborn)
    job = client.schedule("long")
    consumer = consumers(shutdown_grace_seconds=0.5)
    dispatch(timer)
    consumer.start()
    assert started.wait(20)
    consumer.stop_flag.set()
    consumer.shutdown()
    released = client.get(job.id, with_attempts=True)
    assert released.state is JobState.SCHEDULED
    assert released.attempt == 0, "a release gives the attempt back"
    assert released.lease_owner is None
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert wait_for(lambda: _queue_empty(transport), message="released message deleted")
    assert dispatch(timer) == 1, "due again at once"


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
