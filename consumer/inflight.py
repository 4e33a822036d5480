"""Book-keeping of the jobs a consumer process holds: each claimed job (`InFlight`), the
table of them (`Tracker`), and the free handler slots (`Slots`)."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from consumer.tasks import TaskContext
from shared.store.rows import Lease


@dataclass
class InFlight:
    """A claimed job from claim until its outcome is written (or it is given up)."""

    lease: Lease
    queue: str
    receipt: str
    context: TaskContext
    started: float = field(default_factory=time.monotonic)
    timeout_seconds: float = 0.0
    timed_out: bool = False
    lease_lost: bool = False
    abandoned: bool = False
    """No more heartbeats: the lease will expire and the timer recovers the job."""
    detached: bool = False
    """Its job no longer follows this worker's lease (which every other job it holds
    hangs off) and expires on its own: how an abandoned job is really let go."""
    released: bool = False
    """Given back at shutdown: only the release is written, not the handler's late result."""
    completing: bool = False
    """Its outcome is being written: a heartbeat that misses it now is no lost lease."""
    message_gone: bool = False
    """SQS says its message no longer exists (a redelivered copy, received after the
    visibility lapsed, was deleted by the receiver that found the job running): no more
    visibility extensions. The database lease alone holds the job, as it always does."""
    stop_reason: str | None = None
    """Why the handler was told to stop (deadline, lost lease, shutdown); None if it was not."""
    _on_stop: Callable[[str], None] | None = field(default=None, init=False, repr=False)
    _stuck: bool = field(default=False, init=False, repr=False)
    _returned: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def heartbeating(self) -> bool:
        return not (self.lease_lost or self.abandoned or self.completing)

    def stop(self, reason: str) -> None:
        """Tell the handler to stop: set `ctx.cancelled`, and have whatever runs it act on
        that (an async task is cancelled, a handler process is told and later killed)."""
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
            self.context.cancelled.set()
            hook = self._on_stop
        if hook is not None:
            hook(reason)

    def on_stop(self, hook: Callable[[str], None]) -> None:
        """Call `hook(reason)` when the handler is told to stop; at once if it already was
        (a lease can be lost before an async task has started)."""
        with self._lock:
            self._on_stop = hook
            reason = self.stop_reason if self.context.cancelled.is_set() else None
        if reason is not None:
            hook(reason)

    def mark_stuck(self) -> bool:
        """Its handler is past its deadline by more than a lease and still running; False
        if it returned in the meantime (then it is not counted as stuck)."""
        with self._lock:
            self._stuck = not self._returned
            return self._stuck

    @property
    def stuck(self) -> bool:
        """Marked stuck (mark_stuck) and not returned since."""
        with self._lock:
            return self._stuck and not self._returned

    @property
    def handler_done(self) -> bool:
        with self._lock:
            return self._returned

    def handler_returned(self) -> bool:
        """The handler is done; True if it had been marked stuck (its gauge goes down)."""
        with self._lock:
            self._returned = True
            return self._stuck


class Tracker:
    """The jobs this process holds, by job id. Thread-safe."""

    def __init__(self) -> None:
        self._items: dict[int, InFlight] = {}
        self._unheld: list[InFlight] = []
        """Items no longer held whose handler still ran: replaced by a later claim of the
        same job (a stuck handler's job retried on this worker), or forgotten once given
        back at shutdown. Their handlers still run here (`handlers`)."""
        self._cond = threading.Condition()

    def add(self, item: InFlight) -> None:
        with self._cond:
            old = self._items.get(item.job_id)
            if old is not None and old is not item and not old.handler_done:
                self._unheld.append(old)
            self._items[item.job_id] = item

    def handlers(self) -> list[InFlight]:
        """Every claim whose handler has not returned: those held, and those no longer
        held (their handlers hold their concurrency slots too)."""
        with self._cond:
            self._unheld = [i for i in self._unheld if not i.handler_done]
            return [*self._unheld,
                    *(i for i in self._items.values() if not i.handler_done)]

    def forget(self, item: InFlight) -> None:
        """Stop tracking a job, once, whichever path gets here first."""
        with self._cond:
            if self._items.get(item.job_id) is item:
                del self._items[item.job_id]
                if item.released and not item.handler_done:
                    self._unheld.append(item)
                self._cond.notify_all()

    def holds(self, item: InFlight) -> bool:
        with self._cond:
            return self._items.get(item.job_id) is item

    def items(self) -> list[InFlight]:
        with self._cond:
            return list(self._items.values())

    def heartbeating(self) -> list[InFlight]:
        return [i for i in self.items() if i.heartbeating]

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def wait_settled(self, timeout: float) -> bool:
        """Wait until every claimed job's outcome is written (stuck handlers excepted)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(not i.abandoned or i.released for i in self._items.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


class Slots:
    """How many more handlers may start. Receivers reserve slots before they receive, so
    a process never holds more messages than it can run.

    Receivers are served in the order they asked (first come, first served): a receiver
    that gives its slots back and asks again at once would otherwise take them again
    before a receiver of another queue, woken by the release, could, and that queue would
    go unreceived for as long as the first one kept polling (minutes, seen with two
    queues)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._receiving = 0
        """Of `_used`: reserved by receivers and not yet settled (`settle`)."""
        self._line: collections.deque[int] = collections.deque()
        self._tickets = itertools.count()
        self._cond = threading.Condition()

    def reserve(self, most: int, timeout: float) -> int:
        """Take up to `most` free slots, waiting up to `timeout` for one (and for the
        receivers that asked earlier to be served); 0 if none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._line and self._used < self.capacity:  # the usual case: no wait
                return self._take(most)
            ticket = next(self._tickets)
            self._line.append(ticket)
            try:
                while self._line[0] != ticket or self._used >= self.capacity:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return 0
                    self._cond.wait(left)
                return self._take(most)
            finally:
                self._line.remove(ticket)
                if self._line:
                    self._cond.notify_all()  # the next in line: its turn, maybe a slot

    def _take(self, most: int) -> int:
        got = min(most, self.capacity - self._used)
        self._used += got
        self._receiving += got
        return got

    def settle(self, reserved: int, kept: int) -> None:
        """A receiver is done with `reserved` slots: `kept` now run claimed jobs (each
        freed by `release` when its handler returns), the rest are free again."""
        with self._cond:  # one lock for both: this runs once per receive
            self._receiving -= reserved
            if reserved > kept:
                self._used -= reserved - kept
                self._cond.notify_all()

    def release(self, count: int = 1) -> None:
        if count <= 0:
            # A claim that used every slot it reserved gives back none: waking the other
            # receivers (waiting on a full process) would only send them back to sleep.
            return
        with self._cond:
            self._used -= count
            self._cond.notify_all()

    @property
    def running_only(self) -> bool:
        """Every slot is held by a handler (none reserved by a receiver): the process is
        busy, not kept from receiving by another receiver."""
        with self._cond:
            return self._used - self._receiving >= self.capacity

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

    @property
    def busy(self) -> int:
        """Slots held for claimed jobs, whose handlers run or are about to (those reserved
        by a receiver that has not claimed yet are not): at most `capacity`."""
        with self._cond:
            return self._used - self._receiving

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no slot is used; False if the timeout passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._used:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
