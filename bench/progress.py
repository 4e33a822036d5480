"""Progress lines on stderr while a run goes: elapsed time, phase, what it is doing."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    def __init__(self, total_phases: int, *, stream: TextIO | None = None) -> None:
        self.started = time.monotonic()
        self.total = total_phases
        self.done = 0
        self.phases: list[dict[str, object]] = []
        """Duration and 1-minute load average at the end of each phase: the noise."""
        self.stream = stream or sys.stderr

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        minutes, seconds = divmod(int(elapsed), 60)
        print(f"[{minutes:02d}:{seconds:02d}] {message}", file=self.stream, flush=True)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.say(f"({self.done + 1}/{self.total}) {name} ...")
        start = time.monotonic()
        yield
        self.done += 1
        seconds = time.monotonic() - start
        load = os.getloadavg()[0]
        self.phases.append({"phase": name, "seconds": round(seconds, 1),
                            "load_average_1m": round(load, 2)})
        self.say(f"({self.done}/{self.total}) {name} done in {seconds:.1f} s "
                 f"(load average {load:.2f})")
