"""What a process says about a queue that goes missing while it runs: with
TOCK_CREATE_QUEUES=1 a `queue_recreated` warning (its messages are gone), without it a
`queue_missing` line at most once per 30 s per queue, however many loops meet the error.
Real SQS; the queues are really deleted."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shared.core import validation
from shared.core.errors import InvalidInput, QueueMissing
from shared.runtime.startup import report_missing_queues
from shared.transport.base import Outgoing
from shared.transport.sqs import REPORT_MISSING_EVERY_SECONDS, SqsTransport
from tests.support.drive import dispatch, receive
from tests.support.wait import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == event]


def missing_queues(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return sorted(r.fields["queue"] for r in lines(caplog, "queue_missing"))


def test_a_queue_deleted_while_running_is_recreated_with_a_warning(queue_prefix, caplog):
    caplog.set_level(logging.INFO, logger="tock.sqs")
    sqs = SqsTransport(queue_prefix, create_missing=True, dead_letter_after=3)
    sqs.check("default")
    [created] = lines(caplog, "queue_created")
    assert created.levelno == logging.INFO, "a queue never seen before: nothing was lost"
    sqs.send_batch("default", [Outgoing("1", "lost with its queue")])
    sqs.client.delete_queue(QueueUrl=sqs.url("default"))
    [line] = wait_for(lambda: sqs.send_batch("default", [Outgoing("2", "after")]) == [] and
                      lines(caplog, "queue_recreated"), timeout=30,
                      message="the queue created again, with a warning")
    assert line.levelno == logging.WARNING
    assert line.fields["queue"] == "default"
    assert line.fields["sqs_queue"] == f"{queue_prefix}default"
    assert "messages it held are gone" in line.fields["detail"]
    assert "dispatch timeout" in line.fields["detail"]
    got = wait_for(lambda: sqs.receive("default", 10, 1, 30), timeout=20, message="a message")
    assert {m.body for m in got} <= {"after"}
    assert not lines(caplog, "queue_missing")


def test_senders_that_meet_a_lost_queue_together_say_so_once(queue_prefix, caplog):
    # The timer's senders (TOCK_SEND_CONCURRENCY threads) meet the loss at once, and each
    # creates the queue again: one warning for the event, not one per thread.
    caplog.set_level(logging.INFO, logger="tock.sqs")
    sqs = SqsTransport(queue_prefix, create_missing=True)
    sqs.check("default")
    sqs.client.delete_queue(QueueUrl=sqs.url("default"))
    start = threading.Barrier(8)

    def send(n: int) -> list[Any]:
        start.wait()
        return sqs.send_batch("default", [Outgoing(str(n), "after")])

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, range(8))) == [[]] * 8
    assert len(lines(caplog, "queue_recreated")) == 1


def test_a_missing_queue_is_reported_once_per_30_s_per_queue(queue_prefix, caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    sqs = SqsTransport(queue_prefix, clock=clock)
    for queue in ("a", "b"):
        sqs.create_queue(queue)
        sqs.client.delete_queue(QueueUrl=sqs.url(queue))  # its URL stays cached

    def every_loop_fails_on_both() -> None:
        for queue in ("a", "b"):
            with pytest.raises(QueueMissing):
                sqs.receive(queue, 10, 0, 30)
            with pytest.raises(QueueMissing):
                sqs.depth(queue)
            with pytest.raises(QueueMissing):
                sqs.send_batch(queue, [Outgoing("1", "x")])

    every_loop_fails_on_both()
    every_loop_fails_on_both()
    assert missing_queues(caplog) == ["a", "b"]
    assert all(r.levelno == logging.ERROR for r in lines(caplog, "queue_missing"))
    clock.now += REPORT_MISSING_EVERY_SECONDS - 1
    every_loop_fails_on_both()
    assert missing_queues(caplog) == ["a", "b"]
    clock.now += 2
    every_loop_fails_on_both()
    assert missing_queues(caplog) == ["a", "a", "b", "b"]


def test_the_start_up_report_is_not_repeated_by_the_first_calls(queue_prefix, caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    sqs = SqsTransport(queue_prefix, clock=clock)
    report_missing_queues(sqs, ["default"])
    with pytest.raises(QueueMissing):
        sqs.receive("default", 10, 0, 30)
    [line] = lines(caplog, "queue_missing")
    assert line.name == "tock.startup"
    clock.now += REPORT_MISSING_EVERY_SECONDS
    with pytest.raises(QueueMissing):
        sqs.receive("default", 10, 0, 30)
    assert len(lines(caplog, "queue_missing")) == 2, "still missing 30 s on: said again"


def test_visibility_extensions_on_a_missing_queue_do_not_repeat_the_report(
        client, timer, transport, registry, consumers, clock, caplog):
    caplog.set_level(logging.INFO)
    registry.add("work", lambda payload, ctx: None)
    consumer = consumers(clock)
    client.schedule("work")
    dispatch(timer)
    assert len(receive(consumer, 1)) == 1
    transport.client.delete_queue(QueueUrl=transport.url("default"))
    for _ in range(3):
        assert consumer.visibility.extend() == 1
    assert missing_queues(caplog) == ["default"]
    assert not lines(caplog, "visibility_extend_failed")


def test_the_longest_queue_name_fits_sqs_with_the_longest_prefix_and_its_dead_letters(
        sqs_server):
    """SQS names are at most 80 characters: a 15-character TOCK_QUEUE_PREFIX, a 61-character
    queue and "-dlq" are exactly that (a 64-character queue was accepted, and its queues
    could not be created)."""
    prefix = f"p{uuid.uuid4().hex[:13]}-"
    longest = "q" * 61
    sqs = SqsTransport(prefix, create_missing=True, dead_letter_after=3)
    assert len(sqs.queue_name(longest) + "-dlq") == 80
    sqs.check(validation.queue(longest))  # creates both
    assert sqs.receive(longest, 1, 0, 30) == []
    with pytest.raises(InvalidInput, match="1-61 letters"):
        validation.queue("q" * 62)
