"""The bench's task module: `python -m consumer --tasks bench.noop_tasks`. A handler that
does nothing, so every figure measures tock and its services, not the work."""

from __future__ import annotations

from typing import Any

from consumer.tasks import TaskContext, task

KIND = "bench.noop"


@task(KIND, max_attempts=3, timeout=60)
def noop(payload: Any, ctx: TaskContext) -> None:
    """Succeed at once."""
