"""One benchmark run: services up, raw ceilings, tock's figures, then results.json,
report.md and the plots in the output directory."""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    fair_sqs,
    fairness,
    hotspots,
    latency,
    peers,
    pipeline,
    plots,
    raw_postgres,
    raw_sqs,
    report,
    scale,
    soak,
)
from bench.pipeline import Context
from bench.procs import RssSampler
from bench.profiles import Profile
from bench.progress import Progress
from bench.results import Results, validate
from bench.services import environment, running_services
from shared.runtime import logs

PHASES = ("services", "raw Postgres ceilings", "raw SQS ceilings", "enqueue",
          "dispatch", "end to end", "database work (memory transport)",
          "peers on the same Postgres", "latency + burst", "sustained load",
          "fairness through SQS", "scale", "fairness", "profile", "raw ceilings again",
          "report")


def run(profile: Profile, out: Path) -> Path:
    """Run every phase of `profile`, write the results into `out`; returns report.md."""
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(PHASES))
    results = Results(profile.name, datetime.now(UTC).isoformat(timespec="seconds"))
    started = time.monotonic()
    progress.say(f"tock bench, {profile.name} profile, writing to {out}")
    sampler = RssSampler()
    progress.say(f"(1/{len(PHASES)}) starting durable Postgres and LocalStack ...")
    with running_services() as services:
        progress.done += 1
        results.environment = environment(services)
        settings = results.environment["postgres_settings"]
        progress.say("  Postgres " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        ctx = Context(services, profile, results, progress, sampler, out / "logs")
        # Loops run in this process (scale, fairness, profile) log here, not to stderr.
        (out / "logs").mkdir(parents=True, exist_ok=True)
        in_process = logs.line_handler((out / "logs" / "in-process.log").open("a"), "json",
                                       "bench")
        in_process.setLevel(logging.INFO)
        logging.getLogger("tock").addHandler(in_process)
        sampler.start()
        best = [max(profile.consumer_counts)]
        try:
            for name, action in (
                ("raw Postgres ceilings", lambda: raw_postgres.measure(
                    services.fresh_database("bench_raw"), profile, results, progress,
                    services.postgres_cpu_seconds)),
                ("raw SQS ceilings", lambda: raw_sqs.measure("raw-", profile, results,
                                                             progress)),
                ("enqueue", lambda: pipeline.enqueue(ctx)),
                ("dispatch", lambda: pipeline.dispatch(ctx)),
                ("end to end", lambda: best.__setitem__(0, pipeline.end_to_end(ctx))),
                ("database work (memory transport)", lambda: pipeline.database_work(ctx)),
                ("peers on the same Postgres", lambda: peers.measure(ctx)),
                ("latency + burst", lambda: latency.latency_and_burst(ctx, best[0])),
                ("sustained load", lambda: soak.soak(ctx, best[0])),
                ("fairness through SQS", lambda: fair_sqs.fair_through_sqs(ctx, best[0])),
                ("scale", lambda: scale.scale(ctx)),
                ("fairness", lambda: fairness.fairness(ctx)),
                ("profile", lambda: hotspots.measure(ctx)),
                ("raw ceilings again", lambda: _raw_again(ctx)),
            ):
                _phase(progress, results, name, action)
            latency.memory(ctx)
            latency.floor(ctx)
        finally:
            sampler.stop()
            results.environment["load_average_end"] = list(os.getloadavg())
    with progress.phase("report"):
        finalize(results)
        results.series["phases"] = progress.phases
        results.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
        results.duration_seconds = round(time.monotonic() - started, 1)
        results.write(out / "results.json")
        path = render(out)
    progress.say(f"report: {path}")
    return path


def _raw_again(ctx: Context) -> None:
    """Ceilings measured at one moment of a noisy machine can land in a spike of someone
    else's load; a second sample at the end of the run, best one kept, guards against it."""
    raw_postgres.measure(ctx.services.fresh_database("bench_raw_again"), ctx.profile,
                         ctx.results, ctx.progress, ctx.services.postgres_cpu_seconds)
    raw_sqs.measure("raw2-", ctx.profile, ctx.results, ctx.progress)


def _phase(progress: Progress, results: Results, name: str,
           action: Callable[[], object]) -> None:
    """Run one phase; a phase that fails is recorded and the run goes on, so one broken
    phase does not cost the figures of the others (the exit status still says it failed)."""
    try:
        with progress.phase(name):
            action()
    except Exception as exc:
        results.errors.append({"phase": name, "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc()})
        progress.say(f"  FAILED {name}: {type(exc).__name__}: {exc}")


def finalize(results: Results) -> None:
    """Once every raw ceiling is in: each ratio against its ceiling's final (best) value,
    and what is derived from other figures (the cores the in-memory target takes, B's share
    of the completions through SQS, fixed notes) from their final values."""
    results.finalize()
    pipeline.finalize(results)
    fair_sqs.finalize(results)


def render(out: Path) -> Path:
    """(Re)write the plots and report.md from `out/results.json`, finalized again (as at
    the end of a run) so derived figures follow this version's rules; results.json itself
    is left as it is."""
    data = json.loads((out / "results.json").read_text())
    problems = validate(data)
    if problems:
        raise ValueError(f"{out / 'results.json'} is not well formed: {problems}")
    results = Results.from_json(data)
    finalize(results)
    data = results.to_json()
    written = plots.write_all(data, out)
    return report.write(data, out, written)


