"""`FakeClock`: a monotonic clock the Supervisor tests move by hand."""

from __future__ import annotations

import time


class FakeClock:
    """time.monotonic() shifted by an offset the test moves (Loop records pass starts and
    successes with time.monotonic(), so the two clocks must agree)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
