"""What a timer does with one schedule's due slots: a pure function of the definition, the
schedule's stored state and `now`. The timer runs it under the schedule row's lock and
writes the result in the same transaction (timer_service/scheduler.py).

A slot is *missed* when the timers reach it more than `misfire_grace_seconds` (plus one
timer pass) after its fire time (all timers down, or a paused database); otherwise it is
merely late and runs.
Missed slots follow `misfire`; every slot that does not become a job is audited.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.core.schedules import Misfire, Overlap, ScheduleSpec
from shared.schedules.slots import slots_after, spread_offset

MAX_SCAN = 10_000
"""Slots walked one by one per schedule per pass; a longer outage is audited as one range
without an exact count (a per-second cron down for a day is 86,400 slots)."""


@dataclass(frozen=True)
class ScheduleState:
    """The stored state a plan starts from."""

    cursor: datetime
    """Every slot at or before it has been handled."""
    buffered_slot: datetime | None = None
    has_active_run: bool = False
    """A job of this schedule is scheduled, retrying, dispatched or running."""
    released_at: datetime | None = None
    """When the run that held `buffered_slot` back finished (None: unknown)."""


@dataclass(frozen=True)
class Fire:
    """A job to create for a slot."""

    slot: datetime
    run_at: datetime
    why: str
    """`on_time`, `late` (within grace), `misfire_latest`, `backfill` or `buffered`."""


@dataclass(frozen=True)
class AuditEntry:
    """A run of slots that did not become jobs, with the reason."""

    reason: str
    """`missed`, `dst_nonexistent`, `overlap_skipped` or `overlap_replaced`."""
    first_slot: datetime
    last_slot: datetime
    slot_count: int | None
    detail: str | None = None


@dataclass(frozen=True)
class Plan:
    """What to write: jobs, audit rows, and the schedule's new state."""

    fires: list[Fire]
    audits: list[AuditEntry]
    cursor: datetime
    next_slot: datetime | None
    next_fire_at: datetime | None
    buffered_slot: datetime | None


@dataclass
class _Missed:
    first: datetime | None = None
    last: datetime | None = None
    count: int = 0
    counted: bool = True
    jumped_to: datetime | None = None
    recent: deque[datetime] = field(default_factory=deque)

    def add(self, slot: datetime, keep: int) -> None:
        if self.first is None:
            self.first = slot
        self.last = slot
        self.count += 1
        self.recent.append(slot)
        while len(self.recent) > keep + 1:
            self.recent.popleft()


def plan(spec: ScheduleSpec, state: ScheduleState, now: datetime, *,
         lookahead: timedelta = timedelta(0), pass_every: timedelta = timedelta(0),
         rng: random.Random | None = None) -> Plan:
    """Decide every slot up to `now + lookahead` (the timer creates jobs that far ahead so
    their run_at is met exactly; a slot's job runs at slot + spread offset + jitter).
    `pass_every` is how often the timers look: a slot they reach that late was reached by
    a healthy timer, so it counts on top of the grace."""
    rng = rng or random.Random()
    offset = spread_offset(spec.name, spec.spread_seconds)
    # overlap='skip'/'buffer_one' slots are decided when they come, by the first pass
    # after: with misfire_grace=0 every one of them was "missed" by a timer that was up.
    grace = timedelta(seconds=spec.misfire_grace_seconds) + pass_every
    # overlap='skip'/'buffer_one' ask whether the earlier run is still going *when the slot
    # comes*: a slot decided `lookahead` early would be judged against a run that still had
    # that long to finish (with every=1 s, the run of the slot before, barely started).
    early = lookahead if spec.overlap is Overlap.ALLOW else timedelta(0)
    horizon = now + early
    keep = {Misfire.ALL: spec.backfill_max, Misfire.LATEST: 1}.get(spec.misfire, 0)

    cursor = state.cursor
    audits: list[AuditEntry] = []
    on_time: list[Fire] = []
    missed = _Missed()
    upcoming: datetime | None = None
    previous: datetime | None = None
    jumped = False
    slots = slots_after(spec.timing, cursor)
    while True:
        slot = next(slots, None)
        if slot is None:  # the calendar ends (year 9999): no slot comes any more
            break
        fire_at = slot.at + offset
        if fire_at > horizon:
            upcoming = slot.at
            break
        cursor = slot.at
        if slot.skip_reason is not None:
            _append_run(audits, slot.skip_reason, slot.at)
        elif now - fire_at > grace:
            missed.add(slot.at, keep)
            if missed.count >= MAX_SCAN and previous is not None and not jumped:
                # Jump near the end of the outage, leaving room for the runs misfire keeps.
                period = max(slot.at - previous, timedelta(seconds=1))
                resume = now - grace - offset - period * (keep + 1)
                if resume > cursor:
                    jumped = True
                    missed.counted = False
                    missed.last = missed.jumped_to = cursor = resume
                    missed.recent.clear()
                    slots = slots_after(spec.timing, resume)
            previous = slot.at
        else:
            on_time.append(Fire(slot.at, fire_at + _jitter(spec, rng),
                                "on_time" if now <= fire_at + lookahead - early else "late"))

    candidates = _misfire(spec, missed, on_time, audits, now=now, rng=rng)
    fires, buffered = _overlap(spec, state, candidates, audits, now=now, offset=offset,
                               grace=grace)
    next_fire = upcoming + offset if upcoming is not None else None
    return Plan(fires, audits, cursor, upcoming, next_fire, buffered)


def _misfire(spec: ScheduleSpec, missed: _Missed, on_time: list[Fire],
             audits: list[AuditEntry], *, now: datetime, rng: random.Random) -> list[Fire]:
    if missed.first is None or missed.last is None:
        return on_time
    ran: list[datetime] = []
    if spec.misfire is Misfire.LATEST and not on_time:
        ran = [missed.recent[-1]]
    elif spec.misfire is Misfire.ALL:
        ran = list(missed.recent)[-spec.backfill_max:]
    fires = [
        Fire(slot, now + timedelta(seconds=i * spec.backfill_gap_seconds) + _jitter(spec, rng),
             "misfire_latest" if spec.misfire is Misfire.LATEST else "backfill")
        for i, slot in enumerate(ran)
    ]
    not_run = missed.count - len(ran)
    if not missed.counted or not_run > 0:
        last: datetime | None = missed.last
        if ran:
            earlier = [s for s in missed.recent if s < ran[0]]
            last = earlier[-1] if earlier else missed.jumped_to
        if last is not None and last >= missed.first:
            detail = {
                Misfire.SKIP: "timers did not reach the slot within the misfire grace",
                Misfire.LATEST: "superseded by a later slot (misfire='latest')",
                Misfire.ALL: f"beyond backfill_max={spec.backfill_max}",
            }[spec.misfire]
            if not missed.counted:
                detail += f"; more than {MAX_SCAN} slots, not counted one by one"
            audits.append(AuditEntry("missed", missed.first, last,
                                     not_run if missed.counted else None, detail))
    return fires + on_time


def _overlap(spec: ScheduleSpec, state: ScheduleState, candidates: list[Fire],
             audits: list[AuditEntry], *, now: datetime, offset: timedelta,
             grace: timedelta) -> tuple[list[Fire], datetime | None]:
    active = state.has_active_run
    buffered = state.buffered_slot
    fires: list[Fire] = []
    if buffered is not None and not active:
        # Late from when it could first run: its own time, or when the run holding it back
        # finished, whichever came last. A run longer than the grace is no outage.
        free_at = max(buffered + offset, state.released_at or buffered + offset)
        if now - free_at > grace:
            # Held back by the overlap, then the timers were away past the grace once it
            # was free (an outage): as stale as the slots the outage passed over.
            audits.append(AuditEntry(
                "missed", buffered, buffered, 1,
                "held back by an earlier run (overlap='buffer_one'), then not reached "
                "within the misfire grace"))
        else:
            fires.append(Fire(buffered, max(now, buffered + offset), "buffered"))
            active = True
        buffered = None
    for fire in candidates:
        if spec.overlap is Overlap.ALLOW or not active:
            fires.append(fire)
            active = True
        elif spec.overlap is Overlap.SKIP:
            audits.append(AuditEntry("overlap_skipped", fire.slot, fire.slot, 1,
                                     "an earlier run had not finished"))
        else:
            if buffered is not None:
                # One record for a run of them: an outage's slots within the grace
                # replace one another in a single pass.
                _append_run(audits, "overlap_replaced", buffered,
                            "a newer slot took its place in the buffer")
            buffered = fire.slot
    return fires, buffered


def _append_run(audits: list[AuditEntry], reason: str, slot: datetime,
                detail: str | None = None) -> None:
    """Audit `slot` for `reason`, extending the last record if it is a run of the same."""
    last = audits[-1] if audits else None
    if last is not None and last.reason == reason and last.slot_count is not None:
        audits[-1] = AuditEntry(reason, last.first_slot, slot, last.slot_count + 1, last.detail)
    else:
        if reason == "dst_nonexistent":
            detail = "local time does not exist (DST gap), dst_gap='skip'"
        audits.append(AuditEntry(reason, slot, slot, 1, detail))


def _jitter(spec: ScheduleSpec, rng: random.Random) -> timedelta:
    if spec.jitter_seconds <= 0:
        return timedelta(0)
    return timedelta(seconds=rng.uniform(0, spec.jitter_seconds))
