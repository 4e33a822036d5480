"""Rows written straight into the history, many at once, for tests of what reads it."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def fill_history(db: Any, *, n: int, state: str = "succeeded", kind: str = "k",
                 at: datetime | None = None) -> None:
    """`n` finished jobs of `kind` in `state`, finished at `at` (the database's now)."""
    db.execute("""
        INSERT INTO tock_history_jobs (id, kind, queue, priority, state, run_at, attempt,
            created_at, updated_at, finished_at, dispatch_failures, lease_detached, payload)
        SELECT nextval(pg_get_serial_sequence('tock_jobs', 'id')), %(kind)s, 'default', 0,
               %(state)s, t.at, 1, t.at, t.at, t.at, 0, false, '{}'
        FROM generate_series(1, %(n)s), (SELECT coalesce(%(at)s::timestamptz, now()) AS at) t
        """, {"kind": kind, "state": state, "n": n, "at": at})
