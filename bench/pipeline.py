"""tock's own figures: enqueue, dispatch, end to end with 1/2/4 consumer processes, and the
database work per job over the in-memory transport. Each phase gets a fresh database and
its own SQS queue prefix. Rates come from the database's own timestamps (run_at,
dispatched_at, started_at, finished_at), so nothing is timed inside a handler process."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import noop_tasks, waiting
from bench.procs import Fleet, RssSampler
from bench.profiles import Profile
from bench.progress import Progress
from bench.results import Figure, Results
from bench.services import Services
from bench.stats import rate
from consumer.service import Consumer
from consumer.tasks import Registry
from shared.client import Client
from shared.runtime import logs
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.transport.memory import MemoryTransport
from shared.transport.sqs import SqsTransport
from timer_service.service import Timer

INSERT_DUE = """
INSERT INTO tock_jobs (kind, queue, payload, run_at)
SELECT %(kind)s, 'default', jsonb_build_object('n', g),
       coalesce(%(at)s::timestamptz, now()) + random() * make_interval(secs => %(spread)s)
FROM generate_series(1, %(n)s) AS g
"""

COUNT_STATE = "SELECT count(*) FROM tock_jobs_all WHERE state = %(state)s"
LIVE_WORKERS = "SELECT count(*) FROM tock_workers WHERE stopped_at IS NULL"


@dataclass
class Context:
    services: Services
    profile: Profile
    results: Results
    progress: Progress
    sampler: RssSampler
    log_dir: Path
    _prefixes: int = 0

    def phase_queue(self, phase: str) -> str:
        """A fresh SQS queue prefix with its `default` queue created."""
        self._prefixes += 1
        prefix = f"b{self._prefixes}{phase[:8]}-"
        SqsTransport(prefix).create_queue("default", visibility_timeout=60)
        return prefix

    def fleet(self, phase: str, url: str, prefix: str) -> Fleet:
        fleet = Fleet(url, prefix, self.log_dir, phase, self.services.aws_env(),
                      self.profile.consumer_concurrency)
        self.sampler.watch(fleet)
        return fleet


def insert_due(url: str, n: int, *, at: Any = None, spread_seconds: float = 0.0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(INSERT_DUE, {"kind": noop_tasks.KIND, "n": n, "at": at,
                                  "spread": spread_seconds})


def _timeout(jobs: int) -> float:
    """Generous: a stuck pipeline fails the run instead of hanging it."""
    return 60.0 + jobs / 50.0


# --- enqueue ----------------------------------------------------------------------------------

def enqueue(ctx: Context) -> None:
    p = ctx.profile
    url = ctx.services.fresh_database("bench_enqueue")
    with Client(ClientSettings(database_url=url)) as client:
        client.schedule(noop_tasks.KIND, {"warm": True}, delay=3600)
        start = time.perf_counter()
        for i in range(p.enqueue_one_by_one):
            client.schedule(noop_tasks.KIND, {"n": i}, delay=3600)
        one = rate(p.enqueue_one_by_one, time.perf_counter() - start)
        batch = [{"kind": noop_tasks.KIND, "payload": {"n": i}, "delay": 3600}
                 for i in range(p.enqueue_batch_size)]
        start = time.perf_counter()
        for _ in range(p.enqueue_batches):
            client.schedule_many(batch)
        many = rate(p.enqueue_batches * p.enqueue_batch_size, time.perf_counter() - start)
    ctx.results.ratio("enqueue.one", "enqueue", "schedule() one by one", one, "jobs/s",
                      "raw.pg.insert_1")
    ctx.results.ratio("enqueue.many", "enqueue",
                      f"schedule_many() in batches of {p.enqueue_batch_size}", many, "jobs/s",
                      "raw.pg.insert_batch")
    ctx.progress.say(f"  schedule(): {one:,.0f} jobs/s; schedule_many(): {many:,.0f} jobs/s")


# --- dispatch, then consume-only with one consumer ----------------------------------------------

DISPATCH_RATE = """
SELECT count(*) FILTER (WHERE dispatched_at < m.last),
       extract(epoch FROM m.last - m.first)
FROM tock_jobs_all, (SELECT min(dispatched_at) AS first, max(dispatched_at) AS last
                 FROM tock_jobs) m
GROUP BY m.first, m.last
"""

# Jobs finished once every consumer had announced itself, over that window: start-up skew
# between processes does not count against them.
CONSUME_RATE = """
SELECT count(*) FILTER (WHERE finished_at >= w.ready),
       extract(epoch FROM max(finished_at) - w.ready)
FROM tock_jobs_all, (SELECT max(started_at) AS ready FROM tock_workers) w
GROUP BY w.ready
"""

END_TO_END = """
SELECT count(*), extract(epoch FROM max(finished_at) - min(run_at))
FROM tock_jobs_all WHERE state = 'succeeded'
"""


DISPATCH_VS_CLAIM_NOTE = ("context, not a target: dispatch is bound by the SQS server's "
                          "sends (`dispatch.sqs`), far below what the claim alone allows")


def dispatch(ctx: Context) -> None:
    """The real timer process dispatching a due backlog with no consumer running; then
    one consumer draining the queue it filled (SQS receive + delete + DB claim + complete).
    The dispatch window is off: with no consumer, it would stop the timer at its size."""
    n = ctx.profile.dispatch_jobs
    url = ctx.services.fresh_database("bench_dispatch")
    prefix = ctx.phase_queue("dispatch")
    insert_due(url, n)
    fleet = ctx.fleet("dispatch", url, prefix)
    try:
        fleet.start_timer({"TOCK_DISPATCH_WINDOW": "0"})
        waiting.until(url, COUNT_STATE, lambda v: v == n, params={"state": "dispatched"},
                      timeout=_timeout(n), what=f"{n} jobs dispatched", fleet=fleet)
        count, seconds = _row(url, DISPATCH_RATE)
        sent = rate(count, float(seconds))
        ctx.results.ratio("dispatch.sqs", "dispatch", "timer: due rows to SQS messages", sent,
                          "jobs/s", "raw.sqs.send", minimum=0.7)
        ctx.results.ratio("dispatch.vs_claim", "dispatch",
                          "timer dispatch vs the bare claim (batch 100)", sent, "jobs/s",
                          "raw.pg.claim_b100", note=DISPATCH_VS_CLAIM_NOTE)
        ctx.progress.say(f"  dispatch: {sent:,.0f} jobs/s")
        fleet.start_consumers(1)
        waiting.until(url, COUNT_STATE, lambda v: v == n, params={"state": "succeeded"},
                      timeout=_timeout(n), what=f"{n} jobs succeeded", fleet=fleet)
        count, seconds = _row(url, CONSUME_RATE)
        consumed = rate(count, float(seconds))
        ctx.results.ratio("consume.c1", "end-to-end",
                          "1 consumer draining a dispatched backlog (no timer work)",
                          consumed, "jobs/s", "raw.sqs.cycle", minimum=0.8)
        ctx.progress.say(f"  consume only, 1 consumer: {consumed:,.0f} jobs/s")
    finally:
        fleet.stop()


# --- end to end with 1, 2, 4 consumers ----------------------------------------------------------

FLEET_WITHIN = 0.95
"""The fleet the later phases run (latency, burst, the sustained run, fairness through
SQS): the fewest consumer processes whose end-to-end rate came within this of the best.
On a small machine more processes than cores add no throughput (1, 2 and 4 ran within 4%
of each other on 2 cores) but do add CPU contention to every latency: steady 100 jobs/s
through LocalStack, p99 63-67 ms on 1 consumer against 92-117 ms on 4 (paired rounds).
Which of equal fleets measured best was the noise's pick."""


def end_to_end(ctx: Context) -> int:
    """Timer + k consumer processes running; a due backlog inserted at once; completed
    jobs/s from due to the last finish. Returns the fewest consumers that came within
    `FLEET_WITHIN` of the best rate."""
    n = ctx.profile.dispatch_jobs
    by_count: dict[int, float] = {}
    for k in ctx.profile.consumer_counts:
        url = ctx.services.fresh_database(f"bench_e2e_{k}")
        prefix = ctx.phase_queue(f"e2e{k}")
        fleet = ctx.fleet(f"e2e-{k}", url, prefix)
        try:
            fleet.start_timer()
            fleet.start_consumers(k)
            waiting.until(url, LIVE_WORKERS, _equals(k), timeout=60,
                          what=f"{k} consumers up", fleet=fleet)
            _reset_statements(url)
            requests_before = fleet.sqs_requests()
            insert_due(url, n)
            waiting.until(url, COUNT_STATE, lambda v: v == n, params={"state": "succeeded"},
                          timeout=_timeout(n), what=f"{n} jobs succeeded", fleet=fleet)
            count, seconds = _row(url, END_TO_END)
            by_count[k] = rate(count, float(seconds))
            sqs_requests_per_job(ctx, f"e2e.c{k}.sqs_requests", "end-to-end",
                                 f"SQS requests per job, end to end, {k} consumer(s)",
                                 requests_before, fleet.sqs_requests(), n)
            if k == max(ctx.profile.consumer_counts):
                ctx.results.hotspots["statements_e2e"] = statement_times(url, n)
        finally:
            fleet.stop()
        ctx.results.ratio(f"e2e.c{k}", "end-to-end", f"end to end, {k} consumer process(es)",
                          by_count[k], "jobs/s", "raw.sqs.cycle", minimum=0.8)
        ctx.results.ratio(f"e2e.c{k}.vs_path", "end-to-end",
                          f"end to end, {k} consumer(s), vs send + receive + delete",
                          by_count[k], "jobs/s", "raw.sqs.path")
        ctx.progress.say(f"  end to end, {k} consumer(s): {by_count[k]:,.0f} jobs/s")
    ctx.results.series["throughput_vs_consumers"] = [
        {"consumers": k, "jobs_per_s": v} for k, v in sorted(by_count.items())]
    best = max(by_count.values())
    return min(k for k, v in by_count.items() if v >= FLEET_WITHIN * best)


# --- database work per job, in-memory transport -------------------------------------------------

MEMORY_CONCURRENCY = (8, 32)
"""Consumer concurrency of the in-memory runs (issue: database work at 8 and 32)."""


@dataclass
class CpuUse:
    """CPU seconds spent from the timer's start until the last job succeeded."""

    python: float
    """This process: the timer's and the consumer's threads."""
    postgres: float | None
    """The whole Postgres server (None: not readable here)."""


def database_work(ctx: Context) -> None:
    """The same Timer and Consumer code in this process over `MemoryTransport`: what is left
    is tock's database work (and its Python) per job, at two consumer concurrencies. Beside
    the rate, the CPU each job cost, in this process and in Postgres: on a machine this
    small the two share the cores, so together they bound the rate."""
    n = ctx.profile.memory_jobs
    for concurrency in MEMORY_CONCURRENCY:
        url = ctx.services.fresh_database(f"bench_memory_{concurrency}")
        insert_due(url, n)
        used = run_in_memory(url, concurrency, n, ctx.log_dir / f"memory-{concurrency}.log",
                             ctx.services.postgres_cpu_seconds)
        rows = _row(url, """
            SELECT count(*), extract(epoch FROM max(finished_at) - min(dispatched_at))
            FROM tock_jobs_all WHERE state = 'succeeded'""")
        jobs = rate(rows[0], float(rows[1]))
        ctx.results.ratio(f"dbwork.memory.c{concurrency}", "end-to-end",
                          f"database work per job over the in-memory transport, consumer "
                          f"concurrency {concurrency}", jobs, "jobs/s",
                          "raw.pg.claim_complete_b100", minimum=0.5,
                          note="timer and consumer share one Python process (one GIL)")
        ctx.progress.say(f"  database work per job (memory transport, concurrency "
                         f"{concurrency}): {jobs:,.0f} jobs/s")
        _cpu_figures(ctx, concurrency, n, used)
    memory_latency(ctx)


def _cpu_figures(ctx: Context, concurrency: int, jobs: int, used: CpuUse) -> None:
    """Jobs per CPU second of Postgres (against the raw loop's), tock's own CPU per job, and
    how many cores the throughput target would take at those costs."""
    results, c = ctx.results, concurrency
    python_us = used.python / jobs * 1e6
    results.raw(f"cpu.memory.c{c}.python", "cpu",
                f"tock's Python CPU per job (timer + consumer), concurrency {c}", python_us,
                "us/job", note="this process, from the timer's start to the last outcome")
    if used.postgres is None or used.postgres <= 0 \
            or results.figure("raw.pg.cpu_claim_complete_b100") is None:
        return
    postgres_us = used.postgres / jobs * 1e6
    results.ratio(f"cpu.memory.c{c}.postgres", "cpu",
                  f"database work per job by Postgres CPU (jobs per CPU second of the "
                  f"server), in-memory, concurrency {c}", jobs / used.postgres, "jobs/cpu-s",
                  "raw.pg.cpu_claim_complete_b100", minimum=0.5,
                  note=f"{postgres_us:.0f} us of Postgres CPU per job")
    fig = results.raw(f"cpu.memory.c{c}.cores", "cpu",
                      f"cores the in-memory target (0.5 of the raw ceiling) takes at this "
                      f"run's CPU per job, concurrency {c}", 0.0, "cores")
    # Provisional: the raw ceiling gains a better sample at the end of the run, and
    # `finalize_cores` sets this again from the final one.
    _cores(fig, python_us, postgres_us, results)
    ctx.progress.say(f"  CPU per job at concurrency {c}: {python_us:.0f} us in tock's "
                     f"process, {postgres_us:.0f} us in Postgres")


CORES_KEY = re.compile(r"cpu\.memory\.c(\d+)\.cores")


def finalize(results: Results) -> None:
    """This module's figures that follow from others, set again once every raw ceiling is
    in (at the end of a run, and when a report is rendered from a results.json)."""
    finalize_cores(results)
    vs_claim = results.figure("dispatch.vs_claim")
    if vs_claim is not None:
        vs_claim.note = DISPATCH_VS_CLAIM_NOTE


def finalize_cores(results: Results) -> None:
    """Set each `cpu.memory.c*.cores` figure from its run's CPU per job (the `python` figure,
    in us/job, and the `postgres` one, in jobs per CPU second) and the raw claim +
    completion ceiling's final value, the best of its samples, which the report prints:
    once every raw ceiling is in at the end of a run, and again when a report is rendered
    from a results.json."""
    for fig in results.figures:
        match = CORES_KEY.fullmatch(fig.key)
        if match is None:
            continue
        c = match.group(1)
        python = results.figure(f"cpu.memory.c{c}.python")
        postgres = results.figure(f"cpu.memory.c{c}.postgres")
        if python is None or postgres is None or not postgres.value:
            continue
        _cores(fig, python.value, 1e6 / postgres.value, results)


def _cores(fig: Figure, python_us: float, postgres_us: float, results: Results) -> None:
    """The cores the in-memory target takes at `python_us` + `postgres_us` of CPU per job,
    against this run's machine."""
    ceiling = results.figure("raw.pg.claim_complete_b100")
    if ceiling is None:
        return
    cores = int(results.environment.get("cpu_count") or os.cpu_count() or 1)
    target = 0.5 * ceiling.value
    fig.value = (python_us + postgres_us) / 1e6 * target
    fig.note = (f"({python_us:.0f} us in tock's process + {postgres_us:.0f} us in Postgres) "
                f"x {target:,.0f} jobs/s (0.5 of `{ceiling.key}`, {ceiling.value:,.0f}); "
                f"this machine has {cores}")
    fig.target, fig.met = f"<= {cores} (this machine's cores)", fig.value <= cores


def memory_latency(ctx: Context) -> None:
    """Due-to-start of `latency_simultaneous` jobs due at one instant over the in-memory
    transport: the timer's and consumer's own latency, without SQS's."""
    from datetime import UTC, datetime, timedelta

    from bench.stats import percentiles

    n = ctx.profile.latency_simultaneous
    url = ctx.services.fresh_database("bench_memory_latency")
    insert_due(url, 1)  # warm-up: the path is used once before the measured jobs are due
    insert_due(url, n, at=datetime.now(UTC) + timedelta(seconds=3))
    run_in_memory(url, max(MEMORY_CONCURRENCY), n + 1, ctx.log_dir / "memory-latency.log")
    with psycopg.connect(url, autocommit=True) as conn:
        lags = [r[0] for r in conn.execute(
            "SELECT extract(epoch FROM started_at - run_at)::float8 FROM tock_jobs_all "
            "WHERE id > 1 AND state = 'succeeded'").fetchall()]
    summary = percentiles(lags)
    ctx.results.series["latency_memory"] = {"jobs": n, "due_to_start": summary}
    fig = ctx.results.raw("latency.memory.p99", "latency",
                          f"due-to-start p99, {n} jobs due at one instant, in-memory transport",
                          summary["p99_ms"], "ms", note="no SQS: tock's own latency")
    fig.target, fig.met = "<= 100 ms", summary["p99_ms"] <= 100.0
    ctx.progress.say(f"  {n} due at once over memory: p99 {summary['p99_ms']:.0f} ms")


def run_in_memory(url: str, concurrency: int, jobs: int, log_file: Path,
                  postgres_cpu: Callable[[], float | None] | None = None) -> CpuUse:
    """Run a Timer and a Consumer over one MemoryTransport until `jobs` jobs succeeded;
    returns the CPU used meanwhile. They log at INFO to `log_file`, in JSON, as the real
    processes do."""
    transport = MemoryTransport()
    registry = Registry()
    registry.add(noop_tasks.KIND, noop_tasks.noop, max_attempts=3, timeout=60)
    timer = Timer(TimerSettings(database_url=url), transport)
    consumer = Consumer(ConsumerSettings(database_url=url, concurrency=concurrency,
                                         receive_wait_seconds=1), registry, transport)
    handler = logs.line_handler(log_file.open("a"), "json", "bench")
    logs.lean_records()
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # Only that handler, as in a real process: the run's own handlers on "tock" (the
    # runner's in-process log) would write each job's line a second time, one write and
    # flush per line, and that cost 15% of this process's CPU per job (measured).
    tock_logger = logging.getLogger("tock")
    saved_handlers = tock_logger.handlers[:]
    tock_logger.handlers[:] = []
    timer_thread = threading.Thread(target=timer.run_forever, name="bench-timer", daemon=True)
    try:
        consumer.start()
        postgres_before = postgres_cpu() if postgres_cpu else None
        python_before = _process_cpu()
        timer_thread.start()
        # Deleted messages first (no query: the database's CPU is being measured), then
        # the database's own count to be sure.
        deadline = time.monotonic() + _timeout(jobs)
        while transport.deleted < jobs and time.monotonic() < deadline:
            time.sleep(0.02)
        waiting.until(url, COUNT_STATE, lambda v: v == jobs, params={"state": "succeeded"},
                      timeout=max(deadline - time.monotonic(), 5),
                      what=f"{jobs} jobs succeeded in memory")
        python = _process_cpu() - python_before
        postgres_after = postgres_cpu() if postgres_cpu else None
        postgres = (postgres_after - postgres_before
                    if postgres_after is not None and postgres_before is not None else None)
        return CpuUse(python, postgres)
    finally:
        timer.stop_flag.set()
        timer_thread.join(timeout=30)
        consumer.shutdown()
        root.removeHandler(handler)
        root.setLevel(saved_level)
        tock_logger.handlers[:] = saved_handlers
        handler.close()
        handler.stream.close()


# --- helpers ------------------------------------------------------------------------------------

FULL_BATCHES = 0.3
"""SQS requests per job with every send, receive and delete a full batch of 10."""


def sqs_requests_per_job(ctx: Context, key: str, group: str, label: str,
                         before: dict[str, int], after: dict[str, int], jobs: int) -> None:
    """The fleet's SQS requests (what SQS bills) per job between two readings of its
    processes' `tock_sqs_requests_total`, with the operations in the note."""
    grew = {op: after.get(op, 0) - before.get(op, 0) for op in after}
    grew = {op: n for op, n in sorted(grew.items(), key=lambda kv: -kv[1]) if n > 0}
    per_job = sum(grew.values()) / jobs if jobs else 0.0
    parts = ", ".join(f"{op} {n / jobs:.3f}" for op, n in grew.items())
    ctx.results.raw(key, group, label, per_job, "requests/job",
                    note=f"{parts or 'none'}; {FULL_BATCHES} with every send, receive and "
                         "delete a full batch of 10; idle long polls included")


def _process_cpu() -> float:
    used = os.times()
    return used.user + used.system


def _row(url: str, statement: str) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(statement).fetchone()
    if row is None or row[1] is None:
        raise RuntimeError(f"nothing measured by: {statement.strip()[:80]}")
    return tuple(row)


def _reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statement_times(url: str, jobs: int) -> list[dict[str, Any]]:
    """Database time per tock statement (pg_stat_statements) in this database, named after
    `shared.sql` where the text matches, per job of the phase."""
    from bench.hotspots import statement_name

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("""
            SELECT s.query, s.calls, s.total_exec_time, s.rows
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = current_database()
            ORDER BY s.total_exec_time DESC LIMIT 15""").fetchall()
    return [{"statement": statement_name(q), "calls": calls,
             "total_ms": round(total, 1), "mean_ms": round(total / calls, 3) if calls else None,
             "rows": nrows, "ms_per_job": round(total / jobs, 4)}
            for q, calls, total, nrows in rows]


def _equals(expected: int) -> Callable[[Any], bool]:
    return lambda value: bool(value == expected)
