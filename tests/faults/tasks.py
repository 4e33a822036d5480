"""The task module of the fault suite's consumers (`--tasks tests.faults.tasks`).

Every handler run appends a line when it starts and one when it ends to an append-only
log outside tock (the file named by `TOCK_FAULT_LOG`), each line written with one
`write` on an `O_APPEND` descriptor and fsync'd, so the log survives `kill -9` and tells
the invariant checker which process really ran which attempt of which job, and when:

    {"event": "start", "job": 12, "attempt": 1, "pid": 4242, "proc": "consumer-0.3",
     "t": 1718000000.123}

A run takes `payload["ms"]` milliseconds (default 50), long enough for faults to land while
handlers run. The jobs always succeed; `MAX_ATTEMPTS` is high so repeated faults never
make one go dead.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from consumer import TaskContext, task

KIND = "fault"
LOG_ENV = "TOCK_FAULT_LOG"
PROC_ENV = "TOCK_FAULT_PROC"
MAX_ATTEMPTS = 100

_lock = threading.Lock()
_fd: int | None = None


def _log_fd() -> int:
    global _fd  # noqa: PLW0603 - one descriptor per process, opened on first use
    with _lock:
        if _fd is None:
            _fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return _fd


def record(event: str, ctx: TaskContext) -> None:
    """Append one line (a single write, then fsync)."""
    line = json.dumps({"event": event, "job": ctx.job_id, "attempt": ctx.attempt,
                       "pid": os.getpid(), "proc": os.environ.get(PROC_ENV),
                       "t": time.time()}, separators=(",", ":")) + "\n"
    fd = _log_fd()
    os.write(fd, line.encode())
    os.fsync(fd)


@task(KIND, max_attempts=MAX_ATTEMPTS)
def fault_job(payload: Any, ctx: TaskContext) -> None:
    record("start", ctx)
    ms = payload.get("ms", 50) if isinstance(payload, dict) else 50
    time.sleep(ms / 1000)
    record("end", ctx)
