"""The report's PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def write_all(data: dict[str, Any], out: Path) -> list[str]:
    """Write every plot the data allows; returns the file names written."""
    written = []
    for name, draw in (("throughput_vs_consumers.png", _throughput),
                       ("latency_distribution.png", _latency),
                       ("burst_drain.png", _burst),
                       ("rate_vs_table_size.png", _scale),
                       ("memory_rss.png", _memory)):
        fig = draw(data)
        if fig is None:
            continue
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def _figure(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((f for f in data["figures"] if f["key"] == key), None)


def _throughput(data: dict[str, Any]) -> Any:
    points = data["series"].get("throughput_vs_consumers")
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [p["consumers"] for p in points]
    ax.plot(xs, [p["jobs_per_s"] for p in points], "o-", label="tock end to end")
    for key, style, label in (("raw.sqs.cycle", "--", "raw SQS receive+delete ceiling"),
                              ("raw.sqs.path", ":", "raw SQS send+receive+delete")):
        ceiling = _figure(data, key)
        if ceiling:
            ax.axhline(ceiling["value"], linestyle=style, color="grey", label=label)
    ax.set_xticks(xs)
    ax.set_xlabel("consumer processes")
    ax.set_ylabel("completed jobs/s")
    ax.set_ylim(bottom=0)
    ax.set_title("End-to-end throughput vs consumers (no-op handlers)")
    ax.legend(fontsize=8)
    return fig


def _latency(data: dict[str, Any]) -> Any:
    series = [(k, data["series"].get(k)) for k in ("latency_simultaneous", "latency_steady")]
    series = [(k, v) for k, v in series if v and v.get("samples_s")]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for key, s in series:
        ms = np.sort(np.asarray(s["samples_s"]) * 1000)
        label = (f"{s['jobs']} due at one instant" if key == "latency_simultaneous"
                 else f"steady {s['achieved_rate_per_s']:.0f} jobs/s scheduled")
        ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=label)
    ax.axvline(100, linestyle="--", color="grey", label="target p99 100 ms")
    ax.set_xscale("log")
    ax.set_xlabel("due-to-start (ms, log scale)")
    ax.set_ylabel("fraction of jobs started")
    ax.set_title("Due-to-start latency (CDF)")
    ax.legend(fontsize=8)
    return fig


def _burst(data: dict[str, Any]) -> Any:
    burst = data["series"].get("burst")
    if not burst:
        return None
    curve = burst["curve"]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(curve["t_s"], curve["dispatched"], label="dispatched")
    ax.plot(curve["t_s"], curve["finished"], label="finished")
    ax.axvspan(0, 1, color="orange", alpha=0.15, label="the due second")
    ax.set_xlabel("seconds from the start of the due second")
    ax.set_ylabel("jobs")
    ax.set_title(f"Burst: {burst['jobs']:,} jobs due in one second, "
                 f"{burst['consumers']} consumer(s)")
    ax.legend(fontsize=8)
    return fig


def _scale(data: dict[str, Any]) -> Any:
    points = data["series"].get("scale")
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [p["pending_rows"] for p in points]
    ax.plot(xs, [p["claim_jobs_per_s"] for p in points], "o-", label="claim (fair claim)")
    ax.plot(xs, [p["dispatch_jobs_per_s"] for p in points], "s-", label="dispatch to SQS")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("pending rows in tock_jobs (log scale)")
    ax.set_ylabel("jobs/s")
    ax.set_title("Claim and dispatch rate vs table size")
    ax.legend(fontsize=8)
    return fig


def _memory(data: dict[str, Any]) -> Any:
    samples = [s for s in data["series"].get("rss", []) if s["phase"] == "latency-burst"]
    if not samples:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    t0 = samples[0]["t"]
    for role in sorted({s["role"] for s in samples}):
        mine = [s for s in samples if s["role"] == role]
        ax.plot([s["t"] - t0 for s in mine], [s["rss_mb"] for s in mine], label=role)
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    backlog = {s["t"]: s["backlog"] for s in samples if s["backlog"] is not None}
    if backlog:
        ax2 = ax.twinx()
        ts = sorted(backlog)
        ax2.fill_between([t - t0 for t in ts], [backlog[t] for t in ts], color="grey",
                         alpha=0.2, label="backlog")
        ax2.set_ylabel("backlog (unfinished jobs)")
    ax.set_title("Timer and consumer RSS during latency + burst")
    ax.legend(fontsize=8, loc="upper left")
    return fig
