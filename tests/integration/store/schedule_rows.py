"""Arranging and reading schedules for the `ScheduleStore` tests: a spec with defaults, a
schedule inserted with its next fire time, and a `tock_schedules` row as a dict."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from shared.core.schedules import ScheduleSpec
from shared.schedules.spec import make_spec
from shared.store import ScheduleStore
from shared.store.rows import Cursor

M = timedelta(minutes=1)


def schedule_spec(name: str = "tick", kind: str = "report", payload: Any = None, **kw: Any
                  ) -> ScheduleSpec:
    if "cron" not in kw:
        kw.setdefault("every", 60)
    return make_spec(name, kind, payload, **kw)


def add_schedule(store: ScheduleStore, now: datetime, name: str = "tick", *,
                 fire_at: datetime | None = None, **kw: Any) -> None:
    """A schedule whose next slot fires at `fire_at` (default: a minute from now)."""
    fire = fire_at if fire_at is not None else now + M
    assert store.insert(schedule_spec(name, **kw), Cursor(now, fire, fire), now) is not None


def schedule_row(db: Any, name: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM tock_schedules WHERE name = %s", (name,)).fetchone()
    return row
