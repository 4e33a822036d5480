"""One benchmark run: services up, raw ceilings, tock's figures, then results.json,
report.md and the plots in the output directory."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import hotspots, latency, pipeline, plots, raw_postgres, raw_sqs, report, scale
from bench.pipeline import Context
from bench.procs import RssSampler
from bench.profiles import Profile
from bench.progress import Progress
from bench.results import Results, validate
from bench.services import environment, running_services

PHASES = ("services", "raw Postgres ceilings", "raw SQS ceilings", "enqueue",
          "dispatch", "end to end", "database work (memory transport)",
          "latency + burst", "scale", "profile", "report")


def run(profile: Profile, out: Path) -> Path:
    """Run every phase of `profile`, write the results into `out`; returns report.md."""
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(PHASES))
    results = Results(profile.name, datetime.now(UTC).isoformat(timespec="seconds"))
    started = time.monotonic()
    progress.say(f"tock bench, {profile.name} profile, writing to {out}")
    sampler = RssSampler()
    progress.say("(1/11) starting durable Postgres and LocalStack ...")
    with running_services() as services:
        progress.done += 1
        results.environment = environment(services)
        settings = results.environment["postgres_settings"]
        progress.say("  Postgres " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        ctx = Context(services, profile, results, progress, sampler, out / "logs")
        sampler.start()
        try:
            with progress.phase("raw Postgres ceilings"):
                raw_postgres.measure(services.fresh_database("bench_raw"), profile, results,
                                     progress)
            with progress.phase("raw SQS ceilings"):
                raw_sqs.measure("raw-", profile, results, progress)
            with progress.phase("enqueue"):
                pipeline.enqueue(ctx)
            with progress.phase("dispatch"):
                pipeline.dispatch(ctx)
            with progress.phase("end to end"):
                best = pipeline.end_to_end(ctx)
            with progress.phase("database work (memory transport)"):
                pipeline.database_work(ctx)
            with progress.phase("latency + burst"):
                latency.latency_and_burst(ctx, best)
                latency.memory(ctx)
            with progress.phase("scale"):
                scale.scale(ctx)
            with progress.phase("profile"):
                hotspots.measure(ctx)
        finally:
            sampler.stop()
            results.environment["load_average_end"] = list(os.getloadavg())
    with progress.phase("report"):
        results.series["phases"] = progress.phases
        results.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
        results.duration_seconds = round(time.monotonic() - started, 1)
        results.write(out / "results.json")
        path = render(out)
    progress.say(f"report: {path}")
    return path


def render(out: Path) -> Path:
    """(Re)write the plots and report.md from `out/results.json`."""
    data = json.loads((out / "results.json").read_text())
    problems = validate(data)
    if problems:
        raise ValueError(f"{out / 'results.json'} is not well formed: {problems}")
    written = plots.write_all(data, out)
    return report.write(data, out, written)


