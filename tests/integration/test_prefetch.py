"""The consumer's prefetch buffer (consumer/prefetch.py) on real Postgres and real SQS: a
tenant received behind another's buffered backlog is claimed first; a graceful stop hands
the buffered messages back at once; slow handlers keep it about empty; a lost buffer (a
killed process) loses nothing; and a buffered message whose visibility ran out and that
another consumer ran is dropped here, not run twice; and a long poll that fails gives back
every slot, lent or not."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import consumer.prefetch as prefetch
from consumer.service import Consumer
from shared.core.errors import TransportError
from shared.core.messages import decode
from shared.core.states import JobState
from tests.integration.readings import metric
from tests.support.drive import dispatch, receive, run_all
from tests.support.drive import receive as receive_all
from tests.support.wait import wait_for


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any start rate gives the buffer its whole room (CAP_PER_SLOT per slot)."""
    monkeypatch.setattr(prefetch, "HORIZON_SECONDS", 1e6)


def warm(consumer: Consumer, client: Any, timer: Any) -> None:
    """One job claimed and run, so the buffer's start rate is not 0."""
    client.schedule("work", tenant="W")
    dispatch(timer)
    run_all(consumer, receive(consumer, 1))


def fill(consumer: Consumer, count: int) -> None:
    """With every slot held (nothing is claimed), receive until `count` are buffered."""
    claimer = consumer.claimers["default"]
    held = consumer.pipe.slots.reserve(consumer.settings.concurrency, timeout=1)
    try:
        wait_for(lambda: consumer.receive_once("default", wait_seconds=1) >= 0
                 and len(claimer.prefetch) >= count, timeout=20,
                 message=f"{count} messages prefetched")
    finally:
        consumer.pipe.slots.settle(held, 0)


def tenants(consumer: Consumer) -> list[str | None]:
    out = []
    while not consumer.pipe.work.empty():
        out.append(consumer.pipe.work.get_nowait())
    run_all(consumer, out)
    return [entry.item.context.tenant for entry in out]


def one_received_by_hand(client: Any, timer: Any, transport: Any) -> tuple[int, list[Any]]:
    """A job dispatched and its message received from SQS past the consumer."""
    job = client.schedule("work").id
    dispatch(timer)
    got: list[Any] = []
    wait_for(lambda: got.extend(transport.receive("default", 1, 0, 60)) or got,
             message="the message received")
    return job, got


def test_a_tenant_received_behind_a_buffered_backlog_is_claimed_first(
        client, timer, registry, consumers, transport, wide):
    registry.add("work", lambda payload, ctx: None)
    c = consumers(concurrency=2)
    warm(c, client, timer)
    backlog = [client.schedule("work", tenant="A").id for _ in range(4)]
    dispatch(timer)
    fill(c, 4)
    assert transport.counts("default") == (0, 4)  # SQS is empty: the backlog waits here
    assert all(client.get(j).state is JobState.DISPATCHED for j in backlog)  # unclaimed
    client.schedule("work", tenant="B")
    dispatch(timer)
    wait_for(lambda: transport.counts("default")[0] == 1, message="B's message in SQS")
    # Two slots free: two of A's buffered jobs start, and the receive after their claim
    # brings B's message into the buffer behind the other two of A's ...
    assert c.receive_once("default", wait_seconds=0) == 2
    assert tenants(c) == ["A", "A"]
    assert len(c.claimers["default"].prefetch) == 3
    # ... which it overtakes: B's and one of A's start (in one claim), the other of A's,
    # received before B's, waits.
    assert c.receive_once("default", wait_seconds=0) == 2
    assert sorted(tenants(c)) == ["A", "B"]
    [left] = c.claimers["default"].prefetch.drain()
    assert decode(left.body).tenant == "A"


def test_the_buffer_holds_a_consumers_share_of_the_window_so_sqs_stays_empty(
        client, timer, registry, consumers, transport, wide):
    """The room is CAP_PER_SLOT messages per slot, not two: the timer keeps about a
    quarter second of a busy tenant's work dispatched, and at twice the concurrency most
    of a fast consumer's share of it waited in SQS, where a newcomer's messages queue
    behind it. Here 8 per slot all leave SQS for the buffer, ahead of any newcomer."""
    registry.add("work", lambda payload, ctx: None)
    c = consumers(concurrency=2)
    warm(c, client, timer)
    room = prefetch.CAP_PER_SLOT * 2
    assert room > 4  # more than the two per slot that were the cap
    for _ in range(room):
        client.schedule("work", tenant="A")
    dispatch(timer)
    fill(c, room)
    assert transport.counts("default") == (0, room)
    assert len(c.claimers["default"].prefetch) == room


def test_a_long_poll_holds_no_slot_so_the_other_receiver_starts_what_it_buffered(
        client, timer, registry, consumers, transport, monkeypatch):
    """Found in a benchmark: one receiver long-polled an empty queue holding every free
    slot while the other had received a burst's last messages into the buffer; they
    waited for the poll to end (each time up to TOCK_RECEIVE_WAIT_SECONDS), and the
    timer, seeing them unclaimed, held back the rest of the burst."""
    registry.add("work", lambda payload, ctx: None)
    c = consumers(concurrency=2)
    polling, polled = threading.Event(), threading.Event()
    receive = transport.receive

    def spied(queue: str, most: int, wait: int, visibility: int) -> Any:
        if wait:
            polling.set()
        try:
            return receive(queue, most, wait, visibility)
        finally:
            if wait:
                polled.set()

    # The queue's other receiver receives the message (here by hand, before the poll
    # below, which then finds the queue empty) ...
    job, got = one_received_by_hand(client, timer, transport)
    monkeypatch.setattr(transport, "receive", spied)
    poller = threading.Thread(target=c.receive_once, args=("default",),
                              kwargs={"wait_seconds": 5})
    poller.start()
    try:
        assert polling.wait(10), "the first receiver's long poll"
        # ... and puts it into the buffer while the first one polls.
        c.claimers["default"].prefetch.add(got)
        assert c.receive_once("default", wait_seconds=0) == 1
        assert not polled.is_set(), "started while the other receiver still polled"
        run_all(c, [c.pipe.work.get_nowait()])
        assert client.get(job).state is JobState.SUCCEEDED
    finally:
        poller.join(15)


@pytest.mark.parametrize("lent", [True, False], ids=["a-slot-borrowed", "none-borrowed"])
def test_a_long_poll_that_fails_gives_every_slot_back(
        client, timer, registry, consumers, transport, monkeypatch, lent):
    """A long poll's slots are lent while it waits; when the poll fails (SQS cut off or
    restarted: a TransportError, which the loop backs off from), the slots it kept and the
    one the other receiver borrowed must all come free, or the consumer runs below its
    concurrency from then on. The error is raised at the transport boundary, after the
    real LocalStack poll returns, so that it lands while a slot is lent; the fault suite
    meets the same error from a real SQS restart, freeze and partition."""
    registry.add("work", lambda payload, ctx: None)
    c = consumers(concurrency=2)
    claimer = c.claimers["default"]
    polling, fail = threading.Event(), threading.Event()
    receive = transport.receive

    def failing(queue: str, most: int, wait: int, visibility: int) -> Any:
        if not wait:
            return receive(queue, most, wait, visibility)
        polling.set()
        assert fail.wait(10)
        receive(queue, most, 0, visibility)
        raise TransportError("ReceiveMessage failed: connection reset (injected)")

    job, got = one_received_by_hand(client, timer, transport)
    monkeypatch.setattr(transport, "receive", failing)
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            c.receive_once("default", wait_seconds=5)
        except BaseException as exc:  # the test reads it below
            errors.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert polling.wait(10), "the long poll"
        assert c.pipe.slots.used == 2  # every free slot went to the poll
        if lent:  # the other receiver borrows one to start what it buffered
            claimer.prefetch.add(got)
            assert c.receive_once("default", wait_seconds=0) == 1
        fail.set()
        poller.join(15)
        assert [type(e) for e in errors] == [TransportError]
        # Nothing is left reserved or lent: only the borrowed slot's handler holds one.
        assert claimer._lendable == 0
        assert c.pipe.slots.used == c.pipe.slots.busy == int(lent)
    finally:
        fail.set()
        poller.join(15)
    monkeypatch.setattr(transport, "receive", receive)
    if lent:
        run_all(c, [c.pipe.work.get_nowait()])
        assert client.get(job).state is JobState.SUCCEEDED
    else:
        claimer.prefetch.add(got)
    assert c.pipe.slots.used == 0
    # Both slots are there to claim with: two jobs run at once.
    more = [client.schedule("work").id for _ in range(2)]
    dispatch(timer)
    entries = receive_all(c, 2)
    assert len(entries) == c.pipe.slots.busy == 2
    run_all(c, entries)
    run_all(c, receive_all(c, 3 - len(entries) - int(lent)))
    assert all(client.get(j).state is JobState.SUCCEEDED for j in [job, *more])


def test_a_graceful_stop_hands_the_buffered_messages_back_at_once(
        client, timer, registry, consumer_settings, transport, wide):
    release = threading.Event()
    registry.add("work", lambda payload, ctx: release.wait(30))
    c = Consumer(consumer_settings.model_copy(update={"concurrency": 2}), registry, transport)
    c.start()
    stopping = threading.Thread(target=c.shutdown)
    try:
        for _ in range(2):  # both slots run a handler that waits
            client.schedule("work", tenant="W")
        dispatch(timer)
        wait_for(lambda: c.pipe.slots.busy == 2, message="both handlers running")
        backlog = [client.schedule("work", tenant="A").id for _ in range(4)]
        dispatch(timer)
        wait_for(lambda: len(c.claimers["default"].prefetch) == 4, message="4 prefetched")
        stopping.start()
        asked = time.monotonic()
        back: list[Any] = []
        wait_for(lambda: back.extend(transport.receive("default", 10, 1, 60)) or len(back) == 4,
                 timeout=10, message="the buffered messages visible again")
        assert time.monotonic() - asked < 5  # not the visibility timeout (60 s)
        assert all(client.get(j).state is JobState.DISPATCHED for j in backlog)
    finally:
        release.set()
        if stopping.ident is None:  # failed before the stop: stop it all the same
            stopping.start()
        stopping.join(30)


def test_slow_handlers_keep_the_buffer_about_empty(client, timer, registry,
                                                   consumer_settings, transport):
    registry.add("work", lambda payload, ctx: time.sleep(1.0))
    c = Consumer(consumer_settings.model_copy(update={"concurrency": 2}), registry, transport)
    c.start()
    try:
        for _ in range(8):
            client.schedule("work", tenant="A")
        dispatch(timer)
        buffered, waiting = [], []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            buffered.append(len(c.claimers["default"].prefetch))
            waiting.append(transport.counts("default")[0])
            time.sleep(0.05)
        # Two starts a second: the room is at most one message (HORIZON_SECONDS of them).
        assert max(buffered) <= 1
        assert max(waiting) >= 4  # the rest stays in SQS, for any consumer
    finally:
        c.shutdown()


def short_visibility(consumer_settings: Any) -> dict[str, Any]:
    return {"visibility_timeout_seconds": 2, "lease_seconds": 2, "heartbeat_seconds": 0.5}


def test_a_lost_buffer_loses_nothing(client, timer, registry, consumers, running,
                                     consumer_settings, transport, wide):
    ran: list[int] = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    killed = consumers(concurrency=2, **short_visibility(consumer_settings))
    warm(killed, client, timer)
    backlog = [client.schedule("work", tenant="A").id for _ in range(4)]
    dispatch(timer)
    fill(killed, 4)
    # The process dies with them buffered (no hand back, as after kill -9): they come back
    # after the visibility timeout and another consumer runs each once.
    killed.claimers["default"].prefetch = prefetch.Prefetch(4, 1.0)
    running(concurrency=2, **short_visibility(consumer_settings))
    wait_for(lambda: all(client.get(j).state is JobState.SUCCEEDED for j in backlog),
             timeout=30, message="the lost buffer's jobs ran elsewhere")
    assert sorted(j for j in ran if j in backlog) == sorted(backlog)
    assert {client.get(j).attempt for j in backlog} == {1}


def test_a_buffered_message_another_consumer_ran_is_dropped_not_run_twice(
        client, timer, registry, consumers, running, consumer_settings, transport, wide):
    ran: list[int] = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    slow = consumers(concurrency=1, **short_visibility(consumer_settings))
    warm(slow, client, timer)
    job = client.schedule("work", tenant="A").id
    dispatch(timer)
    fill(slow, 1)
    # Held past its visibility (the give-back bound off): another consumer receives the
    # message again, claims the job and runs it.
    slow.claimers["default"].prefetch.give_back_after = 1e6
    other = running(concurrency=1, **short_visibility(consumer_settings))
    wait_for(lambda: client.get(job).state is JobState.SUCCEEDED, timeout=30,
             message="the other consumer ran the job")
    other.shutdown()
    dropped = metric("tock_messages_dropped_total", reason="not_dispatched")
    # Its slot free, the first consumer takes the stale message: the fenced claim matches
    # nothing, and the message is dropped.
    assert slow.receive_once("default", wait_seconds=0) == 0
    assert slow.pipe.work.empty()
    assert len(slow.claimers["default"].prefetch) == 0
    assert metric("tock_messages_dropped_total", reason="not_dispatched") == dropped + 1
    assert ran.count(job) == 1
    assert client.get(job).attempt == 1
