"""The claimed-jobs queue: FIFO, a timeout that says Empty, and every job a thread of its
own as soon as one is idle, although a put wakes one thread and each passes it on."""

from __future__ import annotations

import queue as queues
import threading
import time
from collections.abc import Callable

import pytest

from consumer.work_queue import WorkQueue

JOIN_SECONDS = 10


def test_first_in_first_out() -> None:
    work: WorkQueue[int] = WorkQueue()
    work.put_many([1, 2])
    work.put(3)
    assert work.qsize() == 3
    assert [work.get(timeout=0), work.get_nowait(), work.get(timeout=1)] == [1, 2, 3]
    assert work.empty()


def test_get_says_empty_after_its_timeout() -> None:
    work: WorkQueue[int] = WorkQueue()
    with pytest.raises(queues.Empty):
        work.get(timeout=0.01)
    with pytest.raises(queues.Empty):
        work.get_nowait()


def test_a_batch_of_blocking_jobs_runs_on_every_idle_thread_at_once() -> None:
    """32 jobs that each wait until all 32 run at the same time: this finishes only if one
    put woke (through the chain) every idle thread, not one thread for the whole batch."""
    threads = 32
    work: WorkQueue[int] = WorkQueue()
    together = threading.Barrier(threads, timeout=JOIN_SECONDS)
    done: list[int] = []
    lock = threading.Lock()

    def handler_thread() -> None:
        job = work.get(timeout=JOIN_SECONDS)
        together.wait()  # BrokenBarrierError if the batch did not all start
        with lock:
            done.append(job)

    pool = [threading.Thread(target=handler_thread) for _ in range(threads)]
    for t in pool:
        t.start()
    _until(lambda: work._idle == threads)
    work.put_many(range(threads))
    for t in pool:
        t.join(JOIN_SECONDS)
    assert sorted(done) == list(range(threads))


def test_no_job_is_left_waiting_after_timeouts_raced_the_wake_ups() -> None:
    """First the threads wait with timeouts short enough to race the wake-ups (a thread
    that times out as it is woken), then with long ones, relying on wake-ups alone: the
    jobs put then must still all be taken at once, so no race left the queue counting a
    thread as on its way when none was."""
    work: WorkQueue[int] = WorkQueue()
    taken: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    wait = [0.0005]

    def handler_thread() -> None:
        while not stop.is_set():
            try:
                job = work.get(timeout=wait[0])
            except queues.Empty:
                continue
            with lock:
                taken.append(job)

    pool = [threading.Thread(target=handler_thread) for _ in range(8)]
    for t in pool:
        t.start()
    try:
        for start in range(0, 2000, 10):
            work.put_many(range(start, start + 10))
        _until(lambda: len(taken) == 2000)
        wait[0] = 6 * JOIN_SECONDS  # longer than _until gives: only wake-ups take these
        _until(lambda: work._idle == len(pool))
        for start in range(2000, 2100, 5):
            work.put_many(range(start, start + 5))
            _until(lambda: work._idle == len(pool) and work.empty())
    finally:
        stop.set()
        work.put_many(range(-len(pool), 0))  # one each, to end the long waits
        for t in pool:
            t.join(JOIN_SECONDS)
    assert sorted(j for j in taken if j >= 0) == list(range(2100))


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + JOIN_SECONDS
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        pause.wait(0.001)
