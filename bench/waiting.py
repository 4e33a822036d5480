"""Polling the phase database until the pipeline got somewhere, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.procs import Fleet


def scalar(url: str, statement: str, params: dict[str, Any] | None = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(statement, params or {}).fetchone()
    return row[0] if row else None


def until(url: str, statement: str, done: Callable[[Any], bool], *, timeout: float,
          what: str, fleet: Fleet | None = None, params: dict[str, Any] | None = None,
          interval: float = 0.1) -> Any:
    """Run `statement` (one value) until `done(value)`; raise after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(statement, params or {}).fetchone()
            value = row[0] if row else None
            if done(value):
                return value
            if fleet is not None:
                fleet.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what} "
                                   f"(last value {value!r})")
            time.sleep(interval)
