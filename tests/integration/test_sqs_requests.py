"""`tock_sqs_requests_total`: the HTTP requests a process sends to SQS, by operation, each
retry included: what SQS bills. Real LocalStack; the retries are real botocore retries of
500s answered by a gateway in front of it."""

from __future__ import annotations

import os
from typing import Any

import pytest
from prometheus_client import generate_latest

from consumer.pipeline import Tidy
from shared.core.states import JobState
from shared.runtime import metrics
from shared.transport.base import Outgoing
from shared.transport.sqs import REQUESTS, SqsTransport
from tests.support.drive import dispatch, make_consumer
from tests.support.sqs_gateway import SqsGateway
from tests.support.wait import wait_for

OPERATIONS = ("SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch")


def grown(before: dict[str, int]) -> dict[str, int]:
    now = REQUESTS.snapshot()
    return {op: now.get(op, 0) - before.get(op, 0) for op in now}


def test_jobs_through_timer_and_consumer_count_each_operation(
        client: Any, timer: Any, registry: Any, running: Any) -> None:
    registry.add("work", lambda payload, ctx: None)
    running()
    before = REQUESTS.snapshot()
    jobs = client.schedule_many([{"kind": "work"} for _ in range(20)])
    dispatch(timer)
    wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED for j in jobs),
             timeout=30, message="the jobs ran")
    wait_for(lambda: grown(before).get("DeleteMessageBatch", 0) >= 1, timeout=10,
             message="their messages deleted")
    delta = grown(before)
    # Batches of up to 10: 20 jobs take at least two sends and two deletes, and far
    # fewer requests than one per message per operation.
    assert 2 <= delta["SendMessageBatch"] <= 20
    assert 2 <= delta["DeleteMessageBatch"] <= 20
    assert delta["ReceiveMessage"] >= 1
    for process in (metrics.TIMER, metrics.CONSUMER):
        text = generate_latest(metrics.exported_by(process)).decode()
        for op in OPERATIONS:
            assert f'tock_sqs_requests_total{{operation="{op}"}}' in text


def test_a_retried_request_is_counted_each_time_it_is_sent(transport: Any, queue_prefix: str
                                                            ) -> None:
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client(attempts=3))
        via.url("default")  # the queue the `transport` fixture made
        before = REQUESTS.snapshot()
        gateway.fail["SendMessageBatch"] = 2
        assert via.send_batch("default", [Outgoing("m", "body")]) == []
        assert grown(before).get("SendMessageBatch") == 3  # two 500s, then the one SQS took


def test_the_deleter_merges_the_batches_waiting_into_full_calls(
        consumers: Any, transport: Any) -> None:
    """Outcome groups of 5 each made a DeleteMessageBatch of 5; merged, 20 messages take
    two calls (made at once), and every message is gone."""
    c = consumers()
    for start in (0, 10):
        transport.send_batch("default", [Outgoing(str(i), f"m{i}")
                                         for i in range(start, start + 10)])
    received: list[Any] = []
    wait_for(lambda: received.extend(transport.receive("default", 10, 1, 60))
             or len(received) >= 20, timeout=20, message="20 messages received")
    for i in range(0, 20, 5):
        c.pipe.tidy.put(Tidy("default", [m.receipt for m in received[i:i + 5]], False))
    before = REQUESTS.snapshot()
    assert c.deleter.run_once(wait_seconds=0) == 20
    assert grown(before).get("DeleteMessageBatch") == 2
    assert c.pipe.tidy.empty()
    wait_for(lambda: transport.counts("default") == (0, 0), timeout=10,
             message="every message deleted")


def test_a_hung_wave_of_deletes_leaves_the_rest_untried(
        consumer_settings: Any, registry: Any, transport: Any, queue_prefix: str) -> None:
    """80 receipts are eight DeleteMessageBatch calls, made four at once. Into an SQS
    that does not answer, the first wave's four calls hang together (each held by the
    gateway until it times out) and the other four are not made: their messages come back
    after the visibility timeout and claim nothing."""
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client(read_timeout=1, attempts=1))
        via.url("default")
        c = make_consumer(consumer_settings, registry, via, None, sqs_call_timeout_seconds=1)
        try:
            gateway.hang.add("DeleteMessageBatch")
            c.pipe.tidy.put(Tidy("default", [f"receipt-{i}" for i in range(80)], False))
            before = REQUESTS.snapshot()
            assert c.deleter.run_once(wait_seconds=0) == 80
            assert grown(before).get("DeleteMessageBatch") == 4
            assert gateway.held == 4
        finally:
            gateway.release.set()
            c.close()


def test_an_unexpected_error_in_a_pooled_delete_reaches_the_loop(
        consumers: Any, monkeypatch: Any) -> None:
    """A bug in a call made on the deleter's pool is raised in the deleter loop's pass
    (whose supervisor logs `loop_crashed` and stops the process), not lost in the pool."""
    c = consumers()

    def broken(queue: str, receipts: list[str]) -> Any:
        raise RuntimeError("a bug in a delete")

    monkeypatch.setattr(c.pipe.transport, "delete_batch", broken)
    c.pipe.tidy.put(Tidy("default", [f"receipt-{i}" for i in range(20)], False))
    with pytest.raises(RuntimeError, match="a bug in a delete"):
        c.deleter.run_once(wait_seconds=0)
