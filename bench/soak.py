"""A sustained run: the real fleet (a timer and consumer processes on LocalStack) under a
steady load for the profile's `soak_seconds` (10 minutes in `make bench-full`). What a long
run shows and the short phases cannot: whether the hot table and its dead tuples stay flat
while autovacuum works behind the load, how many of `tock_jobs`'s updates Postgres made HOT,
and whether the processes' memory stays flat."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import psycopg

from bench import noop_tasks, waiting
from bench.latency import MAX_ID, lags
from bench.pipeline import COUNT_STATE, LIVE_WORKERS, Context, _timeout, sqs_requests_per_job
from bench.stats import percentiles
from shared.client import Client
from shared.runtime.settings import ClientSettings

TABLES = """
SELECT c.relname, pg_total_relation_size(c.oid), s.n_tup_upd, s.n_tup_hot_upd, s.n_dead_tup,
       s.n_live_tup, s.autovacuum_count, s.vacuum_count
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname IN ('tock_jobs', 'tock_workers') ORDER BY c.relname
"""

TICK_SECONDS = 0.1
"""The producer enqueues a batch every tick (schedule_many), so the rate holds without a
call per job from this one process."""
SAMPLE_SECONDS = 5.0
"""How often the tables are sampled (more often in a run shorter than 50 s)."""
SETTLED_FRACTION = 0.1
"""The processes' memory is compared with what it was this far into the run."""


def soak(ctx: Context, consumers: int) -> None:
    p = ctx.profile
    url = ctx.services.fresh_database("bench_soak")
    prefix = ctx.phase_queue("soak")
    fleet = ctx.fleet("soak", url, prefix)
    rate = _rate(ctx)
    try:
        fleet.start_timer()
        fleet.start_consumers(consumers)
        waiting.until(url, LIVE_WORKERS, lambda v: v == consumers, timeout=60,
                      what=f"{consumers} consumers up", fleet=fleet)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")  # this database's counters: the run's own
        after = waiting.scalar(url, MAX_ID)
        requests_before = fleet.sqs_requests()
        samples = _produce(url, fleet, rate, p.soak_seconds)
        total = waiting.scalar(url, "SELECT count(*) FROM tock_jobs_all")
        waiting.until(url, COUNT_STATE, lambda v: v == total, params={"state": "succeeded"},
                      timeout=_timeout(total), what="the sustained run's jobs succeeded",
                      fleet=fleet)
        requests_after = fleet.sqs_requests()
        time.sleep(1.0)  # the servers' statistics reach the shared counters about once a second
        final = _tables(url)
        start_lags, _ = lags(url, after)
    finally:
        fleet.stop()
        ctx.sampler.watch(None)
    minutes = p.soak_seconds / 60
    ctx.results.series["soak"] = {"rate_per_s": rate, "seconds": p.soak_seconds,
                                  "samples": samples, "final": final}
    _health(ctx, final, minutes, rate)
    _size(ctx, samples, minutes)
    sqs_requests_per_job(ctx, "soak.sqs_requests", "table health",
                         f"SQS requests per job over the {minutes:g}-minute run at "
                         f"{rate:.0f} jobs/s", requests_before, requests_after, len(start_lags))
    summary = percentiles(start_lags)
    ctx.results.raw("soak.p99", "table health",
                    f"due-to-start p99 over the {minutes:g}-minute run at {rate:.0f} jobs/s",
                    summary["p99_ms"], "ms", note=f"{summary['n']:,} jobs")
    _memory(ctx, minutes)
    ctx.progress.say(f"  {minutes:g} min at {rate:.0f}/s: p99 {summary['p99_ms']:.0f} ms; "
                     f"tock_jobs HOT {final['tock_jobs']['hot_share'] * 100:.1f}%, "
                     f"{final['tock_jobs']['dead']:,} dead")


def _rate(ctx: Context) -> float:
    """The profile's rate, capped at half the best end-to-end rate of this run: a sustained
    load is meant to be one the fleet keeps up with."""
    caps = [ctx.profile.soak_rate]
    e2e = [f.value for f in (ctx.results.figure(f"e2e.c{k}")
                             for k in ctx.profile.consumer_counts) if f is not None]
    if e2e and max(e2e) > 0:
        caps.append(max(e2e) / 2)
    return float(max(round(min(caps)), 1))


def _produce(url: str, fleet: Any, rate: float, seconds: float) -> list[dict[str, Any]]:
    """Enqueue `rate` jobs/s, due at once, for `seconds`; sample the tables meanwhile."""
    per_tick = rate * TICK_SECONDS
    every = min(SAMPLE_SECONDS, seconds / 10)
    samples: list[dict[str, Any]] = []
    sent = 0
    next_sample = 0.0
    with Client(ClientSettings(database_url=url)) as client:
        start = time.perf_counter()
        tick = 0
        while (elapsed := time.perf_counter() - start) < seconds:
            if elapsed >= next_sample:
                samples.append({"t": round(elapsed, 1), **_flat(_tables(url))})
                next_sample += every
                fleet.check_alive()
            tick += 1
            due = round(per_tick * tick) - sent
            if due > 0:
                client.schedule_many([{"kind": noop_tasks.KIND, "payload": {"n": sent + i}}
                                      for i in range(due)])
                sent += due
            wake = start + tick * TICK_SECONDS - time.perf_counter()
            if wake > 0:
                time.sleep(wake)  # pacing the producer, not waiting for a result
    return samples


def _tables(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(TABLES).fetchall()
    return {name: {"bytes": size, "updates": upd, "hot_updates": hot,
                   "hot_share": hot / upd if upd else 0.0, "dead": dead, "live": live,
                   "autovacuums": autovacuums, "vacuums": vacuums}
            for name, size, upd, hot, dead, live, autovacuums, vacuums in rows}


def _flat(tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    jobs = tables.get("tock_jobs", {})
    return {"jobs_bytes": jobs.get("bytes"), "jobs_dead": jobs.get("dead"),
            "jobs_live": jobs.get("live"), "jobs_autovacuums": jobs.get("autovacuums")}


def _health(ctx: Context, final: dict[str, dict[str, Any]], minutes: float,
            rate: float) -> None:
    """HOT share and dead tuples of tock_jobs and tock_workers at the end of the run."""
    why = {
        "tock_jobs": "every update of a job changes its state, which its indexes carry "
                     "(the due, in-flight and per-state ones), so none can be HOT; the "
                     "heartbeat no longer updates jobs",
        "tock_workers": "the heartbeat: one row per worker, fillfactor 50, no index on "
                        "what a beat changes",
    }
    for name, t in final.items():
        ctx.results.raw(f"health.{name}.hot_share", "table health",
                        f"{name}: share of updates that were HOT, after the {minutes:g}-minute "
                        f"run at {rate:.0f} jobs/s", t["hot_share"] * 100, "%",
                        note=f"{t['hot_updates']:,} of {t['updates']:,} updates; {why[name]}")
        ctx.results.raw(f"health.{name}.dead", "table health",
                        f"{name}: dead tuples left for vacuum, after the {minutes:g}-minute run",
                        float(t["dead"]), "rows",
                        note=f"{t['live']:,} live rows; vacuumed {t['vacuums']} time(s) by the "
                             f"timer and {t['autovacuums']} by autovacuum during the run")


def _size(ctx: Context, samples: list[dict[str, Any]], minutes: float) -> None:
    """The hot table (heap and indexes) at its largest in the second half of the run
    against the first: a table that only grows is bigger in the second; one that vacuum
    keeps at the size of its work is not."""
    sizes = [(s["t"], s["jobs_bytes"]) for s in samples if s.get("jobs_bytes")]
    if len(sizes) < 4:
        return
    half = sizes[-1][0] / 2
    first = max(b for t, b in sizes if t <= half)
    second = max(b for t, b in sizes if t > half)
    dead = [s["jobs_dead"] for s in samples if s.get("jobs_dead") is not None]
    fig = ctx.results.raw("soak.hot_table_growth", "table health",
                          f"tock_jobs (table + indexes) at its largest in the second half of "
                          f"the {minutes:g}-minute run / in the first half", second / first, "x",
                          note=f"{first / 2**20:.1f} MB, then {second / 2**20:.1f} MB; dead "
                               f"tuples peaked at {max(dead) if dead else 0:,}")
    fig.target, fig.met = "<= 1.50 (flat)", second / first <= 1.5


def _memory(ctx: Context, minutes: float) -> None:
    """Each process's RSS at the end of the run against a tenth into it (worst process)."""
    samples = [s for s in ctx.sampler.samples if s["phase"] == "soak"]
    for prefix in ("timer", "consumer"):
        groups: dict[str, list[tuple[float, float]]] = {}
        for s in samples:
            if s["role"].startswith(prefix):
                groups.setdefault(s["role"], []).append((s["t"], s["rss_mb"]))
        growth = []
        for group in groups.values():
            if len(group) < 6:
                continue
            t0 = group[0][0] + (group[-1][0] - group[0][0]) * SETTLED_FRACTION
            settled = [r for t, r in group if t >= t0][:3]
            end = [r for _, r in group][-3:]
            growth.append(float(np.median(end)) / float(np.median(settled)))
        if growth:
            fig = ctx.results.raw(f"soak.{prefix}_rss_growth", "memory",
                                  f"{prefix} RSS at the end of the {minutes:g}-minute run / a "
                                  "tenth into it (worst process)", max(growth), "x")
            fig.target, fig.met = "<= 1.10 (flat)", max(growth) <= 1.10
