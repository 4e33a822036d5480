"""A message received before its dispatch commits is deferred, but not until SQS moves it
to the dead-letter queue: after `defer_limit` receives it is deleted with a warning, and
the job still runs once the dispatch commits (the timer's lost-message check sends it
again). Real Postgres and real SQS; the stalled timer is a real pass held between its
send and its commit (the audit's `kill -STOP`)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest

import shared.store.job_store as job_store_module
from shared.core.states import JobState
from shared.transport.base import EntryFailure, Outgoing
from shared.transport.sqs import SqsTransport
from tests.support.drive import make_consumer, receive, run_all
from tests.support.wait import wait_for
from timer_service.service import Timer

DEAD_LETTER_AFTER = 3
"""The queue's maxReceiveCount: a 4th receive would move the message to the DLQ."""


class SendThenStall:
    """Sends for real, then holds the timer's pass (and its open transaction) until
    released: a timer stopped between its send and its commit."""

    def __init__(self, inner: SqsTransport) -> None:
        self.inner = inner
        self.sent = threading.Event()
        self.proceed = threading.Event()

    def send_batch(self, queue: str, entries: list[Outgoing]) -> list[EntryFailure]:
        failures = self.inner.send_batch(queue, entries)
        self.sent.set()
        assert self.proceed.wait(120)
        return failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def deleted_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == "deferred_message_deleted"]


def _stalled_dispatch(client: Any, timer_settings: Any, consumer_settings: Any,
                      queue_prefix: str, registry: Any, clock: Any,
                      monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """A queue with a DLQ after DEAD_LETTER_AFTER receives, a consumer on it, and a timer
    pass (on its own thread) that sends one job's message and stalls before its commit:
    (sqs, consumer, stalled transport, timer, job, the pass's thread)."""
    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 100)  # each deferral waits less
    registry.add("work", lambda payload, ctx: None)
    sqs = SqsTransport(queue_prefix)
    sqs.create_queue("deferred", visibility_timeout=60, dead_letter_after=DEAD_LETTER_AFTER)
    consumer = make_consumer(consumer_settings, registry, sqs, clock, queues=["deferred"],
                             dead_letter_after=DEAD_LETTER_AFTER)
    stalled = SendThenStall(sqs)
    timer = Timer(timer_settings, stalled)
    job = client.schedule("work", queue="deferred")
    passing = threading.Thread(target=timer.run_once, args=(clock.now,))
    passing.start()
    return sqs, consumer, stalled, timer, job, passing


def test_a_message_deferred_too_often_is_deleted_not_dead_lettered_and_its_job_runs(
        client, timer_settings, consumer_settings, queue_prefix, registry, clock,
        monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="tock.consumer")
    sqs, consumer, stalled, timer, job, passing = _stalled_dispatch(
        client, timer_settings, consumer_settings, queue_prefix, registry, clock,
        monkeypatch)
    try:
        assert stalled.sent.wait(30), "the message is out, the dispatch not committed"
        [line] = wait_for(lambda: consumer.receive_once("deferred", wait_seconds=2) >= 0
                          and deleted_lines(caplog), timeout=60,
                          message="the message deleted after its deferrals")
        assert line.levelno == logging.WARNING
        assert line.fields["job_id"] == job.id
        assert line.fields["receives"] == DEAD_LETTER_AFTER
        deferrals = [r for r in caplog.records if getattr(r, "event", "") == "claim_deferred"]
        assert len(deferrals) == DEAD_LETTER_AFTER - 1
        assert all(r.levelno == logging.DEBUG for r in deferrals)
        wait_for(lambda: sqs.depth("deferred") == 0, timeout=10, message="message deleted")

        stalled.proceed.set()  # the timer wakes and commits: dispatched, with no message
        passing.join(30)
        assert client.get(job.id).state is JobState.DISPATCHED
        later = clock.now + timedelta(seconds=timer_settings.dispatch_timeout_seconds + 1)
        again = timer.run_once(later)
        assert (again.redispatched, again.dispatched) == (1, 1)
        run_all(consumer, receive(consumer, 1, queue="deferred"))
        assert client.get(job.id).state is JobState.SUCCEEDED
        assert sqs.depth("deferred-dlq") == 0, "nothing reached the dead-letter queue"
        assert len(deleted_lines(caplog)) == 1, "one warning for the message"
    finally:
        stalled.proceed.set()
        passing.join(30)
        timer.close()
        consumer.close()


def test_a_short_stall_is_still_waited_out(
        client, timer_settings, consumer_settings, queue_prefix, registry, clock,
        monkeypatch, caplog):
    """Below the limit nothing changes: the deferred message is claimed once the dispatch
    commits, with no warning."""
    _, consumer, stalled, timer, job, passing = _stalled_dispatch(
        client, timer_settings, consumer_settings, queue_prefix, registry, clock,
        monkeypatch)
    try:
        assert stalled.sent.wait(30)
        assert consumer.receive_once("deferred", wait_seconds=5) == 0, "deferred once"
        stalled.proceed.set()
        passing.join(30)
        run_all(consumer, receive(consumer, 1, queue="deferred"))
        assert client.get(job.id).state is JobState.SUCCEEDED
        assert not deleted_lines(caplog)
    finally:
        stalled.proceed.set()
        passing.join(30)
        timer.close()
        consumer.close()
