"""Waiting in the fault suite: on conditions, polled with a timeout; the only fixed waits
are fault windows, whose duration is the definition of the fault."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, *,
               interval: float = 0.1, tolerate: tuple[type[BaseException], ...] = ()) -> T:
    """Poll `condition` until it returns something truthy; raise `TimeoutError` naming
    `what` after `timeout` seconds. Exceptions of the `tolerate` types count as "not yet"
    (e.g. the database is down while we poll it)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = condition()
            if result:
                return result
            last = result
        except tolerate as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} "
                               f"(last: {last!r})")
        time.sleep(interval)


def hold_fault(seconds: float, window: str) -> None:
    """Keep a fault in place for `seconds`: the length of the fault window named `window`
    ("Postgres stopped for 6 s", "partition for 2x lease", the gap between two kills).
    This is not a wait for the system: the duration is the fault's definition."""
    if seconds > 0:
        time.sleep(seconds)
