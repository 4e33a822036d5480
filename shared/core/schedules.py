"""What a recurring schedule is, as data: its policies, its timing, its stored form and its
audit records. Pure: validation lives in `shared.schedules.spec`, slot arithmetic in
`shared.schedules.slots`, what a timer does with due slots in `shared.schedules.policies`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo


class Misfire(StrEnum):
    """What to do with slots the timers missed (all of them down, or paused by load)."""

    SKIP = "skip"
    """Record missed slots as missed; the next slot runs."""
    LATEST = "latest"
    """Run once for the most recent missed slot; record the others (default: missed runs
    coalesce into one)."""
    ALL = "all"
    """Run every missed slot (the newest `backfill_max`), spaced `backfill_gap_seconds` apart."""


class Overlap(StrEnum):
    """What to do when a slot comes while an earlier run has not finished."""

    ALLOW = "allow"
    """Run anyway (default)."""
    SKIP = "skip"
    """Record the slot as skipped."""
    BUFFER_ONE = "buffer_one"
    """Keep the newest such slot and run it when the earlier run finishes."""


class DstGap(StrEnum):
    """A local time that does not exist (clocks spring forward over it)."""

    SHIFT = "shift"
    """Run at the first valid instant after the gap (default)."""
    SKIP = "skip"
    """Do not run; record the slot as skipped."""


class DstFold(StrEnum):
    """A local time that happens twice (clocks fall back over it)."""

    ONCE = "once"
    """Run at its first occurrence only (default)."""
    TWICE = "twice"
    """Run at both occurrences."""


@dataclass(frozen=True)
class Timing:
    """When a schedule's slots are: the part of a definition slot arithmetic needs."""

    cron: str | None
    every: timedelta | None
    anchor: datetime | None
    tz: str
    dst_gap: DstGap = DstGap.SHIFT
    dst_fold: DstFold = DstFold.ONCE

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.tz)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} in {self.tz}"
        assert self.every is not None
        every = _human_seconds(self.every.total_seconds())
        return f"every {every} from {self.anchor:%Y-%m-%dT%H:%M:%SZ}"


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule definition (what `recurring()` stores)."""

    name: str
    kind: str
    payload: str
    """JSON text."""
    timing: Timing
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    timeout_seconds: float | None = None
    tenant: str | None = None
    misfire: Misfire = Misfire.LATEST
    misfire_grace_seconds: float = 60.0
    backfill_max: int = 100
    backfill_gap_seconds: float = 1.0
    overlap: Overlap = Overlap.ALLOW
    spread_seconds: float = 0.0
    jitter_seconds: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored."""

    name: str
    kind: str
    queue: str
    payload: Any
    priority: int
    max_attempts: int | None
    timeout_seconds: float | None
    tenant: str | None
    cron: str | None
    every: timedelta | None
    anchor: datetime | None
    tz: str
    misfire: Misfire
    misfire_grace_seconds: float
    backfill_max: int
    backfill_gap_seconds: float
    overlap: Overlap
    dst_gap: DstGap
    dst_fold: DstFold
    spread_seconds: float
    jitter_seconds: float
    paused: bool
    cursor_at: datetime
    """Every slot up to here has been handled (fired or audited)."""
    next_slot: datetime | None
    next_fire_at: datetime | None
    """next_slot plus the schedule's spread offset (jitter comes on top)."""
    buffered_slot: datetime | None
    created_at: datetime
    updated_at: datetime
    changed: bool = True
    """False when `recurring()` found the same definition already stored."""

    @classmethod
    def from_row(cls, row: tuple[Any, ...], *, changed: bool = True) -> Schedule:
        names = [f.name for f in fields(cls) if f.name != "changed"]
        values = dict(zip(names, row[:len(names)], strict=True))
        values["misfire"] = Misfire(values["misfire"])
        values["overlap"] = Overlap(values["overlap"])
        values["dst_gap"] = DstGap(values["dst_gap"])
        values["dst_fold"] = DstFold(values["dst_fold"])
        return cls(**values, changed=changed)

    @property
    def timing(self) -> Timing:
        return Timing(self.cron, self.every, self.anchor, self.tz, self.dst_gap, self.dst_fold)

    @property
    def spec(self) -> ScheduleSpec:
        """The definition, as the policies need it."""
        return ScheduleSpec(
            name=self.name, kind=self.kind,
            payload=json.dumps(self.payload, separators=(",", ":")),
            timing=self.timing, queue=self.queue, priority=self.priority,
            max_attempts=self.max_attempts, timeout_seconds=self.timeout_seconds,
            tenant=self.tenant, misfire=self.misfire,
            misfire_grace_seconds=self.misfire_grace_seconds, backfill_max=self.backfill_max,
            backfill_gap_seconds=self.backfill_gap_seconds, overlap=self.overlap,
            spread_seconds=self.spread_seconds, jitter_seconds=self.jitter_seconds)

    def describe(self) -> str:
        """One line for people: `cron '0 2 * * *' in Europe/Berlin`."""
        return self.timing.describe()


@dataclass(frozen=True)
class ScheduleEvent:
    """An audit record: slots that did not become jobs, and why."""

    id: int
    schedule: str
    reason: str
    """`missed`, `paused`, `redefined`, `dst_nonexistent`, `overlap_skipped` or
    `overlap_replaced`."""
    first_slot: datetime
    last_slot: datetime
    slot_count: int | None
    """None when the run was too long to count slot by slot."""
    detail: str | None
    recorded_at: datetime


@dataclass(frozen=True)
class ScheduleRun:
    """A job a schedule made."""

    job_id: int
    slot: datetime
    state: str
    run_at: datetime


def slot_of(key: str | None) -> datetime | None:
    """The slot a recurring job was made for, from its run key (`TaskContext.key`); None for
    other jobs. (`TaskContext.scheduled_at` is the slot too, unless the run was a late
    backfill, which is spaced out.)"""
    if not key or ":" not in key:
        return None
    _, _, text = key.partition(":")
    try:
        slot = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return slot if slot.tzinfo is not None else None


def _human_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


@cache
def zone(name: str) -> ZoneInfo:
    """The zone of an IANA name, cached (raises ZoneInfoNotFoundError)."""
    return ZoneInfo(name)
