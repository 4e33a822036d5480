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
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from shared.core.schedules import Schedule
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.schedules.policies import Fire, Plan, ScheduleState, plan
from shared.schedules.slots import slot_key
from shared.store.rows import AuditRecord, Cursor, SlotJob
from shared.store.schedule_store import ScheduleStore

log = logging.getLogger("tock.timer.schedules")

FIRES = Counter("tock_schedule_fires_total", "Recurring slots turned into jobs", ["why"])
AUDITED = Counter("tock_schedule_slots_audited_total",
                  "Recurring slots that did not become jobs (audited)", ["reason"])


class Scheduler(Loop):
    """Fires due slots; `run_once(now)` fires every due schedule (up to batches_per_pass
    batches). Passes run every half lookahead, so a slot's job exists before it is due."""

    name = "schedule"

    def __init__(self, store: ScheduleStore, *, batch_size: int = 100,
                 batches_per_pass: int = 10, lookahead_seconds: float = 1.0,
                 max_fires_per_second: float = 0.0, rng: random.Random | None = None) -> None:
        super().__init__()
        self.store = store
        self.batch_size = batch_size
        self.batches_per_pass = batches_per_pass
        self.lookahead = timedelta(seconds=lookahead_seconds)
        self.idle_seconds = min(max(lookahead_seconds / 2, 0.05), 1.0)
        self.max_fires_per_second = max_fires_per_second
        self.rng = rng or random.Random()
        self._per_second: dict[int, int] = {}

    def run_once(self, now: datetime | None = None) -> int:
        return self.step(now)

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
        with self.store.transaction() as tx:
            t = tx.db_now(now)
            due = tx.claim_due(t, self.lookahead.total_seconds(), self.batch_size)
            due += tx.claim_released_buffers([d.schedule.name for d in due], self.batch_size)
            if not due:
                return 0, 0
            plans = []
            for sched, active, released_at in due:
                try:
                    state = ScheduleState(sched.cursor_at, sched.buffered_slot, active,
                                          released_at)
                    plans.append((sched, plan(
                        sched.spec, state, t, lookahead=self.lookahead,
                        pass_every=timedelta(seconds=self.idle_seconds), rng=self.rng)))
                except Exception as exc:  # one bad row must not stop every other schedule
                    emit(log, "schedule_plan_failed", logging.ERROR, schedule=sched.name,
                         error=f"{type(exc).__name__}: {exc}")
            made = self._write(tx, plans, t) if plans else 0
        return len(plans), made

    def _write(self, tx: ScheduleStore, plans: list[tuple[Schedule, Plan]],
               t: datetime) -> int:
        slots = [(SlotJob(sched.name, self._shape(fire, t), slot_key(sched.name, fire.slot)),
                  fire.slot) for sched, p in plans for fire in p.fires]
        made = tx.insert_slot_jobs([job for job, _ in slots])
        taken = self._taken_elsewhere(tx, slots, {k for _, k in made})
        tx.insert_audit([
            AuditRecord(sched.name, e.reason, e.first_slot, e.last_slot, e.slot_count, e.detail)
            for sched, p in plans for e in p.audits] + taken, t)
        tx.advance([(s.name, Cursor(p.cursor, p.next_slot, p.next_fire_at, p.buffered_slot))
                    for s, p in plans], t)
        self._log(plans, {k for _, k in made})
        return len(made)

    def _taken_elsewhere(self, tx: ScheduleStore, slots: list[tuple[SlotJob, datetime]],
                         made: set[str]) -> list[AuditRecord]:
        """Audit records of the slots whose run key a job of another origin holds (a
        producer's `key=` of that form, from before such keys were refused): the slot is
        not run, and that must not pass in silence. A key a run of this schedule holds
        (another timer's, a backfill's) is the de-duplication working."""
        held = tx.keys_held_elsewhere([job for job, _ in slots if job.key not in made])
        out = []
        for job, slot in slots:
            if job.key in held:
                detail = (f"job {held[job.key]}, not a run of this schedule, holds its run "
                          f"key {job.key!r} (a key= given to schedule()); the slot is not run")
                AUDITED.labels("key_taken").inc()
                emit(log, "schedule_slots_not_run", logging.WARNING, schedule=job.schedule,
                     reason="key_taken", first_slot=slot.isoformat(),
                     last_slot=slot.isoformat(), slots=1, detail=detail)
                out.append(AuditRecord(job.schedule, "key_taken", slot, slot, 1, detail))
        return out

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
