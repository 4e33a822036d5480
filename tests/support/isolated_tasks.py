"""Handlers for the process-isolation tests. They are module-level functions, so a handler
process can import them by name; each notes what it saw in the JSON-lines file named by
`payload["notes"]` (a test reads it back with `notes()`), from whichever process ran it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from consumer import Permanent, TaskContext


def note(payload: Any, ctx: TaskContext, event: str) -> None:
    line = json.dumps({"event": event, "job_id": ctx.job_id, "attempt": ctx.attempt,
                       "pid": os.getpid(), "thread": threading.current_thread().name})
    with Path(payload["notes"]).open("a") as f:
        f.write(line + "\n")


def notes(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    seen = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [n for n in seen if event is None or n["event"] == event]


def record(payload: Any, ctx: TaskContext) -> None:
    note(payload, ctx, "ran")


async def record_async(payload: Any, ctx: TaskContext) -> None:
    await asyncio.sleep(0)
    note(payload, ctx, "ran")


def spin_first(payload: Any, ctx: TaskContext) -> None:
    """The first attempt ignores its deadline and ctx.cancelled: a busy loop."""
    note(payload, ctx, "started")
    if ctx.attempt == 1:
        while True:
            pass
    note(payload, ctx, "ran")


def spin(payload: Any, ctx: TaskContext) -> None:
    note(payload, ctx, "started")
    while True:
        pass


def die_first(payload: Any, ctx: TaskContext) -> None:
    """The first attempt takes its process down: `os._exit(9)`, or SIGKILL to itself."""
    note(payload, ctx, "started")
    if ctx.attempt == 1:
        if payload["how"] == "exit":
            os._exit(9)
        os.kill(os.getpid(), signal.SIGKILL)
    note(payload, ctx, "ran")


class NotAnAddress(Permanent):
    pass


def refuse(payload: Any, ctx: TaskContext) -> None:
    raise NotAnAddress(f"no @ in {payload['to']!r}")


def until_cancelled(payload: Any, ctx: TaskContext) -> str:
    """Cooperative: stops when told, and returns as if it had succeeded."""
    note(payload, ctx, "started")
    ctx.cancelled.wait(60)
    note(payload, ctx, "cancelled")
    return "done anyway"


async def sleep_async(payload: Any, ctx: TaskContext) -> None:
    note(payload, ctx, "started")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        note(payload, ctx, "cancelled" if ctx.cancelled.is_set() else "cancelled-unsignalled")
        raise
