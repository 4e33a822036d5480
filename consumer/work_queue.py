"""The queue of claimed jobs between the claimer and the handler threads.

`queue.Queue` wakes one waiting thread per item put, so a claim of 32 jobs costs the
claimer 32 thread wake-ups in a row, each a futex call and usually a context switch while
it holds the GIL (a quarter of the consumer's GIL time in the in-memory benchmark). Here a
put wakes one waiting thread, and each thread that takes a job wakes the next only if jobs
are still waiting: the wake-ups are spread over the threads that need them, and a thread
that comes back for more while jobs wait takes one without anyone being woken. Every job
still has a thread of its own as soon as one is free: a waiting job always has a waking
thread on its way while any thread is idle.
"""

from __future__ import annotations

import queue as queues
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkQueue(Generic[T]):
    """FIFO of jobs for the handler threads; thread-safe, unbounded."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting in get()
        self._waking = 0  # of those, woken and not yet back

    def put(self, item: T) -> None:
        self.put_many((item,))

    def put_many(self, items: Iterable[T]) -> None:
        """Queue `items`; wake one idle thread if none is already on its way."""
        with self._cond:
            self._items.extend(items)
            self._wake_one()

    def get(self, timeout: float) -> T:
        """The oldest job, waiting up to `timeout` seconds; `queue.Empty` if none came."""
        with self._cond:
            if not self._items:
                deadline = time.monotonic() + timeout
                self._idle += 1
                try:
                    while not self._items:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                        # Woken or timed out, this thread is no longer on its way. Counting
                        # a timed-out one as the woken one only allows an extra wake-up;
                        # the reverse could leave jobs waiting with threads idle.
                        if self._waking:
                            self._waking -= 1
                finally:
                    self._idle -= 1
                    self._waking = min(self._waking, self._idle)
                if not self._items:
                    raise queues.Empty
            item = self._items.popleft()
            if self._items:
                self._wake_one()  # more are waiting: pass the wake-up on
            return item

    def get_nowait(self) -> T:
        with self._cond:
            if not self._items:
                raise queues.Empty
            return self._items.popleft()

    def empty(self) -> bool:
        with self._cond:
            return not self._items

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def _wake_one(self) -> None:
        # Only if an idle thread is not already woken: one waking thread per moment is
        # enough, since each passes the wake-up on while jobs remain.
        if self._idle > self._waking and self._items:
            self._waking += 1
            self._cond.notify()
