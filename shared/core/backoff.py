"""Retry delays: exponential backoff with "equal jitter" (AWS Architecture Blog, 2015).

The delay before the retry that follows failed attempt n (1-based) is uniform in
[c/2, c], where c = min(cap, base * 2^(n-1)): never less than half the exponential step,
so a first retry never comes at once, and still spread out, so a burst of failures does
not come back as a synchronized burst of retries.
"""

from __future__ import annotations

import random


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """min(cap, base * 2^(attempt-1)): the longest delay after failed `attempt`."""
    return min(cap, base * 2.0 ** min(max(attempt - 1, 0), 62))


def backoff_seconds(attempt: int, *, base: float, cap: float,
                    rand: random.Random | None = None) -> float:
    """Delay before the retry that follows failed `attempt`: uniform in [c/2, c]."""
    ceiling = backoff_ceiling(attempt, base=base, cap=cap)
    return ceiling / 2 + (rand or random).uniform(0, ceiling / 2)
