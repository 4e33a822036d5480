"""Cluster-wide numbers, computed from Postgres at most once per TTL, shared by the live
page (/api/stats/overview) and the Prometheus endpoint (/metrics). However many browsers
and scrapers ask, the database answers once per TTL; the timer and consumer replicas
export only their own process counters (shared.metrics)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.core.errors import DatabaseError
from shared.core.filters import FINISHED_STATES
from shared.core.reports import Bucket, LimitInfo, QueueKindStats, TenantStats, WorkerInfo
from shared.core.states import JobState
from shared.ops.jobs import timeline
from shared.store.flow_store import FlowStore
from shared.store.operator_store import OperatorStore


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    counts: dict[tuple[str, str], int]
    estimated: set[str]
    """States whose counts include estimates (big history partitions; unfinished ranges
    past UNFINISHED_EXACT_UP_TO)."""
    queues: list[QueueKindStats]
    tenants: list[TenantStats]
    limits: list[LimitInfo]
    workers: list[WorkerInfo]
    timeline: list[Bucket]
    compute_seconds: float


BUSY_SHARE = 0.1
"""At most this share of the time goes to computing statistics: a snapshot that took c
seconds is kept for at least c / BUSY_SHARE, so a big hot table slows the refresh rather
than keeping a Postgres core busy for the dashboard."""


SERVE_STALE_FOR_SECONDS = 120.0
"""While another caller computes a snapshot, the last one is served if it is no older than
this; past it, callers wait for the computation (the API) or report the statistics down
(/metrics), rather than show numbers minutes old as current."""


class StatsStale(DatabaseError):
    """The statistics are being computed, and the last snapshot is too old to serve."""


class StatsCache:
    """Computes a `Snapshot` when the last one is older than `ttl_seconds` (or, when that
    is longer, ten times what the last one took, or the one before it if that was quicker:
    see BUSY_SHARE); one caller computes it, and the others meanwhile get the last one
    (up to SERVE_STALE_FOR_SECONDS old) instead of waiting: a scrape must not wait out a
    computation that a lock or a slow Postgres holds up. `ttl_seconds=0` computes every
    time.

    Only the quicker of the last two computations counts: one that took long because
    Postgres hung or was restarting while it ran (it then takes as long as the outage)
    says nothing about what the statistics cost, and must not keep its snapshot, read just
    as the database came back, for ten times the outage."""

    def __init__(self, store: OperatorStore, *, ttl_seconds: float,
                 stale_after_seconds: float, finished_ttl_seconds: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.ttl_seconds = ttl_seconds
        self.finished_ttl_seconds = max(finished_ttl_seconds, ttl_seconds)
        self.stale_after_seconds = stale_after_seconds
        self._lock = threading.Lock()  # the fields below
        self._computing = threading.Lock()  # held by the one caller computing
        self._snapshot: Snapshot | None = None
        self._taken = 0.0
        self._previous_compute_seconds: float | None = None
        """What the snapshot before the current one took to compute."""
        self._finished: dict[tuple[str, str], int] = {}
        self._finished_estimated: set[str] = set()
        self._finished_taken: float | None = None

    @property
    def refresh_seconds(self) -> float:
        """How long the current snapshot is kept."""
        if self.ttl_seconds <= 0 or self._snapshot is None:
            return self.ttl_seconds
        took = self._snapshot.compute_seconds
        if self._previous_compute_seconds is not None:
            took = min(took, self._previous_compute_seconds)
        return max(self.ttl_seconds, took / BUSY_SHARE)

    @property
    def age_seconds(self) -> float:
        """How long ago the current snapshot was taken (0 before the first)."""
        with self._lock:
            return self.clock() - self._taken if self._snapshot is not None else 0.0

    def get(self, *, wait: bool = True) -> Snapshot:
        """The current snapshot, computed first when it is due. While another caller
        computes one, the last is returned at once if it is at most
        SERVE_STALE_FOR_SECONDS old; otherwise this waits for it, or with `wait=False`
        raises StatsStale."""
        fresh = self._fresh()
        if fresh is not None:
            return fresh
        with self._lock:
            stale = self._snapshot
            servable = (stale is not None
                        and self.clock() - self._taken <= SERVE_STALE_FOR_SECONDS)
        if not self._computing.acquire(blocking=wait and not servable):
            if servable and stale is not None:
                return stale
            raise StatsStale("the cluster statistics are being computed, and the last were "
                             f"taken more than {SERVE_STALE_FOR_SECONDS:.0f} s ago")
        try:
            fresh = self._fresh()  # another caller may have computed it while this waited
            if fresh is not None:
                return fresh
            snapshot = self._compute()
            with self._lock:
                if self._snapshot is not None:
                    self._previous_compute_seconds = self._snapshot.compute_seconds
                self._snapshot, self._taken = snapshot, self.clock()
            return snapshot
        finally:
            self._computing.release()

    def _fresh(self) -> Snapshot | None:
        with self._lock:
            if self._snapshot is not None and (
                    self.clock() - self._taken < self.refresh_seconds):
                return self._snapshot
            return None

    def _compute(self) -> Snapshot:
        started = self.clock()
        with self.store.transaction() as tx:
            # One snapshot of the database for every number (REPEATABLE READ would need a
            # separate transaction start; the figures are seconds-fresh anyway).
            now = tx.database_now()
            unfinished = tx.unfinished(now)
            counts = dict(unfinished.counts)
            if (self._finished_taken is None
                    or started - self._finished_taken >= self.finished_ttl_seconds):
                # The history (succeeded, dead, cancelled) is the expensive part and
                # changes slowly relative to a scrape: counted less often.
                self._finished, self._finished_estimated = tx.finished_counts(FINISHED_STATES)
                self._finished_taken = started
            counts.update(self._finished)
            tenants = tx.tenant_stats(now)
            limits = tx.sibling(FlowStore).limits(now=now)
            workers = tx.workers(stale_after_seconds=self.stale_after_seconds, now=now)
            buckets = timeline(tx, now=now)
        return Snapshot(now, counts, self._finished_estimated | unfinished.estimated,
                        unfinished.queues, tenants, limits,
                        workers, buckets, self.clock() - started)


SERIES_KEPT_SECONDS = 86_400.0
"""A queue and kind whose unfinished jobs are all gone keeps its per-queue gauges, at 0,
this long after it was last seen: an alert on its depth or oldest age must read 0, not a
series that vanished (a threshold rule would hold its last value's state, absent() fire)."""


class ClusterCollector(Collector):
    """Prometheus gauges of the whole cluster, from the shared snapshot."""

    def __init__(self, cache: StatsCache, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self.clock = clock
        self._seen: dict[tuple[str, str], float] = {}
        """(queue, kind) -> when the snapshot last had unfinished jobs of it."""
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("tock_cluster_stats_up",
                               "1 if the cluster statistics could be read from Postgres")
        try:
            snap = self.cache.get(wait=False)
        except DatabaseError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("tock_jobs", "Jobs by state and kind", labels=["state", "kind"])
        for (state, kind), n in sorted(snap.counts.items()):
            jobs.add_metric([state, kind], n)
        yield jobs
        estimated = GaugeMetricFamily(
            "tock_jobs_estimated",
            "1 where the tock_jobs counts of a state include estimates (history partitions "
            "past 20,000 rows, unfinished (queue, kind, state) ranges past 10,000)",
            labels=["state"])
        for state in JobState:
            estimated.add_metric([state.value], int(state.value in snap.estimated))
        yield estimated
        depth = GaugeMetricFamily(
            "tock_queue_depth", "Jobs due and not yet running (waiting for a timer or in SQS)",
            labels=["queue", "kind"])
        oldest = GaugeMetricFamily(
            "tock_oldest_due_age_seconds",
            "How long the oldest due job that has not started has waited (autoscaling signal)",
            labels=["queue", "kind"])
        running = GaugeMetricFamily("tock_jobs_running", "Jobs running now",
                                    labels=["queue", "kind"])
        future = GaugeMetricFamily("tock_jobs_scheduled_future", "Jobs not yet due",
                                   labels=["queue", "kind"])
        for q in snap.queues:
            labels = [q.queue, q.kind]
            depth.add_metric(labels, q.depth)
            oldest.add_metric(labels, q.oldest_due_age_seconds)
            running.add_metric(labels, q.running)
            future.add_metric(labels, q.future)
        for queue, kind in self._emptied({(q.queue, q.kind) for q in snap.queues}):
            for gauge in (depth, oldest, running, future):
                gauge.add_metric([queue, kind], 0)
        yield from (depth, oldest, running, future)
        yield from _tenant_gauges(snap.tenants)
        yield from _limit_gauges(snap.limits)
        workers = GaugeMetricFamily("tock_workers", "Consumer processes by status",
                                    labels=["status"])
        by_status = {"alive": 0, "stale": 0, "stopped": 0}
        for w in snap.workers:
            by_status[w.status] += 1
        for status, n in by_status.items():
            workers.add_metric([status], n)
        yield workers
        alive = [w for w in snap.workers if w.status == "alive"]
        yield GaugeMetricFamily("tock_worker_slots", "Handler slots of live consumers",
                                value=sum(w.concurrency for w in alive))
        yield GaugeMetricFamily("tock_worker_slots_busy", "Busy handler slots of live consumers",
                                value=sum(w.in_flight for w in alive))
        yield GaugeMetricFamily("tock_cluster_stats_seconds",
                                "Time the last statistics computation took",
                                value=snap.compute_seconds)
        yield GaugeMetricFamily("tock_cluster_stats_age_seconds",
                                "How long ago these statistics were computed (a scrape "
                                "during a refresh gets the previous ones)",
                                value=self.cache.age_seconds)
        yield GaugeMetricFamily("tock_cluster_stats_refresh_seconds",
                                "How long a statistics snapshot is kept (the TTL, or ten "
                                "times its computation when that is longer)",
                                value=self.cache.refresh_seconds)


    def _emptied(self, present: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (queue, kind) pairs seen within SERIES_KEPT_SECONDS and empty now."""
        now = self.clock()
        with self._lock:
            for pair in present:
                self._seen[pair] = now
            for pair in [p for p, at in self._seen.items() if now - at > SERIES_KEPT_SECONDS]:
                del self._seen[pair]
            return sorted(self._seen.keys() - present)


def _tenant_gauges(tenants: list[TenantStats]) -> Iterator[GaugeMetricFamily]:
    """Per tenant ('' for jobs without one; the busiest MAX_TENANT_ROWS, so the label's
    cardinality stays bounded): due, running and the fair-share weight."""
    due = GaugeMetricFamily("tock_tenant_due", "Due jobs waiting for a timer, per tenant",
                            labels=["tenant"])
    running = GaugeMetricFamily("tock_tenant_running", "Jobs running now, per tenant",
                                labels=["tenant"])
    weight = GaugeMetricFamily("tock_tenant_weight", "Fair-share weight (default 1)",
                               labels=["tenant"])
    for t in tenants:
        due.add_metric([t.tenant], t.due)
        running.add_metric([t.tenant], t.running)
        weight.add_metric([t.tenant], t.weight)
    yield from (due, running, weight)


def _limit_gauges(limits: list[LimitInfo]) -> Iterator[GaugeMetricFamily]:
    """Per limit (scope kind, tenant or kind_key; key): its bound, its use and the jobs it
    holds (kind_key: max_running is per key, in_flight all its keys' together)."""
    labels = ["scope", "key"]
    maximum = GaugeMetricFamily("tock_limit_max_running",
                                "Concurrency limit: jobs dispatched or running at once",
                                labels=labels)
    in_flight = GaugeMetricFamily("tock_limit_in_flight",
                                  "Slots of the limit held: jobs dispatched or running, and "
                                  "lingering handlers",
                                  labels=labels)
    lingering = GaugeMetricFamily("tock_limit_lingering",
                                  "Slots of the limit held by handlers still running for jobs "
                                  "that left their worker (cancelled, or stuck)",
                                  labels=labels)
    rate = GaugeMetricFamily("tock_limit_rate_per_second", "Rate limit: dispatches per second",
                             labels=labels)
    tokens = GaugeMetricFamily("tock_limit_tokens", "Rate tokens in the bucket now",
                               labels=labels)
    waiting = GaugeMetricFamily("tock_limit_waiting",
                                "Due jobs of the limit's kind or tenant waiting in Postgres",
                                labels=labels)
    keys_full = GaugeMetricFamily("tock_limit_keys_at_limit",
                                  "Per-key limit: concurrency keys with max_running in flight",
                                  labels=labels)
    for limit in limits:
        key = [limit.scope, limit.key]
        if limit.keys_at_limit is not None:
            keys_full.add_metric(key, limit.keys_at_limit)
        if limit.max_running is not None:
            maximum.add_metric(key, limit.max_running)
            in_flight.add_metric(key, limit.in_flight or 0)
            lingering.add_metric(key, limit.lingering)
        if limit.rate_per_second is not None:
            rate.add_metric(key, limit.rate_per_second)
            tokens.add_metric(key, limit.tokens or 0.0)
        waiting.add_metric(key, limit.waiting)
    yield from (maximum, in_flight, lingering, rate, tokens, waiting, keys_full)


def state_totals(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    """Jobs per state, every state present."""
    totals = {s.value: 0 for s in JobState}
    for (state, _), n in counts.items():
        totals[state] = totals.get(state, 0) + n
    return totals
