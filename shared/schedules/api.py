"""Recurring schedules from code: define (upsert by name), pause, resume, update, delete,
look at, and preview.

    from datetime import timedelta
    from shared.client import recurring

    recurring("nightly-report", "report", {"format": "pdf"}, cron="0 2 * * *",
              tz="Europe/Berlin")
    recurring("heartbeat", "ping", every=timedelta(seconds=15), overlap="skip")

Calling `recurring()` again with the same definition changes nothing, so applications can
declare their schedules at every start. A changed timing (cron, interval, zone, DST
policies) restarts the schedule from the first slot after now; other changes keep its place.
The timers turn slots into jobs (timer_service/scheduler.py) with the run key
`name:<slot in UTC ISO 8601>`. Every function takes `client=` (default: the process-wide
client) and `now=` (tests pin the clock; default: the database's).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from shared.core.errors import InvalidInput, ScheduleNotFound
from shared.core.schedules import Schedule, ScheduleEvent, ScheduleRun, ScheduleSpec, slot_of
from shared.schedules.slots import FireTime, preview, slots_after, spread_offset
from shared.schedules.spec import make_spec, schedule_name
from shared.store import schedules_sql as schedule_sql
from shared.store.database import Connection

if TYPE_CHECKING:
    from shared.producer.client import Client

MAX_PREVIEW = 1000
MAX_UNRUN_SCAN = 10_000
UPDATABLE = frozenset({
    "kind", "payload", "every", "cron", "tz", "start", "queue", "priority", "max_attempts",
    "timeout", "tenant", "misfire", "misfire_grace", "backfill_max", "backfill_gap", "overlap",
    "dst_gap", "dst_fold", "spread", "jitter"})


def recurring(name: str, kind: str, payload: Any = None, *, every: timedelta | float | None = None,
              cron: str | None = None, tz: str = "UTC", start: datetime | None = None,
              queue: str | None = None, priority: int = 0, max_attempts: int | None = None,
              timeout: float | timedelta | None = None, tenant: str | None = None,
              misfire: str = "skip", misfire_grace: float | timedelta = 60.0,
              backfill_max: int = 100, backfill_gap: float | timedelta = 1.0,
              overlap: str = "allow", dst_gap: str = "shift", dst_fold: str = "once",
              spread: float | timedelta = 0.0, jitter: float | timedelta = 0.0,
              client: Client | None = None, now: datetime | None = None) -> Schedule:
    """Create or update the schedule `name`: run `kind` with `payload` on every slot.

    Timing: `every=` (timedelta or seconds, >= 1 s; slots are `start + k * every`, `start`
    defaulting to the Unix epoch) or `cron=` (5 fields, or 6 with seconds first) read in `tz`.
    Policies: `misfire` skip|latest|all (missed = reached more than `misfire_grace` late;
    `all` runs at most `backfill_max`, `backfill_gap` seconds apart), `overlap`
    allow|skip|buffer_one, `dst_gap` shift|skip, `dst_fold` once|twice, `spread` (a stable
    per-name offset within that many seconds) and `jitter` (random, up to that many).
    Job options (`queue`, `priority`, `max_attempts`, `timeout`, `tenant`) as in `schedule()`.
    Raises `InvalidSchedule` naming the problem. A paused schedule stays paused.
    """
    c = _client(client)
    with c._conn(None) as conn:
        t = _now(conn, now)
        spec = make_spec(
            name, kind, payload, every=every, cron=cron, tz=tz, start=start,
            queue=queue or c.settings.default_queue, priority=priority,
            max_attempts=max_attempts, timeout=timeout, tenant=tenant, misfire=misfire,
            misfire_grace=misfire_grace, backfill_max=backfill_max, backfill_gap=backfill_gap,
            overlap=overlap, dst_gap=dst_gap, dst_fold=dst_fold, spread=spread, jitter=jitter,
            max_payload_bytes=c.settings.max_payload_bytes, now=t)
        return _store(conn, spec, t)


def update_schedule(name: str, *, client: Client | None = None, now: datetime | None = None,
                    **changes: Any) -> Schedule:
    """Change some arguments of an existing schedule (same names as `recurring()`; `every`
    and `cron` replace each other). Raises `ScheduleNotFound`, `InvalidSchedule`."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidInput(f"unknown schedule argument(s) {sorted(unknown)}; "
                           f"known: {sorted(UPDATABLE)}")
    c = _client(client)
    with c._conn(None) as conn:
        current = _locked(conn, name)
        args: dict[str, Any] = {
            "kind": current.kind, "payload": current.payload, "tz": current.tz,
            "queue": current.queue, "priority": current.priority,
            "max_attempts": current.max_attempts, "timeout": current.timeout_seconds,
            "tenant": current.tenant, "misfire": current.misfire.value,
            "misfire_grace": current.misfire_grace_seconds,
            "backfill_max": current.backfill_max, "backfill_gap": current.backfill_gap_seconds,
            "overlap": current.overlap.value, "dst_gap": current.dst_gap.value,
            "dst_fold": current.dst_fold.value, "spread": current.spread_seconds,
            "jitter": current.jitter_seconds,
        }
        if current.cron is not None:
            args["cron"] = current.cron
        else:
            args["every"], args["start"] = current.every, current.anchor
        if "cron" in changes:
            args.pop("every", None)
            args.pop("start", None)
        if "every" in changes:
            args.pop("cron", None)
        args.update(changes)
        t = _now(conn, now)
        spec = make_spec(name, args.pop("kind"), args.pop("payload"), **args,
                         max_payload_bytes=c.settings.max_payload_bytes, now=t)
        return _store(conn, spec, t)


def get_schedule(name: str, *, client: Client | None = None) -> Schedule:
    """The schedule as stored. Raises `ScheduleNotFound`."""
    schedule_name(name)
    with _client(client)._conn(None) as conn:
        row = conn.execute(schedule_sql.SELECT_SCHEDULE, {"name": name}).fetchone()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return Schedule.from_row(row)


def list_schedules(*, client: Client | None = None) -> list[Schedule]:
    """Every schedule, by name."""
    with _client(client)._conn(None) as conn:
        rows = conn.execute(schedule_sql.LIST_SCHEDULES).fetchall()
    return [Schedule.from_row(r) for r in rows]


def pause_schedule(name: str, *, client: Client | None = None,
                   now: datetime | None = None) -> Schedule:
    """Stop firing. Jobs already made are left alone. Raises `ScheduleNotFound`."""
    with _client(client)._conn(None) as conn:
        current = _locked(conn, name)
        row = conn.execute(schedule_sql.SET_PAUSED, {
            "name": name, "paused": True, "cursor_at": current.cursor_at,
            "next_slot": current.next_slot, "next_fire_at": current.next_fire_at,
            "now": now}).fetchone()
        assert row is not None
        return Schedule.from_row(row)


def resume_schedule(name: str, *, client: Client | None = None,
                    now: datetime | None = None) -> Schedule:
    """Fire again from the first slot after now; the slots that passed while paused are
    audited as `paused` (one record for the run). Raises `ScheduleNotFound`."""
    with _client(client)._conn(None) as conn:
        current = _locked(conn, name)
        if not current.paused:
            return replace(current, changed=False)
        t = _now(conn, now)
        _audit_unrun(conn, current, t, "paused", "the schedule was paused")
        cursor, next_slot, next_fire = _restart(current.spec, t)
        row = conn.execute(schedule_sql.SET_PAUSED, {
            "name": name, "paused": False, "cursor_at": cursor, "next_slot": next_slot,
            "next_fire_at": next_fire, "now": now}).fetchone()
        assert row is not None
        return Schedule.from_row(row)


def delete_schedule(name: str, *, client: Client | None = None) -> None:
    """Delete the schedule and its audit records; jobs it made are left alone.
    Raises `ScheduleNotFound`."""
    schedule_name(name)
    with _client(client)._conn(None) as conn:
        if conn.execute(schedule_sql.DELETE_SCHEDULE, {"name": name}).fetchone() is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")


def preview_schedule(name: str, n: int = 10, *, after: datetime | None = None,
                     client: Client | None = None) -> list[FireTime]:
    """The next `n` fire times after `after` (default now), as they will happen: in the
    schedule's zone, with DST policies and the spread offset applied (jitter, being random,
    comes on top, up to `jitter_seconds`). Raises `ScheduleNotFound`."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PREVIEW:
        raise InvalidInput(f"n must be an integer from 1 to {MAX_PREVIEW}, got {n!r}")
    schedule_name(name)
    with _client(client)._conn(None) as conn:
        t = _now(conn, after)
        row = conn.execute(schedule_sql.SELECT_SCHEDULE, {"name": name}).fetchone()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    sched = Schedule.from_row(row)
    offset = spread_offset(sched.name, sched.spread_seconds)
    start = max(t, sched.cursor_at + offset)
    return preview(sched.timing, sched.name, sched.spread_seconds, start, n)


def schedule_history(name: str, limit: int = 50, *,
                     client: Client | None = None) -> list[ScheduleEvent]:
    """The audit records of slots that did not become jobs, newest first."""
    schedule_name(name)
    _limit(limit)
    with _client(client)._conn(None) as conn:
        rows = conn.execute(schedule_sql.SELECT_AUDIT, {"name": name, "limit": limit}).fetchall()
    return [ScheduleEvent(*r) for r in rows]


def schedule_runs(name: str, limit: int = 20, *,
                  client: Client | None = None) -> list[ScheduleRun]:
    """The latest jobs the schedule made, newest slot first."""
    schedule_name(name)
    _limit(limit)
    with _client(client)._conn(None) as conn:
        rows = conn.execute(schedule_sql.SELECT_RUNS, {"name": name, "limit": limit}).fetchall()
    return [ScheduleRun(job_id, slot_of(key) or run_at, state, run_at)
            for job_id, key, state, run_at in rows]


# --- internals ------------------------------------------------------------------------------

def _store(conn: Connection, spec: ScheduleSpec, t: datetime) -> Schedule:
    cursor, next_slot, next_fire = _restart(spec, t)
    params = {**_definition_params(spec), "name": spec.name, "cursor_at": cursor,
              "next_slot": next_slot, "next_fire_at": next_fire, "buffered_slot": None,
              "now": t}
    row = conn.execute(schedule_sql.INSERT_SCHEDULE, params).fetchone()
    if row is not None:
        return Schedule.from_row(row)
    current = _locked(conn, spec.name)
    # jsonb does not keep the text's key order or spacing: compare payloads as values.
    stored = {**_definition_params(current.spec), "payload": current.payload}
    wanted = {**_definition_params(spec), "payload": json.loads(spec.payload)}
    if stored == wanted:
        return replace(current, changed=False)
    if current.timing == spec.timing:
        # Same slots: keep the schedule's place; only the fire offset may move.
        offset = spread_offset(spec.name, spec.spread_seconds)
        params.update(cursor_at=current.cursor_at, next_slot=current.next_slot,
                      buffered_slot=current.buffered_slot,
                      next_fire_at=current.next_slot + offset if current.next_slot else None)
    else:
        # New slots from now on; old ones that came due and never ran (paused, timers down)
        # are recorded, not forgotten.
        _audit_unrun(conn, current, t, "redefined",
                     "the schedule's timing changed before these slots ran")
        if current.buffered_slot is not None:
            conn.execute(schedule_sql.INSERT_AUDIT, {
                "names": [current.name], "reasons": ["redefined"],
                "firsts": [current.buffered_slot], "lasts": [current.buffered_slot],
                "counts": [1], "details": ["a buffered slot dropped by a timing change"],
                "now": t})
    row = conn.execute(schedule_sql.UPDATE_SCHEDULE, params).fetchone()
    assert row is not None
    return Schedule.from_row(row)


def _restart(spec: ScheduleSpec, t: datetime) -> tuple[datetime, datetime | None,
                                                       datetime | None]:
    """(cursor, next slot, next fire) for a schedule starting at `t`: its first run is the
    first slot that fires after t."""
    offset = spread_offset(spec.name, spec.spread_seconds)
    cursor = t - offset
    first = next(iter(slots_after(spec.timing, cursor)), None)
    return cursor, (first.at if first else None), (first.at + offset if first else None)


def _audit_unrun(conn: Connection, current: Schedule, t: datetime, reason: str,
                 detail: str) -> None:
    """One audit record for the slots after the cursor that came due by `t` and will now
    never run."""
    offset = spread_offset(current.name, current.spread_seconds)
    first: datetime | None = None
    last: datetime | None = None
    count = 0
    for slot in slots_after(current.timing, current.cursor_at):
        if slot.at + offset > t or count >= MAX_UNRUN_SCAN:
            break
        if slot.skip_reason is None:
            first = first or slot.at
            last = slot.at
            count += 1
    if first is None or last is None:
        return
    counted = count < MAX_UNRUN_SCAN
    conn.execute(schedule_sql.INSERT_AUDIT, {
        "names": [current.name], "reasons": [reason], "firsts": [first],
        "lasts": [last if counted else t], "counts": [count if counted else None],
        "details": [detail + ("" if counted else
                              f"; more than {MAX_UNRUN_SCAN} slots, not counted")],
        "now": t})


def _definition_params(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "kind": spec.kind, "queue": spec.queue, "payload": spec.payload,
        "priority": spec.priority,
        "max_attempts": spec.max_attempts, "timeout_seconds": spec.timeout_seconds,
        "tenant": spec.tenant, "cron": spec.timing.cron, "every": spec.timing.every,
        "anchor": spec.timing.anchor, "tz": spec.timing.tz, "misfire": spec.misfire.value,
        "misfire_grace_seconds": spec.misfire_grace_seconds,
        "backfill_max": spec.backfill_max, "backfill_gap_seconds": spec.backfill_gap_seconds,
        "overlap": spec.overlap.value, "dst_gap": spec.timing.dst_gap.value,
        "dst_fold": spec.timing.dst_fold.value, "spread_seconds": spec.spread_seconds,
        "jitter_seconds": spec.jitter_seconds,
    }


def _locked(conn: Connection, name: str) -> Schedule:
    schedule_name(name)
    row = conn.execute(schedule_sql.LOCK_SCHEDULE, {"name": name}).fetchone()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return Schedule.from_row(row)


def _now(conn: Connection, now: datetime | None) -> datetime:
    row = conn.execute(schedule_sql.DB_NOW, {"now": now}).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value.astimezone(UTC)


def _limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PREVIEW:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PREVIEW}, got {limit!r}")


def _client(client: Client | None) -> Client:
    if client is not None:
        return client
    from shared.producer.client import default_client

    return default_client()
