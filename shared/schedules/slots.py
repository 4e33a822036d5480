"""Slot arithmetic: the instants a schedule fires at, computed from its definition only
(never from when a timer happened to look, so nothing drifts).

Cron expressions name local wall times. Each wall time maps to zero, one or two instants:
- it does not exist (clocks spring forward over it): `dst_gap='shift'` fires at the first
  valid instant after the gap, i.e. the transition itself; `'skip'` yields a skip slot there.
  Several wall times in one gap shift onto the same instant and fire once.
- it happens twice (clocks fall back): `dst_fold='once'` fires at the first occurrence,
  `'twice'` at both.
Intervals (`every=`) are absolute: `anchor + k * every`, untouched by DST.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count, islice
from zoneinfo import ZoneInfo

from croniter import CroniterError, croniter

from shared.core.schedules import DstFold, DstGap, Timing

# Longer than any clock shift in the tz database (Antarctica/Troll: 2 h); how far back a fold
# can reach, so a wall time seen before `after` may still have a second occurrence after it.
MAX_SHIFT = timedelta(hours=3)
ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, order=True)
class Slot:
    """One slot: its instant, and why it will not fire if it will not."""

    at: datetime
    """UTC instant (for a shifted DST gap time: the end of the gap)."""
    skip_reason: str | None = None
    """None for a slot that fires; else the audit reason (`dst_nonexistent`)."""
    local: datetime | None = None
    """The wall time the cron named (naive, in the schedule's zone); None for intervals."""
    note: str | None = None
    """`dst_shifted`, `dst_first`, `dst_second`: how DST placed this slot."""


@dataclass(frozen=True)
class FireTime:
    """A preview entry: when a future slot really fires."""

    slot: datetime
    fire_at: datetime
    """slot + the schedule's stable spread offset (random jitter is added on top, up to
    `jitter_seconds`)."""
    local: datetime
    """fire_at in the schedule's zone."""
    note: str | None


def slots_after(timing: Timing, after: datetime) -> Iterator[Slot]:
    """Every slot strictly after `after`, in time order, forever (or until the calendar ends:
    a cron that never fires raises croniter's `CroniterBadDateError`; slots past the year
    9999 that Python's datetime ends with are not yielded, and the iteration stops)."""
    after = _utc(after)
    try:
        if timing.every is not None:
            yield from _interval_slots(timing, after)
        else:
            yield from _cron_slots(timing, after)
    except OverflowError:  # "date value out of range": the end of the calendar
        return
    except ValueError as exc:
        # croniter builds the year after 9999 with datetime(): "year 10000 is out of
        # range". Its own errors (a cron that never fires) are ValueErrors too: raised.
        if isinstance(exc, CroniterError) or "out of range" not in str(exc):
            raise
        return


def next_slot(timing: Timing, after: datetime) -> Slot | None:
    """The first slot strictly after `after`."""
    return next(iter(slots_after(timing, after)), None)


def spread_offset(name: str, spread_seconds: float) -> timedelta:
    """A stable offset in [0, spread) from a hash of the name (Jenkins' `H`): the same name
    always lands on the same offset, different names scatter over the window."""
    window_ms = int(spread_seconds * 1000)
    if window_ms <= 0:
        return timedelta(0)
    digest = hashlib.sha256(name.encode()).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % window_ms)


def preview(timing: Timing, name: str, spread_seconds: float, after: datetime,
            n: int) -> list[FireTime]:
    """The next `n` fire times after `after`, as they will really happen."""
    offset = spread_offset(name, spread_seconds)
    fires = (s for s in slots_after(timing, after - offset) if s.skip_reason is None)
    return [FireTime(s.at, s.at + offset, (s.at + offset).astimezone(timing.zone), s.note)
            for s in islice(fires, n)]


def slot_key(name: str, slot: datetime) -> str:
    """The run key of a slot's job: `name:<slot in UTC ISO 8601>`."""
    return f"{name}:{_utc(slot).isoformat().replace('+00:00', 'Z')}"


def _interval_slots(timing: Timing, after: datetime) -> Iterator[Slot]:
    assert timing.every is not None and timing.anchor is not None
    k = max((after - timing.anchor) // timing.every + 1, 0)
    while True:
        yield Slot(timing.anchor + k * timing.every)
        k += 1


def _cron_slots(timing: Timing, after: datetime) -> Iterator[Slot]:
    assert timing.cron is not None
    zone = timing.zone
    # A fall-back shift just ahead means wall times up to the shift before `after` have
    # their second occurrence after it: start the wall-clock walk that much earlier.
    ahead = (after + MAX_SHIFT).astimezone(zone).utcoffset()
    here = after.astimezone(zone).utcoffset()
    assert ahead is not None and here is not None
    back = max(here - ahead, timedelta(0))
    wall = after.astimezone(zone).replace(tzinfo=None) - back - ONE_SECOND
    six = len(timing.cron.split(" ")) == 6
    walls = croniter(timing.cron, wall, second_at_beginning=six)
    # Instants are not monotonic in wall time around a fold (the second 02:00 comes after
    # the first 02:30), but each wall time's first instant is: buffer until it is safe.
    pending: list[tuple[datetime, int, int, Slot]] = []
    seq = count()  # ties on (instant, kind) keep wall-time order; Slots are never compared
    last_fired: datetime | None = None
    while True:
        w: datetime = walls.get_next(datetime)
        mapped = _instants(w, zone, timing.dst_gap, timing.dst_fold)
        for slot in mapped:
            # Same instant: a real wall time before a shifted one (it keeps its own note
            # when they merge), fires before skips (the cursor never passes a fire).
            rank = 2 if slot.skip_reason else 1 if slot.note == "dst_shifted" else 0
            heapq.heappush(pending, (slot.at, rank, next(seq), slot))
        floor = mapped[0].at
        while pending and pending[0][0] < floor:
            at, _, _, slot = heapq.heappop(pending)
            if at <= after:
                continue
            if slot.skip_reason is None:
                if at == last_fired:
                    continue  # two gap times shifted onto one instant: one run
                last_fired = at
            yield slot


def _instants(wall: datetime, zone: ZoneInfo, gap: DstGap, fold: DstFold) -> list[Slot]:
    """The slots of one wall time; the first one is the earliest and never decreases as the
    wall time grows."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return [Slot(first, local=wall)]
    if _wall(first, zone) == wall and _wall(second, zone) == wall:
        if fold is DstFold.TWICE:
            return [Slot(first, local=wall, note="dst_first"),
                    Slot(second, local=wall, note="dst_second")]
        return [Slot(first, local=wall, note="dst_first")]
    # Not a real local time: zoneinfo's fold=1 reading lies before the transition, fold=0's
    # after it. The transition is the first valid instant after the gap.
    end = _transition(zone, min(first, second), max(first, second))
    if gap is DstGap.SKIP:
        return [Slot(end, skip_reason="dst_nonexistent", local=wall)]
    return [Slot(end, local=wall, note="dst_shifted")]


def _transition(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """The first instant in (lo, hi] with hi's UTC offset (offsets change on whole seconds)."""
    target = hi.astimezone(zone).utcoffset()
    while hi - lo > ONE_SECOND:
        mid = lo + timedelta(seconds=int((hi - lo).total_seconds()) // 2)
        if mid.astimezone(zone).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return hi


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: slots need timezone-aware times")
    return value.astimezone(UTC)
