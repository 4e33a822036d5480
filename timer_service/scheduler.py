"""The timer step that turns recurring schedules' due slots into jobs.

Each batch is one transaction: lock due schedule rows (FOR UPDATE SKIP LOCKED), plan each
one (shared/schedule_policies.py, a pure function of `now`), insert the slots' jobs with
their run keys (ON CONFLICT DO NOTHING), write the audit records, and advance every
schedule's cursor. A crash anywhere rolls all of it back; another timer then does the same
work once. Any number of timers can run this at once with no leader.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import Counter
from psycopg_pool import ConnectionPool
from pydantic import Field

from shared.core.schedules import Schedule
from shared.runtime.logs import emit
from shared.runtime.settings import CommonSettings, TimerSettings
from shared.schedules.policies import Fire, Plan, ScheduleState, plan
from shared.schedules.slots import slot_key
from shared.store import schedules_sql as schedule_sql
from shared.store.database import Connection, transaction

log = logging.getLogger("tock.timer.schedules")

FIRES = Counter("tock_schedule_fires_total", "Recurring slots turned into jobs", ["why"])
AUDITED = Counter("tock_schedule_slots_audited_total",
                  "Recurring slots that did not become jobs (audited)", ["reason"])


class SchedulerSettings(CommonSettings):
    """Recurring-schedule settings of a timer (TOCK_SCHEDULE_*)."""

    schedule_batch_size: int = Field(default=100, ge=1, le=5000,
                                     description="Schedules locked and fired per transaction.")
    schedule_batches_per_pass: int = Field(default=10, ge=1, le=1000)
    schedule_lookahead_seconds: float | None = Field(
        default=None, ge=0, le=60,
        description="Make a slot's job this long before it is due, so the dispatcher meets "
                    "its run_at exactly. Default: the timer's max_idle_seconds, the longest "
                    "it sleeps between passes.")
    schedule_max_fires_per_second: float = Field(
        default=0, ge=0,
        description="Cap on recurring jobs this timer makes due per second (0: no cap); "
                    "extra runs are pushed into the next seconds, never dropped.")


class Scheduler:
    """Fires due slots. `step(now)` is what `Timer.extra_steps` runs each pass."""

    def __init__(self, pool: ConnectionPool, *, batch_size: int = 100,
                 batches_per_pass: int = 10, lookahead_seconds: float = 1.0,
                 max_fires_per_second: float = 0.0, rng: random.Random | None = None) -> None:
        self.pool = pool
        self.batch_size = batch_size
        self.batches_per_pass = batches_per_pass
        self.lookahead = timedelta(seconds=lookahead_seconds)
        self.max_fires_per_second = max_fires_per_second
        self.rng = rng or random.Random()
        self._per_second: dict[int, int] = {}

    @classmethod
    def for_timer(cls, pool: ConnectionPool, timer_settings: TimerSettings) -> Scheduler:
        """The scheduler a Timer runs: TOCK_SCHEDULE_* settings from the environment."""
        settings = SchedulerSettings.load(database_url=timer_settings.database_url)
        lookahead = settings.schedule_lookahead_seconds
        return cls(pool, batch_size=settings.schedule_batch_size,
                   batches_per_pass=settings.schedule_batches_per_pass,
                   lookahead_seconds=(timer_settings.max_idle_seconds if lookahead is None
                                      else lookahead),
                   max_fires_per_second=settings.schedule_max_fires_per_second)

    def step(self, now: datetime | None = None) -> int:
        """Fire every due schedule (up to batches_per_pass batches); returns jobs made."""
        made = 0
        for _ in range(self.batches_per_pass):
            handled, jobs = self.fire_batch(now)
            made += jobs
            if handled < self.batch_size:
                break
        return made

    def fire_batch(self, now: datetime | None = None) -> tuple[int, int]:
        """One transaction: returns (schedules handled, jobs made)."""
        with transaction(self.pool) as conn:
            row = conn.execute(schedule_sql.DB_NOW, {"now": now}).fetchone()
            assert row is not None
            t: datetime = row[0].astimezone(UTC)
            rows = conn.execute(schedule_sql.CLAIM_DUE_SCHEDULES, {
                "now": t, "lookahead": self.lookahead.total_seconds(),
                "limit": self.batch_size}).fetchall()
            taken = [r[0] for r in rows]
            rows += conn.execute(schedule_sql.CLAIM_RELEASED_BUFFERS, {
                "taken": taken, "limit": self.batch_size}).fetchall()
            if not rows:
                return 0, 0
            plans = []
            for r in rows:
                sched = Schedule.from_row(r)
                try:
                    plans.append((sched, self._plan(r, t)))
                except Exception as exc:  # one bad row must not stop every other schedule
                    emit(log, "schedule_plan_failed", logging.ERROR, schedule=sched.name,
                         error=f"{type(exc).__name__}: {exc}")
            made = self._write(conn, plans, t) if plans else 0
        return len(plans), made

    def _plan(self, row: Sequence[Any], t: datetime) -> Plan:
        sched = Schedule.from_row(tuple(row))
        state = ScheduleState(sched.cursor_at, sched.buffered_slot, bool(row[-1]))
        return plan(sched.spec, state, t, lookahead=self.lookahead, rng=self.rng)

    def _write(self, conn: Connection, plans: list[tuple[Schedule, Plan]], t: datetime) -> int:
        names, run_ats, keys = [], [], []
        for sched, p in plans:
            for fire in p.fires:
                names.append(sched.name)
                run_ats.append(self._shape(fire, t))
                keys.append(slot_key(sched.name, fire.slot))
        made = conn.execute(schedule_sql.INSERT_SLOT_JOBS, {
            "names": names, "run_ats": run_ats, "keys": keys}).fetchall() if names else []
        audit: dict[str, list[Any]] = {k: [] for k in (
            "names", "reasons", "firsts", "lasts", "counts", "details")}
        for sched, p in plans:
            for entry in p.audits:
                audit["names"].append(sched.name)
                audit["reasons"].append(entry.reason)
                audit["firsts"].append(entry.first_slot)
                audit["lasts"].append(entry.last_slot)
                audit["counts"].append(entry.slot_count)
                audit["details"].append(entry.detail)
        if audit["names"]:
            conn.execute(schedule_sql.INSERT_AUDIT, {**audit, "now": t})
        conn.execute(schedule_sql.ADVANCE_SCHEDULES, {
            "names": [s.name for s, _ in plans],
            "cursors": [p.cursor for _, p in plans],
            "next_slots": [p.next_slot for _, p in plans],
            "next_fires": [p.next_fire_at for _, p in plans],
            "buffered": [p.buffered_slot for _, p in plans],
            "now": t})
        self._log(plans, {k for _, k in made})
        return len(made)

    def _shape(self, fire: Fire, t: datetime) -> datetime:
        """Apply the per-timer cap: a run whose second is full moves to the next free one."""
        if self.max_fires_per_second <= 0:
            return fire.run_at
        cap = max(1, math.floor(self.max_fires_per_second))
        floor_second = int(t.timestamp()) - 5
        for second in [s for s in self._per_second if s < floor_second]:
            del self._per_second[second]
        second = int(fire.run_at.timestamp())
        while self._per_second.get(second, 0) >= cap:
            second += 1
        self._per_second[second] = self._per_second.get(second, 0) + 1
        if second == int(fire.run_at.timestamp()):
            return fire.run_at
        return datetime.fromtimestamp(second, UTC)

    def _log(self, plans: list[tuple[Schedule, Plan]], made: set[str]) -> None:
        for sched, p in plans:
            for fire in p.fires:
                key = slot_key(sched.name, fire.slot)
                if key in made:
                    FIRES.labels(fire.why).inc()
                    emit(log, "schedule_fired", logging.DEBUG if fire.why == "on_time"
                         else logging.INFO, schedule=sched.name, slot=fire.slot.isoformat(),
                         run_at=fire.run_at.isoformat(), why=fire.why)
            for entry in p.audits:
                AUDITED.labels(entry.reason).inc(entry.slot_count or 1)
                emit(log, "schedule_slots_not_run", logging.WARNING, schedule=sched.name,
                     reason=entry.reason, first_slot=entry.first_slot.isoformat(),
                     last_slot=entry.last_slot.isoformat(), slots=entry.slot_count,
                     detail=entry.detail)
