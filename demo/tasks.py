"""Demo handlers: `python -m consumer --tasks demo.tasks`.

- email: fast, always succeeds.
- flaky: fails 60% of the time; retried with backoff, some end dead.
- slow: runs 6 s; with make run's 3 s lease it lives on heartbeats.
- crash: the first attempt walks away like a killed worker; the lease expires, the timer
  rescues the job and a later attempt finishes it.
- report: the recurring schedule `demo-report` fires it every 15 s (declared by the producer);
  it logs the slot it was made for.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from consumer import Abandon, TaskContext, task


@task("email", max_attempts=3, timeout=10)
def email(payload: Any, ctx: TaskContext) -> None:
    """Pretend to send an email."""


@task("flaky", max_attempts=4, timeout=10)
def flaky(payload: Any, ctx: TaskContext) -> None:
    if random.random() < 0.6:
        raise RuntimeError(f"upstream said no (attempt {ctx.attempt})")


@task("slow", max_attempts=3, timeout=30)
def slow(payload: Any, ctx: TaskContext) -> None:
    seconds = float(payload.get("seconds", 6)) if isinstance(payload, dict) else 6.0
    # Returns early if the job is cancelled, its lease is lost or the worker shuts down.
    ctx.cancelled.wait(seconds)


@task("sync", max_attempts=3, timeout=30)
def sync(payload: Any, ctx: TaskContext) -> None:
    """Pretend to sync one account for a few seconds; the producer limits it to one job at
    a time per account (a per-key limit), so an account's jobs queue in Postgres."""
    ctx.cancelled.wait(3)


@task("crash", max_attempts=3, timeout=10)
def crash(payload: Any, ctx: TaskContext) -> None:
    if ctx.attempt == 1:
        raise Abandon()


@task("report", max_attempts=3, timeout=30)
def report(payload: Any, ctx: TaskContext) -> None:
    """Pretend to build the report for this job's slot (the run key names it)."""
    from shared.core.schedules import slot_of
    from shared.runtime.logs import emit

    slot = slot_of(ctx.key) or ctx.scheduled_at
    emit(logging.getLogger("tock.demo"), "report_built", slot=slot.isoformat())
