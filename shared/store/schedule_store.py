"""`ScheduleStore`: every statement on recurring schedules and their audit records
(shared.store.schedules_sql), one typed method each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from shared.core import validation
from shared.core.schedules import Schedule, ScheduleEvent, ScheduleRun, ScheduleSpec, slot_of
from shared.store import schedules_sql as sql
from shared.store.base import Store
from shared.store.rows import AuditRecord, Cursor, DueSchedule, SlotJob


class ScheduleStore(Store):
    """Schedule statements. See `Store` for how a store runs them."""

    def db_now(self, now: datetime | None = None) -> datetime:
        """`now` if given (timezone-aware: a naive one would be read in the session's zone),
        else the database clock; in UTC."""
        if now is not None:
            now = validation.aware("now", now)
        row = self._one(sql.DB_NOW, {"now": now})
        assert row is not None
        value: datetime = row[0]
        return value.astimezone(UTC)

    # --- definitions ----------------------------------------------------------------------

    def insert(self, spec: ScheduleSpec, cursor: Cursor, now: datetime) -> Schedule | None:
        """Insert a new schedule; None if the name exists (ON CONFLICT waits for a
        concurrent insert of the same name to commit)."""
        row = self._one(sql.INSERT_SCHEDULE, {**_definition(spec), **_cursor(cursor),
                                              "name": spec.name, "now": now})
        return Schedule.from_row(row) if row else None

    def update(self, spec: ScheduleSpec, cursor: Cursor, now: datetime) -> Schedule | None:
        row = self._one(sql.UPDATE_SCHEDULE, {**_definition(spec), **_cursor(cursor),
                                              "name": spec.name, "now": now})
        return Schedule.from_row(row) if row else None

    def get(self, name: str) -> Schedule | None:
        row = self._one(sql.SELECT_SCHEDULE, {"name": name})
        return Schedule.from_row(row) if row else None

    def lock(self, name: str) -> Schedule | None:
        """The schedule, row-locked until the transaction ends (orders an update, pause or
        resume against a timer firing it)."""
        row = self._one(sql.LOCK_SCHEDULE, {"name": name})
        return Schedule.from_row(row) if row else None

    def list_all(self) -> list[Schedule]:
        return [Schedule.from_row(r) for r in self._rows(sql.LIST_SCHEDULES)]

    def set_paused(self, name: str, paused: bool, cursor: Cursor,
                   now: datetime | None = None) -> Schedule | None:
        row = self._one(sql.SET_PAUSED, {"name": name, "paused": paused, **_cursor(cursor),
                                         "now": now})
        return Schedule.from_row(row) if row else None

    def delete(self, name: str) -> bool:
        """Delete the schedule and its audit records; False if there was none."""
        return self._one(sql.DELETE_SCHEDULE, {"name": name}) is not None

    def audit(self, name: str, limit: int) -> list[ScheduleEvent]:
        """Audit records, newest first."""
        return [ScheduleEvent(*r)
                for r in self._rows(sql.SELECT_AUDIT, {"name": name, "limit": limit})]

    def runs(self, name: str, limit: int) -> list[ScheduleRun]:
        """The latest jobs the schedule made (by run time, which the index orders), newest
        slot first: a run waiting to retry has a later run time than the slots after it,
        and would otherwise be listed above them."""
        rows = self._rows(sql.SELECT_RUNS, {"name": name, "limit": limit})
        runs = [ScheduleRun(job_id, slot_of(key) or run_at, state, run_at)
                for job_id, key, state, run_at in rows]
        return sorted(runs, key=lambda run: (run.slot, run.job_id), reverse=True)

    # --- timer ----------------------------------------------------------------------------

    def claim_due(self, now: datetime, lookahead_seconds: float, limit: int
                  ) -> list[DueSchedule]:
        """Due schedules, locked (SKIP LOCKED), each with whether a run of it is still
        unfinished (for the overlap policy)."""
        rows = self._rows(sql.CLAIM_DUE_SCHEDULES, {
            "now": now, "lookahead": lookahead_seconds, "limit": limit})
        return [DueSchedule(Schedule.from_row(r), bool(r[-1]), r[-2]) for r in rows]

    def claim_released_buffers(self, taken: Sequence[str], limit: int
                               ) -> list[DueSchedule]:
        """overlap='buffer_one' schedules whose blocking run has finished, locked."""
        rows = self._rows(sql.CLAIM_RELEASED_BUFFERS, {"taken": list(taken), "limit": limit})
        return [DueSchedule(Schedule.from_row(r), bool(r[-1]), r[-2]) for r in rows]

    def insert_slot_jobs(self, slots: Sequence[SlotJob]) -> list[tuple[int, str]]:
        """Insert the slots' jobs; a run key that exists makes nothing. Returns (id, key)
        of the jobs made."""
        if not slots:
            return []
        return [(r[0], r[1]) for r in self._rows(sql.INSERT_SLOT_JOBS, {
            "names": [s.schedule for s in slots], "run_ats": [s.run_at for s in slots],
            "keys": [s.key for s in slots]})]

    def keys_held_elsewhere(self, slots: Sequence[SlotJob]) -> dict[str, int]:
        """Of these slots' run keys, those a job that is not the schedule's own holds (a
        producer's `key=` written before such keys were refused): key -> that job's id."""
        if not slots:
            return {}
        return dict(self._rows(sql.KEYS_HELD_ELSEWHERE, {
            "names": [s.schedule for s in slots], "keys": [s.key for s in slots]}))

    def insert_audit(self, records: Sequence[AuditRecord], now: datetime) -> None:
        if not records:
            return
        self._run(sql.INSERT_AUDIT, {
            "names": [a.schedule for a in records], "reasons": [a.reason for a in records],
            "firsts": [a.first_slot for a in records], "lasts": [a.last_slot for a in records],
            "counts": [a.slot_count for a in records], "details": [a.detail for a in records],
            "now": now})

    def advance(self, cursors: Sequence[tuple[str, Cursor]], now: datetime) -> None:
        """Move each named schedule's cursor."""
        self._run(sql.ADVANCE_SCHEDULES, {
            "names": [n for n, _ in cursors],
            "cursors": [c.cursor_at for _, c in cursors],
            "next_slots": [c.next_slot for _, c in cursors],
            "next_fires": [c.next_fire_at for _, c in cursors],
            "buffered": [c.buffered_slot for _, c in cursors], "now": now})


def _cursor(cursor: Cursor) -> dict[str, Any]:
    return {"cursor_at": cursor.cursor_at, "next_slot": cursor.next_slot,
            "next_fire_at": cursor.next_fire_at, "buffered_slot": cursor.buffered_slot}


def _definition(spec: ScheduleSpec) -> dict[str, Any]:
    """The stored columns of a definition (the names of sql.DEFINITION_COLUMNS)."""
    return {
        "kind": spec.kind, "queue": spec.queue, "payload": spec.payload,
        "priority": spec.priority, "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds, "tenant": spec.tenant,
        "cron": spec.timing.cron, "every": spec.timing.every, "anchor": spec.timing.anchor,
        "tz": spec.timing.tz, "misfire": spec.misfire.value,
        "misfire_grace_seconds": spec.misfire_grace_seconds,
        "backfill_max": spec.backfill_max, "backfill_gap_seconds": spec.backfill_gap_seconds,
        "overlap": spec.overlap.value, "dst_gap": spec.timing.dst_gap.value,
        "dst_fold": spec.timing.dst_fold.value, "spread_seconds": spec.spread_seconds,
        "jitter_seconds": spec.jitter_seconds,
    }


def definition_of(spec: ScheduleSpec) -> dict[str, Any]:
    """A definition as stored, for comparing two definitions (payload as a value)."""
    import json

    return {**_definition(spec), "payload": json.loads(spec.payload)}
