"""The core pipeline, one step at a time, through what SQS carries and refuses: forged,
stale and malformed messages, entries SQS refuses, a failed visibility extension and a
message lost in the queue. Real timer and consumer code, real Postgres, real SQS
(LocalStack). Time is pinned through `now=` (timer) and `clock` (consumer), so lease,
backoff and due-time logic is tested without waiting."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import timedelta
from typing import Any

from shared.core.errors import TransportError
from shared.core.messages import JobMessage
from shared.core.states import JobState
from shared.transport.base import Outgoing
from tests.integration.readings import metric, queue_empty
from tests.support.drive import Clock, dispatch, make_consumer, receive, run_all
from timer_service.service import Timer


def test_forged_stale_and_malformed_messages_change_nothing(
        client, db, timer, transport, registry, consumers, clock, caplog):
    caplog.set_level(logging.INFO, logger="tock.consumer")
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
    transport.send_batch("default", [Outgoing(str(i), b) for i, b in enumerate(bodies)])
    before = {r: metric("tock_messages_dropped_total", reason=r)
              for r in ("malformed", "unknown_job", "stale_token")}
    consumer = consumers(clock)
    entries: list[Any] = []
    for _ in range(20):  # until every message was received and dealt with
        got = receive(consumer, 7, rounds=1)
        run_all(consumer, got)
        entries += got
        if queue_empty(transport):
            break
    assert [e[0].job_id for e in entries] == [dispatched.id], "only the real message claims"
    assert ran == [dispatched.id]
    assert client.get(waiting.id).state is JobState.SCHEDULED
    after_claim = client.get(dispatched.id)
    assert after_claim.state is JobState.SUCCEEDED and after_claim.attempt == 1
    assert after_claim.dispatch_token == current.dispatch_token
    assert metric("tock_messages_dropped_total", reason="malformed") == before["malformed"] + 3
    assert metric("tock_messages_dropped_total", reason="unknown_job") == \
        before["unknown_job"] + 1
    assert metric("tock_messages_dropped_total", reason="stale_token") == \
        before["stale_token"] + 2
    assert queue_empty(transport), "dropped messages are deleted"
    # Each says what it found: a job never sent has no token to be "another".
    said = " ".join(str(r.fields) for r in caplog.records
                    if getattr(r, "event", "") == "message_dropped")
    assert f"job {waiting.id} is scheduled and has never been sent" in said
    assert re.search(rf"job {dispatched.id} is \w+, under a dispatch token other than the "
                     "message's", said)


def test_a_message_naming_another_kind_claims_nothing_even_with_the_jobs_token(
        client, db, timer, transport, registry, consumers, clock):
    """The claim took its defaults (attempts, timeout) from the kind the message names, so
    a message with a job's token but another kind ran the job under that kind's limits
    (found by hand: a `slow` job ran with 5 attempts, not its kind's 3). The claim now
    matches only a job of the kind the message names; the message is dropped and counted,
    and the job's own message still runs it."""
    ran = []
    registry.add("work", lambda payload, ctx: ran.append((ctx.job_id, ctx.max_attempts)),
                 max_attempts=3)
    registry.add("other", lambda payload, ctx: None, max_attempts=9)
    job = client.schedule("work")
    dispatch(timer, clock.now)
    token = client.get(job.id).dispatch_token
    before = metric("tock_messages_dropped_total", reason="rejected")
    (real,) = transport.receive("default", 1, 1, 60)  # held aside: the forged one comes first
    forged = JobMessage(job.id, token, "other").encode()
    transport.send_batch("default", [Outgoing("forged", forged)])
    consumer = consumers(clock)
    assert receive(consumer, 1, rounds=3) == []
    assert metric("tock_messages_dropped_total", reason="rejected") == before + 1
    assert client.get(job.id).state is JobState.DISPATCHED and not ran
    # Both in one batch: the forged copy does not push the real one out as a duplicate.
    transport.send_batch("default", [Outgoing("forged", forged)])
    transport.change_visibility_batch("default", [real.receipt], 0)
    for _ in range(20):
        run_all(consumer, receive(consumer, 1, rounds=1))
        if ran and queue_empty(transport):
            break
    assert ran == [(job.id, 3)], "the job ran once, under its own kind's limits"
    assert client.get(job.id).max_attempts == 3


def test_a_message_on_another_queue_claims_nothing_even_with_the_jobs_token(
        client, db, timer, transport, registry, consumers, clock, caplog):
    """A job's message copied or moved to another queue (found by a walkthrough: a
    `default` consumer claimed a job of queue `other` and spent an attempt on it) is
    dropped there, named; the job stays dispatched for its own queue's consumers."""
    ran = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    transport.create_queue("other", visibility_timeout=60)
    job = client.schedule("work", queue="other")
    dispatch(timer, clock.now)
    (real,) = transport.receive("other", 1, 1, 60)  # moved: off its own queue ...
    transport.send_batch("default", [Outgoing("moved", real.body)])  # ... onto default
    before = metric("tock_messages_dropped_total", reason="rejected")
    consumer = consumers(clock)
    with caplog.at_level(logging.WARNING, logger="tock.consumer"):
        assert receive(consumer, 1, rounds=3) == []
    assert metric("tock_messages_dropped_total", reason="rejected") == before + 1
    assert any(f"job {job.id} belongs to queue 'other', not 'default'" in str(r.__dict__)
               for r in caplog.records if r.message == "message_dropped")
    after = client.get(job.id)
    assert after.state is JobState.DISPATCHED and after.attempt == 0 and not ran
    assert queue_empty(transport), "the copy is deleted"
    transport.change_visibility_batch("other", [real.receipt], 0)
    own = consumers(clock, queues=["other"])
    run_all(own, receive(own, 1, queue="other"))
    assert ran == [job.id] and client.get(job.id).state is JobState.SUCCEEDED


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
        before = metric("tock_sqs_errors_total", operation="ChangeMessageVisibilityBatch")
        clock.advance(20)
        assert consumer.heartbeat_once() == (1, 0)
        assert metric("tock_sqs_errors_total", operation="ChangeMessageVisibilityBatch") == \
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


def test_a_second_copy_of_a_finished_jobs_message_is_dropped_at_info(
        client, timer, transport, registry, consumers, clock, caplog):
    """SQS hands out a standard queue's messages at least once, and a send retried after a
    timeout SQS had in fact taken sends one twice: a copy whose job has moved on is no
    warning (a timer retrying sends through an SQS hiccup logged hundreds), nor is the
    message of an earlier dispatch (a send that timed out though SQS took it: after an SQS
    partition, hundreds). What is not tock's message (unknown job) still is."""
    caplog.set_level(logging.INFO, logger="tock.consumer")
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work")
    dispatch(timer, clock.now)
    consumer = consumers(clock)
    run_all(consumer, receive(consumer, 1))
    done = client.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.dispatch_token is not None
    copy = JobMessage(job.id, done.dispatch_token, "work").encode()
    earlier = JobMessage(job.id, uuid.uuid4(), "work").encode()
    foreign = JobMessage(job.id + 1000, uuid.uuid4(), "work").encode()
    transport.send_batch("default", [Outgoing("0", copy), Outgoing("1", earlier),
                                     Outgoing("2", foreign)])
    for _ in range(20):
        run_all(consumer, receive(consumer, 3, rounds=1))
        if queue_empty(transport):
            break
    levels = {r.fields["reason"]: r.levelname for r in caplog.records
              if getattr(r, "event", "") == "message_dropped"}
    assert levels == {"not_dispatched": "INFO", "stale_token": "INFO", "unknown_job": "WARNING"}
    assert client.get(job.id, with_attempts=True).attempt == 1
