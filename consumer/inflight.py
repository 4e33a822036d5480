"""Book-keeping of the jobs a consumer process holds, and of its free handler slots."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from uuid import UUID

from consumer.tasks import TaskContext


@dataclass
class InFlight:
    """A claimed job from claim until its outcome is written (or it is given up)."""

    job_id: int
    attempt: int
    token: UUID
    queue: str
    receipt: str
    context: TaskContext
    started: float = field(default_factory=time.monotonic)
    timeout_seconds: float = 0.0
    timed_out: bool = False
    lease_lost: bool = False
    abandoned: bool = False
    """No more heartbeats: the lease will expire and the timer recovers the job."""
    released: bool = False
    """Given back at shutdown: only the release is written, not the handler's late result."""

    @property
    def heartbeating(self) -> bool:
        return not (self.lease_lost or self.abandoned)


class Slots:
    """How many more handlers may start. Receivers reserve slots before they receive, so
    a process never holds more messages than it can run."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._cond = threading.Condition()

    def reserve(self, most: int, timeout: float) -> int:
        """Take up to `most` free slots, waiting up to `timeout` for one; 0 if none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._used >= self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                self._cond.wait(left)
            got = min(most, self.capacity - self._used)
            self._used += got
            return got

    def release(self, count: int = 1) -> None:
        with self._cond:
            self._used -= count
            self._cond.notify_all()

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

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
