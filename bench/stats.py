"""Small statistics over measured samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99, max and mean of `samples` (seconds in, milliseconds out)."""
    if not samples:
        return {"n": 0, "p50_ms": float("nan"), "p95_ms": float("nan"),
                "p99_ms": float("nan"), "max_ms": float("nan"), "mean_ms": float("nan")}
    arr = np.asarray(samples, dtype=float) * 1000.0
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"n": len(samples), "p50_ms": float(p50), "p95_ms": float(p95),
            "p99_ms": float(p99), "max_ms": float(arr.max()), "mean_ms": float(arr.mean())}


def rate(count: float, seconds: float) -> float:
    """count / seconds, 0 when nothing could be timed."""
    return count / seconds if seconds > 0 else 0.0
