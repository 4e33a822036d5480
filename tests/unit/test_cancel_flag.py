"""`ctx.cancelled` (consumer.tasks.CancelFlag) behaves as the threading.Event it is typed
as, though its condition is made only on a first wait."""

from __future__ import annotations

import threading

from consumer.tasks import CancelFlag


def test_it_is_an_event_and_starts_clear() -> None:
    flag = CancelFlag()
    assert isinstance(flag, threading.Event)
    assert not flag.is_set()
    assert flag.wait(0) is False
    assert flag.wait(0.01) is False


def test_set_and_clear_are_seen_by_is_set_and_wait() -> None:
    flag = CancelFlag()
    flag.set()
    assert flag.is_set() and flag.wait() is True and flag.wait(0) is True
    flag.clear()
    assert not flag.is_set() and flag.wait(0) is False


def test_a_set_from_another_thread_wakes_every_waiter() -> None:
    flag = CancelFlag()
    waiting = threading.Barrier(4)
    woke: list[bool] = []

    def waiter() -> None:
        waiting.wait()
        woke.append(flag.wait(30))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    waiting.wait()
    flag.set()
    for t in threads:
        t.join(30)
    assert woke == [True, True, True]


def test_no_set_is_missed_by_a_wait_racing_it() -> None:
    """A set that lands between a wait's first check and its sleep must still end it."""
    for _ in range(500):
        flag = CancelFlag()
        setter = threading.Thread(target=flag.set)
        setter.start()
        assert flag.wait(30) is True
        setter.join()
