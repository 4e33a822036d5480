"""`python -m bench --profile tiny` runs every phase end to end against the services it
starts itself and writes a well-formed results.json, report.md and plots. Nothing here
asserts a speed: only that every figure was measured and stands next to its ceiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.results import validate

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_FIGURES = [
    "raw.pg.claim_b1", "raw.pg.claim_b10", "raw.pg.claim_b100",
    "raw.pg.claim_complete_b100", "raw.sqs.send", "raw.sqs.cycle",
    "enqueue.one", "enqueue.many", "dispatch.sqs", "consume.c1", "e2e.c1", "e2e.c2",
    "dbwork.memory.c8", "dbwork.memory.c32", "latency.memory.p99", "latency.simultaneous.p99",
    "raw.pg.cpu_claim_complete_b100", "cpu.memory.c8.python", "cpu.memory.c8.postgres",
    "cpu.memory.c8.cores", "cpu.memory.c32.python", "cpu.memory.c32.postgres",
    "cpu.memory.c32.cores",
    "latency.steady.p99", "burst.drain",
    "burst.lag_p99", "scale.claim.base", "scale.claim.3000", "scale.dispatch.3000",
    "scale.history.claim", "scale.history.hot_size", "scale.snapshot.1000", "scale.snapshot.3000",
    "scale.claim.base_at.3000", "scale.claim.base_at.history",
    "memory.timer.peak", "memory.consumer.peak", "memory.consumer.growth",
    "burst.vs_steady", "fair.b_alone.p99", "fair.b_backlog.p99", "fair.b_lag_ratio_slowest",
    "fair.a_rate_before",
    "fair.a_rate_during", "fair.a_rate_after", "fair.a_rate_around",
    "fair.sqs.b_alone.p99", "fair.sqs.b_backlog.p99",
    "fair.sqs.b_lag_ratio", "fair.sqs.a_rate_before", "fair.sqs.a_rate_during",
    "fair.sqs.a_rate_b_window", "fair.sqs.fleet_rate_during",
    "e2e.c1.sqs_requests", "e2e.c2.sqs_requests", "soak.sqs_requests",
]
PRESENT = ["health.tock_jobs.hot_share", "health.tock_jobs.dead", "health.tock_workers.hot_share",
           "soak.hot_table_growth", "soak.p99"]
"""Measured, but zero is a possible value (a tiny run may not update a worker row at all)."""
PLOTS = ["throughput_vs_consumers.png", "latency_distribution.png", "burst_drain.png",
         "rate_vs_table_size.png", "memory_rss.png"]


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_tiny_profile_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOCK_", "AWS_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "tiny", "--out", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(16/16) report done" in proc.stderr  # progress was shown

    data = json.loads((out / "results.json").read_text())
    assert validate(data) == []
    assert data["profile"] == "tiny"
    figures = {f["key"]: f for f in data["figures"]}
    missing = [k for k in EXPECTED_FIGURES + PRESENT if k not in figures]
    assert not missing, missing
    for key in EXPECTED_FIGURES:
        assert figures[key]["value"] is not None and figures[key]["value"] > 0, key
    for key in PRESENT:
        assert figures[key]["value"] is not None and figures[key]["value"] >= 0, key
    for fig in figures.values():
        if fig["ceiling"]:
            assert fig["ratio"] is not None and fig["ratio"] > 0, fig["key"]
    assert figures["e2e.c1"]["ceiling"] == "raw.sqs.cycle"
    assert figures["dbwork.memory.c8"]["ceiling"] == "raw.pg.claim_complete_b100"
    assert figures["cpu.memory.c32.postgres"]["ceiling"] == "raw.pg.cpu_claim_complete_b100"

    env_info = data["environment"]
    assert env_info["postgres_settings"]["fsync"] == "on"
    assert env_info["postgres_settings"]["synchronous_commit"] == "on"
    assert env_info["cpu_count"] >= 1 and len(env_info["load_average_start"]) == 3

    series = data["series"]
    assert series["latency_simultaneous"]["due_to_start"]["n"] == 40
    assert series["burst"]["curve"]["finished"][-1] == 150
    assert [p["pending_rows"] for p in series["scale"]] == [1_000, 3_000]
    assert {s["role"] for s in series["rss"]} >= {"timer", "consumer1"}
    assert any(s["statement"] == "sql.CLAIM_MESSAGES"
               for s in data["hotspots"]["statements_e2e"])
    assert data["hotspots"]["transaction_ms"]["tock_transaction"] > 0
    assert data["hotspots"]["enqueue_steps_ms_per_call"]
    assert data["errors"] == []

    report = (out / "report.md").read_text()
    for heading in ("## Targets", "## Latency", "## Scale", "## Where the time goes",
                    "## Shortfalls", "## Environment", "## Plots"):
        assert heading in report, heading
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000, name
        assert f"]({name})" in report
