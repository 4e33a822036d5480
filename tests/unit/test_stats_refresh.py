"""The dashboard's statistics cache keeps a snapshot for its TTL, or for ten times what it
took to compute when that is longer, on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime

from dashboard.stats import BUSY_SHARE, Snapshot, StatsCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cache_taking(seconds: list[float], ttl: float) -> tuple[StatsCache, Clock, list[int]]:
    clock, computed = Clock(), []
    cache = StatsCache(None, ttl_seconds=ttl, stale_after_seconds=30,  # type: ignore[arg-type]
                       clock=clock)

    def compute() -> Snapshot:
        computed.append(1)
        took = seconds[min(len(computed), len(seconds)) - 1]
        clock.now += took
        return Snapshot(datetime.now(UTC), {}, set(), [], [], [], [], [], took)

    cache._compute = compute  # type: ignore[method-assign]
    return cache, clock, computed


def test_a_cheap_snapshot_is_kept_for_the_ttl() -> None:
    cache, clock, computed = cache_taking([0.01], ttl=2.0)
    cache.get()
    clock.now += 1.9
    cache.get()
    assert len(computed) == 1 and cache.refresh_seconds == 2.0
    clock.now += 0.2
    cache.get()
    assert len(computed) == 2


def test_an_expensive_snapshot_is_kept_ten_times_as_long_as_it_took() -> None:
    cache, clock, computed = cache_taking([0.5], ttl=2.0)
    cache.get()
    assert cache.refresh_seconds == 0.5 / BUSY_SHARE == 5.0
    clock.now += 4.9
    cache.get()
    assert len(computed) == 1
    clock.now += 0.2
    cache.get()
    assert len(computed) == 2


def test_ttl_zero_computes_every_time() -> None:
    cache, _, computed = cache_taking([0.5], ttl=0)
    cache.get()
    cache.get()
    assert len(computed) == 2


def test_one_slow_computation_does_not_stretch_the_refresh() -> None:
    """A computation that waited out a Postgres hang (SIGSTOP, a failover) took as long as
    the outage; its snapshot is kept for the TTL, not ten times the outage."""
    cache, clock, computed = cache_taking([0.01, 20.0, 0.01], ttl=2.0)
    cache.get()
    clock.now += 2.1
    cache.get()  # this one ran into the outage: 20 s
    assert len(computed) == 2
    assert cache.refresh_seconds == 2.0
    clock.now += 2.1
    cache.get()
    assert len(computed) == 3


def test_statistics_that_stay_expensive_are_still_refreshed_less_often() -> None:
    cache, clock, computed = cache_taking([0.01, 0.5, 0.5], ttl=2.0)
    cache.get()
    clock.now += 2.1
    cache.get()
    assert cache.refresh_seconds == 2.0  # one expensive computation is not yet a trend
    clock.now += 2.1
    cache.get()
    assert len(computed) == 3
    assert cache.refresh_seconds == 0.5 / BUSY_SHARE == 5.0
