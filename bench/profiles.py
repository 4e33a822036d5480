"""How big each benchmark phase is. `quick` is `make bench` (under 10 minutes on 2 cores),
`full` is `make bench-full`, `tiny` only proves the machinery works (the test suite)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    raw_seconds: float
    """How long each raw ceiling loop runs."""
    raw_rows: int
    """Rows in the raw claim table (enough that no loop runs dry)."""
    enqueue_one_by_one: int
    enqueue_batches: int
    enqueue_batch_size: int
    dispatch_jobs: int
    """Due backlog the timer dispatches (then the consumers drain it)."""
    consumer_counts: tuple[int, ...]
    consumer_concurrency: int
    memory_jobs: int
    """Jobs through timer + consumer over the in-memory transport."""
    latency_simultaneous: int
    latency_steady_rate: float
    latency_steady_seconds: float
    burst_jobs: int
    scale_sizes: tuple[int, ...]
    scale_due: int
    """Due rows claimed at each table size."""
    hotspot_jobs: int
    """Jobs run under cProfile to say where the time goes; 0 skips it."""
    fair_backlog: int
    """Tenant A's overdue jobs when tenant B's 100 arrive."""
    fair_window: int
    """A's dispatches per rate window (before B, from B on)."""
    fair_rounds: int
    """Tenant B's rounds of 100 jobs, with and without A's backlog."""
    history_rows: int
    """Finished jobs put in the history before the claim is measured again at the
    smallest scale size."""
    fair_sqs_backlog: int
    """Tenant A's jobs through the real fleet when tenant B's 100 fall due."""
    fair_sqs_window: int | None
    """TOCK_DISPATCH_WINDOW for that run (None: the default)."""
    fair_sqs_compare: bool
    """Run it again with no window, to show what the window changes."""
    fair_sqs_rounds: int
    """Trials of it, each on a fresh fleet: the figures are the median round's."""
    soak_seconds: float
    """The sustained run (table health, memory over a long run)."""
    soak_rate: float
    """Its rate in jobs/s (capped at half the run's best end to end)."""
    peer_jobs: int = 0
    """No-op jobs a peer scheduler (Procrastinate) drains at each in-memory concurrency, on
    the same Postgres server; 0 skips the peers (tiny: no download in the test suite)."""

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.consumer_counts) or not self.consumer_counts:
            raise ValueError("consumer_counts must be positive")
        if list(self.scale_sizes) != sorted(self.scale_sizes) or not self.scale_sizes:
            raise ValueError("scale_sizes must be increasing")
        # Dispatch rates come from the claim transactions' timestamps: they need several
        # timer batches (100-200 jobs each) to span a measurable time.
        if self.dispatch_jobs < 600 or self.scale_due < 600:
            raise ValueError("dispatch_jobs and scale_due must be at least 600 (3+ batches)")


QUICK = Profile(
    name="quick", raw_seconds=3.0, raw_rows=50_000,
    enqueue_one_by_one=500, enqueue_batches=20, enqueue_batch_size=500,
    dispatch_jobs=4_000, consumer_counts=(1, 2, 4), consumer_concurrency=20,
    memory_jobs=6_000,
    latency_simultaneous=500, latency_steady_rate=100.0, latency_steady_seconds=10.0,
    burst_jobs=10_000,
    scale_sizes=(10_000, 100_000, 1_000_000), scale_due=3_000,
    hotspot_jobs=3_000,
    fair_backlog=1_000_000, fair_window=20_000, fair_rounds=20,
    history_rows=1_000_000,
    fair_sqs_backlog=10_000, fair_sqs_window=None, fair_sqs_compare=False,
    fair_sqs_rounds=3,
    soak_seconds=60.0, soak_rate=200.0, peer_jobs=6_000,
)

FULL = Profile(
    name="full", raw_seconds=10.0, raw_rows=200_000,
    enqueue_one_by_one=3_000, enqueue_batches=100, enqueue_batch_size=500,
    dispatch_jobs=15_000, consumer_counts=(1, 2, 4), consumer_concurrency=20,
    memory_jobs=20_000,
    latency_simultaneous=500, latency_steady_rate=100.0, latency_steady_seconds=30.0,
    burst_jobs=10_000,
    scale_sizes=(10_000, 100_000, 1_000_000, 5_000_000), scale_due=10_000,
    hotspot_jobs=10_000,
    fair_backlog=1_000_000, fair_window=50_000, fair_rounds=20,
    history_rows=10_000_000,
    fair_sqs_backlog=20_000, fair_sqs_window=None, fair_sqs_compare=True,
    fair_sqs_rounds=3,
    soak_seconds=600.0, soak_rate=200.0, peer_jobs=20_000,
)

TINY = Profile(
    name="tiny", raw_seconds=0.5, raw_rows=3_000,
    enqueue_one_by_one=30, enqueue_batches=3, enqueue_batch_size=20,
    dispatch_jobs=600, consumer_counts=(1, 2), consumer_concurrency=10,
    memory_jobs=1_000,
    latency_simultaneous=40, latency_steady_rate=20.0, latency_steady_seconds=1.0,
    burst_jobs=150,
    scale_sizes=(1_000, 3_000), scale_due=600,
    hotspot_jobs=100,
    fair_backlog=60_000, fair_window=2_000, fair_rounds=5,
    history_rows=20_000,
    fair_sqs_backlog=1_000, fair_sqs_window=100, fair_sqs_compare=False,
    fair_sqs_rounds=1,
    soak_seconds=3.0, soak_rate=20.0,
)

PROFILES = {p.name: p for p in (QUICK, FULL, TINY)}
