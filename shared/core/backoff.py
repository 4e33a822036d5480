"""Retry delays: exponential backoff with full jitter (AWS Architecture Blog, 2015), so a
burst of failures does not come back as a synchronized burst of retries."""

from __future__ import annotations

import random


def backoff_seconds(attempt: int, *, base: float, cap: float,
                    rand: random.Random | None = None) -> float:
    """Delay before the retry that follows failed `attempt` (1-based): uniform in
    [0, min(cap, base * 2**(attempt-1))]."""
    ceiling = min(cap, base * 2.0 ** min(max(attempt - 1, 0), 62))
    return (rand or random).uniform(0, ceiling)
