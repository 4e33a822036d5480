"""The `Transport` contract (shared.transport.base): the SQS semantics the timer and the
consumers rely on. Every test runs against both implementations, `SqsTransport` on the
session's real SQS server and `MemoryTransport`; a few facts only the in-memory one can
show cheaply (a pinned clock, stale receipts, which the emulators accept) are marked."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.core.errors import TockError
from shared.core.states import JobState
from shared.transport.base import Outgoing
from shared.transport.memory import MemoryTransport
from shared.transport.sqs import SqsTransport
from tests.support.wait import wait_for
from timer_service.service import Timer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Subject:
    transport: Any
    queue: str
    kind: str


@pytest.fixture(params=["memory", "sqs"])
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    if request.param == "memory":
        yield Subject(MemoryTransport(), "q", "memory")
        return
    request.getfixturevalue("sqs_server")
    transport = SqsTransport(f"c{uuid.uuid4().hex[:8]}-")
    transport.create_queue("q", visibility_timeout=30)
    yield Subject(transport, "q", "sqs")


def _receive_all(s: Subject, n: int, visibility: int = 30) -> list[Any]:
    got: list[Any] = []
    wait_for(lambda: got.extend(s.transport.receive(s.queue, 10, 1, visibility)) or
             len(got) >= n, timeout=20, message=f"{n} messages received")
    return got


def test_send_receive_delete(subject: Subject) -> None:
    t = subject.transport
    assert t.send_batch(subject.queue, [Outgoing("1", "a"), Outgoing("2", "b")]) == []
    got = _receive_all(subject, 2)
    assert sorted(m.body for m in got) == ["a", "b"]
    assert all(m.receive_count == 1 for m in got)
    assert t.receive(subject.queue, 10, 0, 30) == []  # both in flight
    assert t.depth(subject.queue) == 2
    assert t.delete_batch(subject.queue, [m.receipt for m in got]) == []
    wait_for(lambda: t.depth(subject.queue) == 0, timeout=10, message="queue empty")


def test_visibility_timeout_redelivers_with_a_higher_receive_count(subject: Subject) -> None:
    t = subject.transport
    t.send_batch(subject.queue, [Outgoing("1", "a")])
    first = _receive_all(subject, 1, visibility=1)[0]
    again = _receive_all(subject, 1, visibility=30)[0]  # after the 1 s ran out
    assert again.message_id == first.message_id
    assert again.receive_count == 2
    assert t.delete_batch(subject.queue, [again.receipt]) == []


def test_change_visibility_keeps_a_message_in_flight(subject: Subject) -> None:
    t = subject.transport
    t.send_batch(subject.queue, [Outgoing("1", "a")])
    msg = _receive_all(subject, 1, visibility=2)[0]
    assert t.change_visibility_batch(subject.queue, [msg.receipt], 60) == []
    # Past the first 2 s, within the extension: nothing comes back.
    assert t.receive(subject.queue, 10, 3, 60) == []
    assert t.change_visibility_batch(subject.queue, [msg.receipt], 0) == []
    assert _receive_all(subject, 1)[0].receive_count == 2


def test_batches_of_more_than_ten_are_refused_with_a_tock_error(subject: Subject) -> None:
    with pytest.raises(TockError):
        subject.transport.send_batch(subject.queue, [Outgoing(str(i), "x") for i in range(11)])


def test_long_poll_returns_when_a_message_arrives(subject: Subject) -> None:
    t = subject.transport
    got: list[str] = []
    receiver = threading.Thread(target=lambda: got.extend(
        m.body for m in t.receive(subject.queue, 1, 20, 30)))
    receiver.start()
    t.send_batch(subject.queue, [Outgoing("1", "hello")])
    receiver.join(timeout=20)
    assert got == ["hello"]


def test_concurrent_senders_and_receivers_deliver_each_message_once(subject: Subject) -> None:
    t = subject.transport
    bodies = [f"m{i}" for i in range(2000 if subject.kind == "memory" else 200)]
    seen: list[str] = []
    lock = threading.Lock()

    def send(part: list[str]) -> None:
        for i in range(0, len(part), 10):
            assert t.send_batch(subject.queue,
                                [Outgoing(str(j), b) for j, b in enumerate(part[i:i + 10])]) == []

    def receive() -> None:
        while True:
            got = t.receive(subject.queue, 10, 1, 60)
            if not got:
                return
            with lock:
                seen.extend(m.body for m in got)
            assert t.delete_batch(subject.queue, [m.receipt for m in got]) == []

    senders = [threading.Thread(target=send, args=(bodies[k::4],)) for k in range(4)]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    receivers = [threading.Thread(target=receive) for _ in range(4)]
    for r in receivers:
        r.start()
    for r in receivers:
        r.join()
    assert sorted(seen) == sorted(bodies)


# --- facts the in-memory transport shows with a pinned clock --------------------------------

def test_memory_redelivery_stales_the_old_receipt() -> None:
    clock = Clock()
    t = MemoryTransport(clock=clock)
    t.send_batch("q", [Outgoing("1", "a")])
    first = t.receive("q", 1, 0, 30)[0]
    clock.now += 29
    assert t.receive("q", 1, 0, 30) == []
    clock.now += 2
    again = t.receive("q", 1, 0, 30)[0]
    assert again.receipt != first.receipt
    assert [f.code for f in t.delete_batch("q", [first.receipt])] == ["ReceiptHandleIsInvalid"]
    assert [f.code for f in t.change_visibility_batch("q", [first.receipt], 60)] == [
        "MessageNotInflight"]
    assert t.delete_batch("q", [again.receipt]) == []
    assert t.counts("q") == (0, 0)


def test_real_timer_and_consumer_run_a_job_over_memory(client, timer_settings,
                                                       consumer_settings) -> None:
    transport = MemoryTransport()
    registry = Registry()
    ran = []
    registry.add("mem.hello", lambda payload, ctx: ran.append(payload))
    job = client.schedule("mem.hello", {"n": 7})
    timer = Timer(timer_settings, transport)
    consumer = Consumer(consumer_settings, registry, transport)
    consumer.start()
    try:
        assert timer.run_once().dispatched == 1
        wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED,
                 message="job succeeded over the memory transport")
    finally:
        consumer.shutdown()
        timer.close()
    assert ran == [{"n": 7}]
    assert transport.counts("default") == (0, 0)
