"""The consumer's handler slots (consumer/inflight.Slots): a receiver waiting on a full
process takes the slots freed, is not woken for nothing, and never takes more than there
are."""

from __future__ import annotations

import threading

from consumer.inflight import Slots
from tests.support.wait import wait_for

WAIT = 10.0
"""A bound on each wait for another thread, far past what any step takes."""


class Reserving(threading.Thread):
    """`slots.reserve(most)` on a thread of its own; `got` once it returned."""

    def __init__(self, slots: Slots, most: int, timeout: float = WAIT) -> None:
        super().__init__(daemon=True)
        self.slots, self.most, self.timeout = slots, most, timeout
        self.got: int | None = None

    def run(self) -> None:
        self.got = self.slots.reserve(self.most, self.timeout)

    def start(self) -> None:
        """Start, and return once the thread waits on the slots."""
        super().start()
        waiting_on(self.slots, 1)

    def returned(self) -> int | None:
        self.join(WAIT)
        assert not self.is_alive(), "reserve did not return"
        return self.got


def waiting_on(slots: Slots, threads: int) -> None:
    """Return once `threads` threads wait on the slots' condition."""
    wait_for(lambda: len(slots._cond._waiters) >= threads,  # type: ignore[attr-defined]
             timeout=WAIT, interval=0.001, message=f"{threads} thread(s) waiting on the slots")


def full(capacity: int) -> Slots:
    slots = Slots(capacity)
    assert slots.reserve(capacity, 0) == capacity
    return slots


def test_a_waiting_receiver_takes_the_slots_freed():
    slots = full(8)
    receiver = Reserving(slots, most=8)
    receiver.start()
    slots.release(3)
    assert receiver.returned() == 3
    assert slots.used == 8


def test_giving_back_no_slot_wakes_no_waiting_receiver():
    slots = full(2)
    receiver = Reserving(slots, most=2)
    receiver.start()
    slots.release(0)  # what a claim that used every slot it reserved gives back
    assert len(slots._cond._waiters) == 1, "still waiting"  # type: ignore[attr-defined]
    slots.release()
    assert receiver.returned() == 1


def test_reserve_gives_up_after_its_timeout_and_never_overcommits():
    slots = full(2)
    assert slots.reserve(1, timeout=0.01) == 0
    slots.release(2)
    assert slots.reserve(5, timeout=0) == 2


def test_wait_idle_returns_when_the_last_slot_frees():
    slots = full(4)
    idle = threading.Event()
    waiter = threading.Thread(target=lambda: slots.wait_idle(WAIT) and idle.set(), daemon=True)
    waiter.start()
    waiting_on(slots, 1)
    slots.release(3)
    slots.release()
    waiter.join(WAIT)
    assert idle.is_set()


def test_a_receiver_that_gives_slots_back_and_asks_again_waits_its_turn():
    # Two queues, one slot: the receiver of the first gives its slot back and asks again
    # at once; the receiver of the second, waiting since before, must get it. Taken again
    # by the first, the second queue went unreceived for minutes.
    slots = Slots(1)
    assert slots.reserve(1, 0) == 1
    other = Reserving(slots, 1)
    other.start()
    slots.settle(1, 0)  # the first receiver's long poll found nothing
    assert slots.reserve(1, timeout=0.05) == 0, "its turn comes after the other's"
    assert other.returned() == 1


def test_settled_slots_tell_a_busy_process_from_one_whose_receivers_hold_them():
    slots = Slots(2)
    assert slots.reserve(2, 0) == 2
    assert not slots.running_only, "a receiver holds them for its receive"
    slots.settle(2, kept=2)  # both claimed: now handlers run
    assert slots.running_only
    slots.release()
    assert not slots.running_only and slots.used == 1
