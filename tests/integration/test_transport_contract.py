"""The in-memory transport keeps the SQS semantics the timer and consumer rely on."""

from __future__ import annotations

import threading

import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.core.errors import InvalidInput
from shared.core.states import JobState
from shared.transport.memory import MemoryTransport
from tests.support.wait import wait_for
from timer_service.service import Timer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_send_receive_delete() -> None:
    t = MemoryTransport()
    assert t.send_batch("q", [("1", "a"), ("2", "b")]) == []
    got = t.receive("q", 10, 0, 30)
    assert [m.body for m in got] == ["a", "b"]
    assert all(m.receive_count == 1 for m in got)
    assert t.receive("q", 10, 0, 30) == []  # both in flight
    assert t.delete_batch("q", [m.receipt for m in got]) == []
    assert t.depth("q") == (0, 0)


def test_visibility_timeout_redelivers_and_stales_the_old_receipt() -> None:
    clock = Clock()
    t = MemoryTransport(clock=clock)
    t.send_batch("q", [("1", "a")])
    first = t.receive("q", 1, 0, 30)[0]
    clock.now += 29
    assert t.receive("q", 1, 0, 30) == []
    clock.now += 2
    again = t.receive("q", 1, 0, 30)[0]
    assert again.message_id == first.message_id
    assert again.receive_count == 2
    assert again.receipt != first.receipt
    stale = t.delete_batch("q", [first.receipt])
    assert [f.code for f in stale] == ["ReceiptHandleIsInvalid"]
    assert t.delete_batch("q", [again.receipt]) == []
    assert t.depth("q") == (0, 0)


def test_change_visibility_extends_in_flight_messages_only() -> None:
    clock = Clock()
    t = MemoryTransport(clock=clock)
    t.send_batch("q", [("1", "a")])
    msg = t.receive("q", 1, 0, 10)[0]
    clock.now += 5
    assert t.change_visibility_batch("q", [msg.receipt], 60) == []
    clock.now += 30  # past the first timeout, within the extension
    assert t.receive("q", 1, 0, 10) == []
    clock.now += 31
    assert t.receive("q", 1, 0, 10)[0].receive_count == 2
    refused = t.change_visibility_batch("q", [msg.receipt], 60)
    assert [f.code for f in refused] == ["MessageNotInflight"]


def test_quotas_are_enforced() -> None:
    t = MemoryTransport()
    with pytest.raises(InvalidInput, match="at most 10"):
        t.send_batch("q", [(str(i), "x") for i in range(11)])
    with pytest.raises(InvalidInput, match="max_messages"):
        t.receive("q", 11, 0, 30)
    with pytest.raises(InvalidInput, match="visibility"):
        t.receive("q", 1, 0, 43201)


def test_long_poll_returns_when_a_message_arrives() -> None:
    t = MemoryTransport()
    got: list[str] = []
    receiver = threading.Thread(target=lambda: got.extend(
        m.body for m in t.receive("q", 1, 20, 30)))
    receiver.start()
    t.send_batch("q", [("1", "hello")])
    receiver.join(timeout=20)
    assert got == ["hello"]


def test_concurrent_senders_and_receivers_deliver_each_message_once() -> None:
    t = MemoryTransport()
    bodies = [f"m{i}" for i in range(2000)]
    seen: list[str] = []
    lock = threading.Lock()

    def send(part: list[str]) -> None:
        for i in range(0, len(part), 10):
            t.send_batch("q", [(str(j), b) for j, b in enumerate(part[i:i + 10])])

    def receive() -> None:
        while True:
            got = t.receive("q", 10, 1, 60)
            if not got:
                return
            with lock:
                seen.extend(m.body for m in got)
            assert t.delete_batch("q", [m.receipt for m in got]) == []

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
    assert t.depth("q") == (0, 0)


def test_real_timer_and_consumer_run_a_job_over_it(client, timer_settings,
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
    assert transport.depth("default") == (0, 0)
