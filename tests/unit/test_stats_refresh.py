"""The dashboard's statistics cache keeps a snapshot for its TTL, or for ten times what it
took to compute when that is longer, on an injected clock; while one caller computes the
next, the others get the last one."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from dashboard.stats import (
    BUSY_SHARE,
    SERVE_STALE_FOR_SECONDS,
    ClusterCollector,
    Snapshot,
    StatsCache,
    StatsStale,
)


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


class Blocking:
    """A computation that waits until released, as one held up by a table lock."""

    def __init__(self, cache: StatsCache, clock: Clock) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.clock, self.calls = clock, 0
        cache._compute = self  # type: ignore[method-assign]

    def __call__(self) -> Snapshot:
        self.calls += 1
        if self.calls > 1:
            self.started.set()
            assert self.release.wait(10)
        return Snapshot(datetime.now(UTC), {("succeeded", "k"): self.calls}, set(), [], [],
                        [], [], [], 0.01)


def computing_in_background(age: float) -> tuple[StatsCache, Blocking, threading.Thread]:
    """A cache whose first snapshot is `age` seconds old, and a thread computing the next,
    held up inside the computation."""
    clock = Clock()
    cache = StatsCache(None, ttl_seconds=2.0, stale_after_seconds=30,  # type: ignore[arg-type]
                       clock=clock)
    blocking = Blocking(cache, clock)
    cache.get()
    clock.now += age
    worker = threading.Thread(target=cache.get)
    worker.start()
    assert blocking.started.wait(10)
    return cache, blocking, worker


def test_while_one_caller_computes_the_others_get_the_last_snapshot_at_once() -> None:
    """A scrape during a refresh held up by a lock waited for it, past a typical scrape
    timeout; it now gets the previous numbers, and their age says how old they are."""
    cache, blocking, worker = computing_in_background(age=5.0)
    for wait in (True, False):
        assert cache.get(wait=wait).counts == {("succeeded", "k"): 1}
    assert cache.age_seconds == 5.0
    collected = {m.name: m for m in ClusterCollector(cache).collect()}
    assert collected["tock_cluster_stats_up"].samples[0].value == 1
    assert collected["tock_cluster_stats_age_seconds"].samples[0].value == 5.0
    blocking.release.set()
    worker.join(10)
    assert cache.get().counts == {("succeeded", "k"): 2} and blocking.calls == 2


def test_numbers_too_old_to_serve_are_waited_for_or_reported_down() -> None:
    cache, blocking, worker = computing_in_background(age=SERVE_STALE_FOR_SECONDS + 1)
    with pytest.raises(StatsStale, match="being computed"):
        cache.get(wait=False)
    collected = {m.name: m for m in ClusterCollector(cache).collect()}
    assert collected["tock_cluster_stats_up"].samples[0].value == 0
    waiter: list[Snapshot] = []
    api = threading.Thread(target=lambda: waiter.append(cache.get()))
    api.start()
    blocking.release.set()
    for thread in (worker, api):
        thread.join(10)
    assert waiter[0].counts == {("succeeded", "k"): 2}
    assert blocking.calls == 2, "the waiter took the snapshot computed meanwhile"
