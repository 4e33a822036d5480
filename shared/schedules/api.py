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
`name:<slot in UTC ISO 8601>`.

`ScheduleApi` is a mixin: `shared.client.Client` combines it with the producer client, and
the module-level functions of `shared.client` call it on the process-wide client. Every
method takes `now=` where time matters (tests pin the clock; default: the database's).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from shared.core import validation
from shared.core.config import ProducerConfig
from shared.core.errors import InvalidInput, ScheduleNotFound
from shared.core.schedules import Misfire, Schedule, ScheduleEvent, ScheduleRun, ScheduleSpec
from shared.schedules.slots import FireTime, preview, slots_after, spread_offset
from shared.schedules.spec import (
    BACKFILL_ONLY,
    CRON_ONLY,
    make_spec,
    refuse_inapplicable,
    schedule_name,
)
from shared.store.database import Database
from shared.store.known_kinds import KnownKinds
from shared.store.rows import AuditRecord, Cursor
from shared.store.schedule_store import ScheduleStore, definition_of

MAX_PREVIEW = 1000
MAX_UNRUN_SCAN = 10_000
UPDATABLE = frozenset({
    "kind", "payload", "every", "cron", "tz", "start", "queue", "priority", "max_attempts",
    "timeout", "tenant", "misfire", "misfire_grace", "backfill_max", "backfill_gap", "overlap",
    "dst_gap", "dst_fold", "spread", "jitter"})


class ScheduleApi:
    """Schedule operations over `self.database`; mixed into `shared.client.Client`."""

    settings: ProducerConfig
    database: Database
    known_kinds: KnownKinds

    def recurring(self, name: str, kind: str, payload: Any = None, *,
                  every: timedelta | float | None = None, cron: str | None = None,
                  tz: str | None = None, start: datetime | None = None,
                  queue: str | None = None,
                  priority: int = 0, max_attempts: int | None = None,
                  timeout: float | timedelta | None = None, tenant: str | None = None,
                  misfire: str = "latest", misfire_grace: float | timedelta = 60.0,
                  backfill_max: int | None = None, backfill_gap: float | timedelta | None = None,
                  overlap: str = "allow", dst_gap: str | None = None,
                  dst_fold: str | None = None,
                  spread: float | timedelta = 0.0, jitter: float | timedelta = 0.0,
                  now: datetime | None = None) -> Schedule:
        """Create or update the schedule `name`: run `kind` with `payload` on every slot.

        Timing: `every=` (timedelta or seconds, >= 1 s; slots are `start + k * every`,
        `start` defaulting to the Unix epoch) or `cron=` (5 fields, or 6 with seconds first)
        read in `tz` (an IANA zone, default UTC; only with `cron=`). Policies: `misfire`
        latest|skip|all (missed = reached more than `misfire_grace` late; `all` runs at
        most `backfill_max` (100), `backfill_gap` (1) seconds apart: both with `all` only),
        `overlap` allow|skip|buffer_one, `dst_gap` shift|skip and `dst_fold` once|twice
        (cron only: default shift, once), `spread` (a
        stable per-name offset within that many seconds) and `jitter` (random, up to that
        many). Job options (`queue`, `priority`, `max_attempts`, `timeout`, `tenant`) as in
        `schedule()`. Raises `InvalidSchedule` naming the problem. A paused schedule stays
        paused.
        """
        # None: not given, so the default, which applies to any schedule.
        given = {option: value for option, value in (
            ("backfill_max", backfill_max), ("backfill_gap", backfill_gap),
            ("dst_gap", dst_gap), ("dst_fold", dst_fold)) if value is not None}
        with self._schedules().transaction() as store:
            t = store.db_now(now)
            spec = make_spec(
                name, kind, payload, every=every, cron=cron, tz=tz, start=start,
                queue=self.settings.default_queue if queue is None else queue,
                priority=priority,
                max_attempts=max_attempts, timeout=timeout, tenant=tenant, misfire=misfire,
                misfire_grace=misfire_grace, overlap=overlap, spread=spread, jitter=jitter,
                max_payload_bytes=self.settings.max_payload_bytes, now=t, **given)
            refuse_inapplicable(spec, given)
            if self.settings.reject_unknown_kinds:
                self.known_kinds.check([spec.kind])
            return _save(store, spec, t)

    def update_schedule(self, /, name: str, *, now: datetime | None = None,
                        **changes: Any) -> Schedule:
        """Change some arguments of an existing schedule (same names as `recurring()`;
        `every` and `cron` replace each other). Raises `ScheduleNotFound`, `InvalidSchedule`."""
        unknown = set(changes) - UPDATABLE
        if unknown:
            raise InvalidInput(f"unknown schedule argument(s) {sorted(unknown)}; "
                               f"known: {sorted(UPDATABLE)}")
        with self._schedules().transaction() as store:
            current = _locked(store, name)
            args = _arguments(current)
            if "cron" in changes:
                args.pop("every", None)
                args.pop("start", None)
            if "every" in changes and current.cron is not None:
                # The zone and DST policies belong to the cron it replaces: an interval
                # has none.
                for option in ("cron", "tz", *CRON_ONLY):
                    args.pop(option, None)
            if changes.get("misfire", Misfire.ALL) != Misfire.ALL:
                for option in BACKFILL_ONLY:  # as do the backfill's to misfire='all'
                    args.pop(option, None)
            args.update(changes)
            t = store.db_now(now)
            spec = make_spec(name, args.pop("kind"), args.pop("payload"), **args,
                             max_payload_bytes=self.settings.max_payload_bytes, now=t)
            refuse_inapplicable(spec, changes)
            return _save(store, spec, t)

    def get_schedule(self, name: str) -> Schedule:
        """The schedule as stored. Raises `ScheduleNotFound`."""
        schedule_name(name)
        found = self._schedules().get(name)
        if found is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        return found

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self._schedules().list_all()

    def pause_schedule(self, name: str, *, now: datetime | None = None) -> Schedule:
        """Stop firing. Jobs already made are left alone. Pausing a paused schedule changes
        nothing (`changed` is False). Raises `ScheduleNotFound`."""
        with self._schedules().transaction() as store:
            current = _locked(store, name)
            if current.paused:  # as resume of a running schedule: nothing to do, said so
                return replace(current, changed=False)
            paused = store.set_paused(name, True, Cursor(
                current.cursor_at, current.next_slot, current.next_fire_at,
                current.buffered_slot), store.db_now(now))
            assert paused is not None
            return paused

    def resume_schedule(self, name: str, *, now: datetime | None = None) -> Schedule:
        """Fire again from the first slot after now; the slots that passed while paused are
        audited as `paused` (one record for the run), as is a slot an overlap held back
        (buffer_one) before the pause. Raises `ScheduleNotFound`."""
        with self._schedules().transaction() as store:
            current = _locked(store, name)
            if not current.paused:
                return replace(current, changed=False)
            t = store.db_now(now)
            _audit_unrun(store, current, t, "paused", "the schedule was paused")
            if current.buffered_slot is not None:
                # Held back by an overlap before the pause: as stale as the slots the
                # pause passed over, so dropped with them (the restart buffers nothing).
                store.insert_audit([AuditRecord(
                    current.name, "paused", current.buffered_slot, current.buffered_slot, 1,
                    "a buffered slot dropped: the schedule was paused before it ran")], t)
            resumed = store.set_paused(name, False, _restart(current.spec, t), now)
            assert resumed is not None
            return resumed

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule and its audit records; jobs it made are left alone.
        Raises `ScheduleNotFound`."""
        schedule_name(name)
        if not self._schedules().delete(name):
            raise ScheduleNotFound(f"no schedule named {name!r}")

    def preview_schedule(self, name: str, n: int = 10, *,
                         after: datetime | None = None) -> list[FireTime]:
        """The next `n` fire times after `after` (default now), as they will happen: in the
        schedule's zone, with DST policies and the spread offset applied (jitter, being
        random, comes on top, up to `jitter_seconds`). Raises `ScheduleNotFound`."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PREVIEW:
            raise InvalidInput(f"n must be an integer from 1 to {MAX_PREVIEW}, got {n!r}")
        if after is not None:
            after = validation.aware("after", after)
        schedule_name(name)
        with self._schedules().transaction() as store:
            t = store.db_now(after)
            sched = store.get(name)
        if sched is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        offset = spread_offset(sched.name, sched.spread_seconds)
        start = max(t, sched.cursor_at + offset)
        return preview(sched.timing, sched.name, sched.spread_seconds, start, n)

    def schedule_history(self, name: str, limit: int = 50) -> list[ScheduleEvent]:
        """The audit records of slots that did not become jobs, newest first. Raises
        `ScheduleNotFound` (its records go with a deleted schedule)."""
        schedule_name(name)
        _limit(limit)
        store = self._schedules()
        events = store.audit(name, limit)
        if not events and store.get(name) is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        return events

    def schedule_runs(self, name: str, limit: int = 20) -> list[ScheduleRun]:
        """The latest jobs the schedule made, latest run time first (a backfill's runs,
        spaced out after an outage, may list an older slot above a newer one); also of a
        deleted schedule (its jobs are left alone), so a name that never had one gives an
        empty list."""
        schedule_name(name)
        _limit(limit)
        return self._schedules().runs(name, limit)

    def _schedules(self) -> ScheduleStore:
        return ScheduleStore(self.database)


# --- internals ------------------------------------------------------------------------------

def _save(store: ScheduleStore, spec: ScheduleSpec, t: datetime) -> Schedule:
    """Insert, or update what changed; an unchanged definition writes nothing."""
    inserted = store.insert(spec, _restart(spec, t), t)
    if inserted is not None:
        return inserted
    current = _locked(store, spec.name)
    if definition_of(current.spec) == definition_of(spec):
        return replace(current, changed=False)
    if current.timing == spec.timing:
        # Same slots: keep the schedule's place; only the fire offset may move.
        offset = spread_offset(spec.name, spec.spread_seconds)
        cursor = Cursor(current.cursor_at, current.next_slot,
                        current.next_slot + offset if current.next_slot else None,
                        current.buffered_slot)
    else:
        # New slots from now on; old ones that came due and never ran (paused, timers down)
        # are recorded, not forgotten.
        _audit_unrun(store, current, t, "redefined",
                     "the schedule's timing changed before these slots ran")
        if current.buffered_slot is not None:
            store.insert_audit([AuditRecord(
                current.name, "redefined", current.buffered_slot, current.buffered_slot, 1,
                "a buffered slot dropped by a timing change")], t)
        cursor = _restart(spec, t)
    updated = store.update(spec, cursor, t)
    assert updated is not None
    return updated


def _restart(spec: ScheduleSpec, t: datetime) -> Cursor:
    """Where a schedule starting at `t` stands: its first run is the first slot that fires
    after t."""
    offset = spread_offset(spec.name, spec.spread_seconds)
    cursor = t - offset
    first = next(iter(slots_after(spec.timing, cursor)), None)
    return Cursor(cursor, first.at if first else None, first.at + offset if first else None)


def _audit_unrun(store: ScheduleStore, current: Schedule, t: datetime, reason: str,
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
    store.insert_audit([AuditRecord(
        current.name, reason, first, last if counted else t, count if counted else None,
        detail + ("" if counted else f"; more than {MAX_UNRUN_SCAN} slots, not counted"))], t)


def _arguments(current: Schedule) -> dict[str, Any]:
    """The `recurring()` arguments that define `current`."""
    args: dict[str, Any] = {
        "kind": current.kind, "payload": current.payload,
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
        args["cron"], args["tz"] = current.cron, current.tz
    else:
        args["every"], args["start"] = current.every, current.anchor
    return args


def _locked(store: ScheduleStore, name: str) -> Schedule:
    schedule_name(name)
    found = store.lock(name)
    if found is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return found


def _limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PREVIEW:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PREVIEW}, got {limit!r}")
