"""Due-to-start latency (500 jobs due at one instant, then a steady rate of scheduled jobs)
and the burst (the top-of-hour herd), on one fleet of a timer and consumer processes, whose
memory is sampled throughout. Latency is `started_at - run_at`, both written by Postgres."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import psycopg

from bench import noop_tasks, waiting
from bench.pipeline import COUNT_STATE, LIVE_WORKERS, Context, _timeout, insert_due
from bench.stats import percentiles
from shared.client import Client
from shared.runtime.settings import ClientSettings

LAGS = """
SELECT extract(epoch FROM started_at - run_at)::float8,
       extract(epoch FROM dispatched_at - run_at)::float8
FROM tock_jobs_all WHERE id > %(after)s AND state = 'succeeded' ORDER BY run_at
"""

MAX_ID = "SELECT coalesce(max(id), 0) FROM tock_jobs_all"

DRAIN = """
SELECT extract(epoch FROM finished_at - %(t0)s::timestamptz)::float8,
       extract(epoch FROM dispatched_at - %(t0)s::timestamptz)::float8,
       extract(epoch FROM started_at - run_at)::float8
FROM tock_jobs_all WHERE id > %(after)s
"""

TARGET_P99_MS = 100.0
STEADY_TARGET_RATE = 100.0
"""The steady rate (jobs/s) at which the due-to-start p99 target is judged."""


def latency_and_burst(ctx: Context, consumers: int) -> None:
    url = ctx.services.fresh_database("bench_latency")
    prefix = ctx.phase_queue("latency")
    fleet = ctx.fleet("latency-burst", url, prefix)
    try:
        fleet.start_timer()
        fleet.start_consumers(consumers)
        waiting.until(url, LIVE_WORKERS, lambda v: v == consumers, timeout=60,
                      what=f"{consumers} consumers up", fleet=fleet)
        # Warm-up: one job through the whole path, so first-use costs are not measured.
        _run_batch(url, 1, fleet, lead_seconds=0.0)
        simultaneous(ctx, url, fleet, consumers)
        ctx.results.series["memory_warm_t"] = _sampler_now(ctx)
        steady(ctx, url, fleet, consumers)
        burst(ctx, url, fleet, consumers)
    finally:
        fleet.stop()
        ctx.sampler.watch(None)


def _sampler_now(ctx: Context) -> float:
    return round(time.monotonic() - ctx.sampler._started, 2)


def _run_batch(url: str, n: int, fleet: Any, *, lead_seconds: float,
               spread_seconds: float = 0.0) -> tuple[int, Any]:
    """Insert `n` jobs due `lead_seconds` from now (spread over `spread_seconds`), wait for
    all of them to succeed; returns (id before the batch, their common due instant)."""
    after = waiting.scalar(url, MAX_ID)
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = conn.execute("SELECT date_trunc('second', now()) + make_interval(secs => "
                          "ceil(%(lead)s))", {"lead": lead_seconds}).fetchone()[0]  # type: ignore[index]
    insert_due(url, n, at=t0 if lead_seconds else None, spread_seconds=spread_seconds)
    total = waiting.scalar(url, "SELECT count(*) FROM tock_jobs_all")
    waiting.until(url, COUNT_STATE, lambda v: v == total, params={"state": "succeeded"},
                  timeout=_timeout(n) + lead_seconds, what=f"{n} jobs succeeded", fleet=fleet)
    return after, t0


def lags(url: str, after: int) -> tuple[list[float], list[float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(LAGS, {"after": after}).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def simultaneous(ctx: Context, url: str, fleet: Any, consumers: int) -> None:
    n = ctx.profile.latency_simultaneous
    after, _ = _run_batch(url, n, fleet, lead_seconds=2.0)
    start, dispatch = lags(url, after)
    summary = percentiles(start)
    ctx.results.series["latency_simultaneous"] = {
        "jobs": n, "consumers": consumers, "due_to_start": summary,
        "due_to_dispatch": percentiles(dispatch), "samples_s": start}
    p99 = summary["p99_ms"]
    fig = ctx.results.raw("latency.simultaneous.p99", "latency",
                          f"due-to-start p99, {n} jobs due at one instant", p99, "ms")
    fig.target, fig.met = f"<= {TARGET_P99_MS:.0f} ms", p99 <= TARGET_P99_MS
    for q in ("p50", "p95", "max"):
        ctx.results.raw(f"latency.simultaneous.{q}", "latency",
                        f"due-to-start {q}, {n} jobs due at one instant",
                        summary[f"{q}_ms"], "ms")
    ctx.progress.say(f"  {n} simultaneous: p50 {summary['p50_ms']:.0f} ms, "
                     f"p99 {p99:.0f} ms, max {summary['max_ms']:.0f} ms")


def floor(ctx: Context) -> None:
    """No pipeline can start the last of n simultaneous jobs before the SQS server has sent,
    received and deleted n messages: the raw path ceiling puts a floor under the p99.
    Called once the ceilings are final."""
    path = ctx.results.figure("raw.sqs.path")
    p99 = ctx.results.figure("latency.simultaneous.p99")
    if path is None or p99 is None or path.value <= 0 or not p99.value:
        return
    n = ctx.results.series["latency_simultaneous"]["jobs"]
    floor_ms = 0.99 * n / path.value * 1000
    ctx.results.raw("latency.simultaneous.floor", "latency",
                    f"p99 floor the raw SQS path sets for {n} simultaneous jobs", floor_ms,
                    "ms", note="0.99 n / best raw send+receive+delete rate")
    ctx.results.raw("latency.simultaneous.vs_floor", "latency",
                    "that floor / tock's p99 (1.0 = as fast as the SQS server allows)",
                    floor_ms / p99.value, "x")


def steady(ctx: Context, url: str, fleet: Any, consumers: int) -> None:
    """`schedule()` at a fixed rate from this process, jobs due at once."""
    p = ctx.profile
    after = waiting.scalar(url, MAX_ID)
    target = steady_rate(ctx)
    count = int(target * p.latency_steady_seconds)
    with Client(ClientSettings(database_url=url)) as client:
        start = time.perf_counter()
        for i in range(count):
            wake = start + i / target
            delay = wake - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing the producer, not waiting for a result
            client.schedule(noop_tasks.KIND, {"n": i})
        achieved = count / (time.perf_counter() - start)
    total = waiting.scalar(url, "SELECT count(*) FROM tock_jobs_all")
    waiting.until(url, COUNT_STATE, lambda v: v == total, params={"state": "succeeded"},
                  timeout=_timeout(count), what="steady jobs succeeded", fleet=fleet)
    start_lags, dispatch_lags = lags(url, after)
    summary = percentiles(start_lags)
    ctx.results.series["latency_steady"] = {
        "rate_per_s": target, "achieved_rate_per_s": achieved,
        "consumers": consumers, "due_to_start": summary,
        "due_to_dispatch": percentiles(dispatch_lags), "samples_s": start_lags}
    for q in ("p50", "p95", "p99", "max"):
        ctx.results.raw(f"latency.steady.{q}", "latency",
                        f"due-to-start {q}, steady {target:.0f} jobs/s",
                        summary[f"{q}_ms"], "ms")
    # The target is set at 100 jobs/s; a run capped below that rate (a slow
    # producer or pipeline, see steady_rate) does not judge it.
    if target >= STEADY_TARGET_RATE:
        p99 = ctx.results.figure("latency.steady.p99")
        assert p99 is not None
        p99.target, p99.met = f"<= {TARGET_P99_MS:.0f} ms", p99.value <= TARGET_P99_MS
    ctx.progress.say(f"  steady {target:.0f}/s: p50 {summary['p50_ms']:.0f} ms, "
                     f"p99 {summary['p99_ms']:.0f} ms")


def steady_rate(ctx: Context) -> float:
    """The profile's steady rate, capped at half of what this run measured the producer
    (`schedule()` one by one) and the pipeline (best end to end) can do: a steady load is
    meant to sit well below capacity, or it measures queueing instead of latency."""
    caps = [ctx.profile.latency_steady_rate]
    producer = ctx.results.figure("enqueue.one")
    if producer is not None and producer.value > 0:
        caps.append(producer.value / 2)
    pipeline = [f.value for f in (ctx.results.figure(f"e2e.c{k}")
                                  for k in ctx.profile.consumer_counts) if f is not None]
    if pipeline and max(pipeline) > 0:
        caps.append(max(pipeline) / 2)
    return float(max(round(min(caps)), 1))


def burst(ctx: Context, url: str, fleet: Any, consumers: int) -> None:
    """`burst_jobs` jobs due within the same second, inserted a few seconds ahead."""
    n = ctx.profile.burst_jobs
    from bench.pipeline import _reset_statements, statement_times

    _reset_statements(url)
    after, t0 = _run_batch(url, n, fleet, lead_seconds=3.0, spread_seconds=1.0)
    ctx.results.hotspots["statements_burst"] = statement_times(url, n)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(DRAIN, {"t0": t0, "after": after}).fetchall()
    finished = np.sort(np.array([r[0] for r in rows]))
    dispatched = np.sort(np.array([r[1] for r in rows]))
    lags = [r[2] for r in rows]
    drain = float(finished[-1])
    grid = np.linspace(0.0, max(drain, 0.1), 200)
    summary = percentiles(lags)
    ctx.results.series["burst"] = {
        "jobs": n, "consumers": consumers, "drain_seconds": drain, "due_to_start": summary,
        "curve": {"t_s": grid.round(3).tolist(),
                  "finished": np.searchsorted(finished, grid, side="right").tolist(),
                  "dispatched": np.searchsorted(dispatched, grid, side="right").tolist()}}
    ctx.results.raw("burst.drain", "burst", f"{n} jobs due in one second: time to drain",
                    drain, "s", note="from the start of the due second to the last finish")
    ctx.results.raw("burst.lag_p99", "burst", f"{n} jobs due in one second: due-to-start p99",
                    summary["p99_ms"], "ms")
    drain_rate = n / drain if drain > 0 else 0.0
    # Every job of the burst costs the SQS server a send, a receive and a delete.
    ctx.results.ratio("burst.rate", "burst", "burst drain rate (jobs / drain time)",
                      drain_rate, "jobs/s", "raw.sqs.path")
    steady_key = f"e2e.c{consumers}"
    if ctx.results.figure(steady_key) is not None:
        ctx.results.ratio("burst.vs_steady", "burst",
                          f"{n} jobs due at once, drained vs the steady end-to-end throughput "
                          f"of {consumers} consumer(s)", drain_rate, "jobs/s", steady_key,
                          minimum=0.8)
    ctx.results.raw("burst.dispatch_rate", "burst", "timer dispatch rate during the burst",
                    n / float(dispatched[-1]) if dispatched[-1] > 0 else 0.0, "jobs/s",
                    note="jobs / (last dispatch - start of the due second)")
    ctx.results.raw("burst.rate_while_dispatching", "burst",
                    "jobs finished per second while the timer was still dispatching",
                    _finished_while_dispatching(finished, dispatched), "jobs/s")
    ctx.progress.say(f"  burst of {n}: drained in {drain:.1f} s, "
                     f"lag p99 {summary['p99_ms'] / 1000:.1f} s")


def _finished_while_dispatching(finished: np.ndarray[Any, Any],
                                dispatched: np.ndarray[Any, Any]) -> float:
    """Completions per second between the first and the last dispatch of the burst."""
    first, last = float(dispatched[0]), float(dispatched[-1])
    if last <= first:
        return 0.0
    done = int(np.searchsorted(finished, last, side="right"))
    return done / (last - first)


def memory(ctx: Context) -> None:
    """RSS figures of the latency/burst fleet: peak, and the end against just after warm-up,
    while the backlog went from zero to the burst and back."""
    samples = [s for s in ctx.sampler.samples if s["phase"] == "latency-burst"]
    warm_t = ctx.results.series.get("memory_warm_t", 0.0)
    ctx.results.series["rss"] = ctx.sampler.samples
    for role_prefix, label in (("timer", "timer"), ("consumer", "consumer")):
        per_proc: dict[str, list[dict[str, Any]]] = {}
        for s in samples:
            if s["role"].startswith(role_prefix):
                per_proc.setdefault(s["role"], []).append(s)
        if not per_proc:
            continue
        peak = max(s["rss_mb"] for group in per_proc.values() for s in group)
        growth = []
        for group in per_proc.values():
            warm = [s["rss_mb"] for s in group if s["t"] >= warm_t][:3]
            end = [s["rss_mb"] for s in group][-3:]
            if warm and end:
                growth.append(float(np.median(end)) / float(np.median(warm)))
        ctx.results.raw(f"memory.{label}.peak", "memory", f"{label} RSS peak", peak, "MB")
        if growth:
            worst = max(growth)
            fig = ctx.results.raw(f"memory.{label}.growth", "memory",
                                  f"{label} RSS at the end / after warm-up (worst process)",
                                  worst, "x", note="backlog went 0 -> burst -> 0 meanwhile")
            fig.target, fig.met = "<= 1.10 (flat)", worst <= 1.10
