"""The profiles that size a fault run, and the settings every run shares: the processes'
TOCK_* settings (short leases and timeouts, so faults play out in seconds), the queue's
visibility timeout and dead-letter count, and how many timers and consumers run."""

from __future__ import annotations

from dataclasses import dataclass

LEASE_SECONDS = 3.0
PROCESS_SETTINGS = {
    "LEASE_SECONDS": f"{LEASE_SECONDS:g}",
    "HEARTBEAT_SECONDS": "1",
    "VISIBILITY_TIMEOUT_SECONDS": "5",
    "RECEIVE_WAIT_SECONDS": "1",
    "BACKOFF_BASE_SECONDS": "0.2",
    "BACKOFF_CAP_SECONDS": "1",
    "SHUTDOWN_GRACE_SECONDS": "2",
    "DISPATCH_TIMEOUT_SECONDS": "5",  # the minimum allowed
    "CREATE_QUEUES": "1",  # processes recreate a missing SQS queue
}
VISIBILITY_TIMEOUT = 5
DEAD_LETTER_AFTER = 5
TIMERS, CONSUMERS = 2, 3


@dataclass(frozen=True)
class Profile:
    name: str
    jobs: int
    concurrency: int
    """Handlers per consumer process."""
    ms: tuple[int, int]
    """Handler run time, uniform in this range (milliseconds)."""
    drain_bound: float
    """Every job must be finished this long after the fault ends."""
    wait_after_fault: float
    """How long to wait for the jobs after the fault, before calling the rest lost."""
    kill_window: float
    kill_gap: tuple[float, float]


PROFILES = {
    "small": Profile("small", jobs=60, concurrency=8, ms=(100, 1200), drain_bound=15.0,
                     wait_after_fault=30.0, kill_window=6.0, kill_gap=(0.4, 1.2)),
    "full": Profile("full", jobs=1000, concurrency=16, ms=(20, 300), drain_bound=15.0,
                    wait_after_fault=90.0, kill_window=10.0, kill_gap=(0.3, 1.0)),
}
