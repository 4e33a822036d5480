"""The prefetch buffer's order and room (consumer/prefetch.py), on a hand-moved clock; the
claimer around it is tested on real servers (tests/integration/test_prefetch.py)."""

from __future__ import annotations

import uuid

from consumer.prefetch import HORIZON_SECONDS, RATE_WINDOW_SECONDS, Prefetch
from shared.core.messages import JobMessage
from shared.transport.base import Received


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(job: int, tenant: str | None = None, priority: int = 0) -> Received:
    body = JobMessage(job, uuid.uuid4(), "work", tenant, priority).encode()
    return Received(f"m{job}", f"r{job}", body, 1)


def jobs(taken: list[Received]) -> list[int]:
    return [int(m.message_id[1:]) for m in taken]


def test_a_newcomer_is_taken_before_the_backlog_received_ahead_of_it():
    buffer = Prefetch(40, 10.0, clock=Clock())
    buffer.add([message(n, "A") for n in range(1, 11)])
    assert jobs(buffer.take(3)) == [1, 2, 3]
    buffer.add([message(100, "B"), message(101, "B")])
    # B has no recent starts, A three: B's go first, then A's in their order.
    assert jobs(buffer.take(4)) == [100, 101, 4, 5]


def test_two_busy_tenants_take_turns():
    buffer = Prefetch(40, 10.0, clock=Clock())
    buffer.add([message(n, "A") for n in range(1, 5)] + [message(n, "B") for n in range(5, 9)])
    taken = jobs(buffer.take(8))
    assert taken == [1, 5, 2, 6, 3, 7, 4, 8]


def test_priority_comes_before_fairness_and_a_message_without_a_tenant_still_counts():
    buffer = Prefetch(40, 10.0, clock=Clock())
    buffer.add([message(1, "A"), message(2), message(3, "A", priority=5), message(4, "B")])
    assert jobs(buffer.take(4)) == [3, 2, 4, 1]


def test_an_old_body_without_tenant_or_priority_and_a_malformed_one_are_held():
    buffer = Prefetch(40, 10.0, clock=Clock())
    old = Received("m1", "r1", f'{{"v":1,"job":1,"token":"{uuid.uuid4()}","kind":"k"}}', 1)
    bad = Received("m2", "r2", "not json", 1)
    buffer.add([old, bad])
    # The malformed one first: the claim drops it without a handler.
    assert buffer.take(2) == [bad, old]


def test_a_message_held_long_goes_first():
    clock = Clock()
    buffer = Prefetch(40, 10.0, clock=clock)
    buffer.add([message(1, "A")])
    buffer.take(1)
    buffer.add([message(2, "A")])
    clock.now += 1.5
    buffer.add([message(3, "B")])
    assert jobs(buffer.take(1)) == [2]


def test_messages_held_too_long_are_given_back_and_the_rest_stay():
    clock = Clock()
    buffer = Prefetch(40, 4.0, clock=clock)
    buffer.add([message(1, "A"), message(2, "B")])
    clock.now += 3
    buffer.add([message(3, "A")])
    clock.now += 1.5
    assert sorted(jobs(buffer.overdue())) == [1, 2]
    assert len(buffer) == 1
    assert jobs(buffer.drain()) == [3]
    assert len(buffer) == 0


def test_the_room_follows_the_start_rate_up_to_the_cap():
    clock = Clock()
    buffer = Prefetch(40, 10.0, clock=clock)
    assert buffer.room() == 0  # nothing started yet: receive only for free slots
    # Fast handlers: 400 starts a second.
    for _ in range(40):
        buffer.add([message(n, "A") for n in range(20)])
        buffer.take(20)
        clock.now += 0.05
    assert buffer.room() == 40  # 400/s x the horizon is more than the cap
    buffer.add([message(n, "A") for n in range(30)])
    assert buffer.room() == 10


def test_slow_handlers_leave_no_room():
    clock = Clock()
    buffer = Prefetch(40, 10.0, clock=clock)
    # 8 slots, each job 3 s: under 3 starts a second.
    for _ in range(10):
        buffer.add([message(1, "A")])
        buffer.take(1)
        clock.now += 0.375
    assert 8 / 3 * HORIZON_SECONDS < 2
    assert buffer.room() <= 1
    clock.now += RATE_WINDOW_SECONDS + 0.1  # nothing started since: no room at all
    assert buffer.room() == 0


def test_room_held_for_one_receive_is_not_given_to_the_queues_other_receiver():
    clock = Clock()
    buffer = Prefetch(4, 10.0, clock=clock)
    for n in range(20):
        buffer.add([message(n, "A")])
        buffer.take(1)
    assert buffer.hold_room() == 4
    assert buffer.hold_room() == 0  # the other receiver, meanwhile
    buffer.add([message(100, "A")])
    buffer.release_room(4)
    assert buffer.room() == 3
