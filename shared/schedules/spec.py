"""The checks that keep a bad recurring schedule out of the database: `make_spec` turns loose
arguments into a validated `ScheduleSpec` (shared.core.schedules) or raises
`InvalidSchedule` naming the argument and the problem.

A schedule fires on *slots*: for `cron=` the local wall times the expression names in `tz`
(5 fields, or 6 with seconds first: `"*/15 * * * * *"`); for `every=` the instants
`anchor + k * every` (absolute elapsed time, the Unix epoch by default, so `every=15 s` fires
at :00, :15, :30 and :45). Slot arithmetic lives in `shared.schedules.slots`, what a timer
does with due slots in `shared.schedules.policies`; both are pure functions of `now`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache, lru_cache
from typing import Any
from zoneinfo import ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from shared.core import validation
from shared.core.errors import InvalidInput, InvalidSchedule
from shared.core.schedules import (
    DstFold,
    DstGap,
    Misfire,
    Overlap,
    ScheduleSpec,
    Timing,
    zone,
)
from shared.core.text import shown
from shared.schedules.slots import next_slot

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MIN_EVERY = timedelta(seconds=1)
MAX_EVERY = timedelta(days=366)
MAX_SPREAD_SECONDS = 86400.0
MAX_BACKFILL = 10000
MAX_START_AHEAD = timedelta(seconds=validation.MAX_DELAY_SECONDS)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CRON_FIELDS = "5 fields (minute hour day month weekday) or 6 (second minute hour day month weekday)"
CRON_SHORTCUTS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The @-shortcuts of cron and the 5 fields each stands for (refused, with these as the
fix: one way to write a schedule, and it shows what it does)."""


def schedule_name(value: object) -> str:
    """Check a schedule name: it is half of every run key (`name:<slot>`), so no colons."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise InvalidSchedule(
            f"schedule name {shown(value)} is not valid: 1-100 letters, digits and . _ - "
            "(starting with a letter or digit)")
    return value


def make_spec(name: object, kind: object, payload: Any = None, *,
              every: object = None, cron: object = None, tz: object = None,
              start: object = None, queue: object = "default", priority: object = 0,
              max_attempts: object = None, timeout: object = None, tenant: object = None,
              misfire: object = "latest", misfire_grace: object = 60.0,
              backfill_max: object = 100, backfill_gap: object = 1.0,
              overlap: object = "allow", dst_gap: object = "shift", dst_fold: object = "once",
              spread: object = 0.0, jitter: object = 0.0,
              max_payload_bytes: int = 256 * 1024, now: datetime | None = None) -> ScheduleSpec:
    """Validate every argument of a schedule and return its definition; raises
    `InvalidSchedule` naming the argument and the problem. `tz` is for `cron=` only (None:
    UTC); any zone given with `every=`, "UTC" included, is refused."""
    with _schedule_errors():
        return _make_spec(
            name=name, kind=kind, payload=payload, every=every, cron=cron, tz=tz, start=start,
            queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
            tenant=tenant, misfire=misfire, misfire_grace=misfire_grace,
            backfill_max=backfill_max, backfill_gap=backfill_gap, overlap=overlap,
            dst_gap=dst_gap, dst_fold=dst_fold, spread=spread, jitter=jitter,
            max_payload_bytes=max_payload_bytes, now=now)


@contextmanager
def _schedule_errors() -> Iterator[None]:
    try:
        yield
    except InvalidSchedule:
        raise
    except InvalidInput as exc:
        raise InvalidSchedule(str(exc)) from None


def _make_spec(*, name: object, kind: object, payload: Any, every: object, cron: object,
               tz: object, start: object, queue: object, priority: object,
               max_attempts: object, timeout: object, tenant: object, misfire: object,
               misfire_grace: object, backfill_max: object, backfill_gap: object,
               overlap: object, dst_gap: object, dst_fold: object, spread: object,
               jitter: object, max_payload_bytes: int, now: datetime | None) -> ScheduleSpec:
    name = schedule_name(name)
    if (every is None) == (cron is None):
        raise InvalidSchedule("give exactly one of every= (an interval) and cron= (an expression)")
    zone_name = "UTC" if tz is None else time_zone(tz)
    gap = _choice("dst_gap", dst_gap, DstGap)
    fold = _choice("dst_fold", dst_fold, DstFold)
    if cron is not None:
        if start is not None:
            raise InvalidSchedule("start= anchors every= intervals; a cron schedule has no anchor")
        timing = Timing(cron_expression(cron), None, None, zone_name, gap, fold)
        _first_fire(timing, now or datetime.now(UTC))
        period = None
    else:
        if tz is not None:
            raise InvalidSchedule(
                f"tz={shown(tz)} is given with every=, but tz= applies to cron schedules "
                "only: intervals are absolute elapsed time, in no zone; leave tz out (for "
                "'every day at 09:00 Berlin time' use cron='0 9 * * *', tz='Europe/Berlin')")
        interval = interval_of(every)
        anchor = EPOCH if start is None else validation.aware("start", start).astimezone(UTC)
        latest = (now or datetime.now(UTC)) + MAX_START_AHEAD
        if anchor > latest:
            # The slots from there would soon run off the end of the calendar (year 9999),
            # which neither Python nor the preview of the next fire times can pass.
            raise InvalidSchedule(f"start must be at most 10 years (3,650 days) from now, as "
                                  f"a job's delay=, got {shown(start)}")
        timing = Timing(None, interval, anchor, "UTC", gap, fold)
        period = interval.total_seconds()
    misfire_policy = _choice("misfire", misfire, Misfire)
    overlap_policy = _choice("overlap", overlap, Overlap)
    if misfire_policy is Misfire.ALL and overlap_policy is not Overlap.ALLOW:
        raise InvalidSchedule(
            f"misfire='all' backfills several runs at once, which overlap={overlap_policy.value!r}"
            " would skip or collapse; use overlap='allow' with it, or misfire='latest'")
    spread_s = _seconds("spread", spread, 0.0, MAX_SPREAD_SECONDS)
    jitter_s = _seconds("jitter", jitter, 0.0, MAX_SPREAD_SECONDS)
    if period is not None and spread_s + jitter_s >= period:
        raise InvalidSchedule(
            f"spread + jitter ({spread_s + jitter_s:g} s) must be shorter than the interval "
            f"({period:g} s), or runs would pass each other")
    if timing.cron is not None and spread_s + jitter_s > 0:
        shortest = _shortest_cron_gap(timing.cron)
        if spread_s + jitter_s >= shortest:
            raise InvalidSchedule(
                f"spread + jitter ({spread_s + jitter_s:g} s) must be shorter than the "
                f"shortest gap between two fire times of cron {timing.cron!r} "
                f"({shortest:g} s), or runs would pass each other")
    backfill = backfill_max
    if isinstance(backfill, bool) or not isinstance(backfill, int) or not (
            1 <= backfill <= MAX_BACKFILL):
        raise InvalidSchedule(f"backfill_max must be an integer from 1 to {MAX_BACKFILL}, "
                              f"got {shown(backfill_max)}")
    return ScheduleSpec(
        name=name,
        kind=validation.kind(kind),
        payload=validation.payload(payload, max_payload_bytes),
        timing=timing,
        queue=validation.queue(queue),
        priority=validation.priority(priority),
        max_attempts=validation.max_attempts(max_attempts),
        timeout_seconds=validation.timeout_seconds(timeout),
        tenant=validation.new_tenant(tenant),
        misfire=misfire_policy,
        misfire_grace_seconds=_seconds("misfire_grace", misfire_grace, 0.0, 7 * 86400.0),
        backfill_max=backfill,
        backfill_gap_seconds=_seconds("backfill_gap", backfill_gap, 0.0, 3600.0),
        overlap=overlap_policy,
        spread_seconds=spread_s,
        jitter_seconds=jitter_s,
    )


CRON_ONLY = ("dst_gap", "dst_fold")
BACKFILL_ONLY = ("backfill_max", "backfill_gap")


def refuse_inapplicable(spec: ScheduleSpec, given: Collection[str]) -> None:
    """Refuse the options among `given` (those a caller passed) that `spec` would store but
    never use: read back, they would look in force. Only what a caller gives is checked:
    schedules stored before this check may hold such values, and keep loading and updating."""
    if spec.timing.every is not None:
        for option in (o for o in CRON_ONLY if o in given):
            raise InvalidSchedule(
                f"{option} is given with every=, but it applies to cron schedules only: an "
                "interval is absolute elapsed time, in no zone, so it meets no DST gap or "
                f"fold; leave {option} out")
    if spec.misfire is not Misfire.ALL:
        for option in (o for o in BACKFILL_ONLY if o in given):
            raise InvalidSchedule(
                f"{option} is given with misfire={spec.misfire.value!r}, but only "
                f"misfire='all' backfills missed slots; leave {option} out, or use "
                "misfire='all'")


MAX_CRON_CHARS = 1000
CRON_FIELD_MAXIMA = (("minute", 59), ("hour", 23), ("day-of-month", 31), ("month", 12),
                     ("day-of-week", 7))
"""Each 5-field cron field's name and largest value; a step past it can only be a typo."""


def cron_expression(value: object) -> str:
    """A 5-field cron, or 6 fields with seconds first. Raises `InvalidSchedule` saying why."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidSchedule(f"cron must be a non-empty string, got {shown(value)}")
    expr = " ".join(value.split())
    if expr.startswith("@"):
        raise InvalidSchedule(_shortcut_refused(value, expr))
    if len(expr) > MAX_CRON_CHARS:
        raise InvalidSchedule(f"cron is {len(expr):,} characters long; at most "
                              f"{MAX_CRON_CHARS} are accepted")
    fields = expr.split(" ")
    if len(fields) not in (5, 6):
        raise InvalidSchedule(
            f"cron {value!r} has {len(fields)} field{'' if len(fields) == 1 else 's'}; "
            f"use {CRON_FIELDS}")
    names = (("second", 59),) * (len(fields) == 6) + CRON_FIELD_MAXIMA
    for (field_name, most), field in zip(names, fields, strict=True):
        for step in re.findall(r"/(\d+)", field):
            if int(step) > most:
                raise InvalidSchedule(
                    f"cron {value!r}: step /{step} of the {field_name} field is past its "
                    f"largest value ({most}), so it can only mean the field's first value; "
                    "write that value instead")
    if any(ch in expr.upper() for ch in ("H", "R")) and not re.search(r"[A-Z]{3}", expr.upper()):
        raise InvalidSchedule(
            f"cron {value!r}: H and R are not supported; spread runs with spread= instead")
    day, weekday = fields[-3], fields[-1]
    mixed = _mixed_day_fields(day, weekday)
    if mixed:
        raise InvalidSchedule(f"cron {value!r}: {mixed}")
    try:
        croniter(expr, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6)  # noqa: DTZ001
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise InvalidSchedule(f"cron {value!r} is malformed: {exc}") from None
    return expr


_ANY_DAY = ("*", "?")


def _mixed_day_fields(day: str, weekday: str) -> str | None:
    """Why a day-of-month and day-of-week pair cannot be used, or None. Cron fires on a day
    either field names when both are restricted; croniter does that for plain values and
    L, but not with W or #: it drops the day of the week beside W (`15W * 1` fires on the
    15th's nearest weekday only), and beside # it fires only on days matching both (`1 *
    5#3` never)."""
    if "W" in day.upper() and weekday not in _ANY_DAY:
        return (f"W in the day-of-month field ({day}) with a day of the week ({weekday}) is "
                "not supported: the day of the week would be ignored rather than fire too; "
                "use * for the day of the week, or two schedules")
    if "#" in weekday and day not in _ANY_DAY:
        return (f"# in the day-of-week field ({weekday}) with a day of the month ({day}) is "
                "not supported: it would fire only on days matching both rather than "
                "either; use * for the day of the month, or two schedules")
    return None


CRON_GAP_SAMPLE = 500
"""How many consecutive fire times `_shortest_cron_gap` looks at: every pattern of a
5- or 6-field cron repeats within a few hundred of them (a month of a daily cron's, an
hour of a minutely's), the calendar's rare ones (29 February) aside."""


@lru_cache(maxsize=1024)  # 500 schedules of one cron and a spread: one walk, not 500
def _shortest_cron_gap(expr: str) -> float:
    """The shortest time, in seconds, between two consecutive fire times of `expr` (in
    wall time), over CRON_GAP_SAMPLE of them from 2000-01-01."""
    fires = croniter(expr, datetime(2000, 1, 1), second_at_beginning=len(expr.split()) == 6)  # noqa: DTZ001
    shortest = float("inf")
    try:
        previous = fires.get_next(datetime)
        for _ in range(CRON_GAP_SAMPLE):
            current = fires.get_next(datetime)
            shortest = min(shortest, (current - previous).total_seconds())
            previous = current
    except CroniterBadDateError:  # past the calendar croniter walks
        pass
    return shortest


def _shortcut_refused(value: str, expr: str) -> str:
    """Why an @-shortcut cron is refused, with the 5 fields that say the same where there
    are such."""
    word = expr.split(" ", maxsplit=1)[0].lower()[:20]
    said = f"cron {value!r}: @-shortcuts such as {word} are not supported"
    if word in CRON_SHORTCUTS:
        return f"{said}; write the 5 fields it stands for: cron={CRON_SHORTCUTS[word]!r}"
    if word == "@every":
        return f"{said}; for a fixed interval use every= (seconds or a timedelta)"
    return f"{said}; use {CRON_FIELDS}"


def _first_fire(timing: Timing, now: datetime) -> None:
    try:
        first = next_slot(timing, now)
    except CroniterBadDateError:
        first = None
    if first is None:
        raise InvalidSchedule(f"cron {timing.cron!r} never fires (no such date in the calendar)")


def time_zone(value: object) -> str:
    """An IANA zone name; an unknown one gets the closest names as hints."""
    if not isinstance(value, str) or not value:
        raise InvalidSchedule(f"tz must be an IANA time zone name such as 'Europe/Berlin', "
                              f"got {shown(value)}")
    if value in HOST_ZONES:
        raise InvalidSchedule(
            f"tz {value!r} is whatever zone the host is set to, which differs between the "
            "machine that declares the schedule and each timer; name the zone, e.g. "
            "'Europe/Berlin'")
    # Only the zones of the IANA list: a file that merely loads (`right/Europe/Berlin`,
    # the leap-second build, which zoneinfo reads with wrong offsets; `posix/...`) is not one.
    known = value in _zone_names()
    if known:
        try:
            zone(value)
        except (ZoneInfoNotFoundError, ValueError):
            known = False
    if not known:
        bare = value.split("/", 1)[1] if value.startswith(("right/", "posix/")) else None
        hints = ([bare] if bare in _zone_names() else
                 difflib.get_close_matches(value, sorted(_zone_names()), n=3))
        hint = f"; did you mean {', '.join(repr(h) for h in hints)}?" if hints else ""
        raise InvalidSchedule(f"unknown time zone {value!r}{hint}") from None
    return value


HOST_ZONES = frozenset({"localtime"})
"""Names the tz database has that stand for the host's own setting, not a place."""


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def interval_of(value: object) -> timedelta:
    """`every=`: a timedelta or seconds, at least 1 s."""
    if isinstance(value, timedelta):
        interval = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = validation.finite_number("every", value)
        if seconds <= 0:
            raise InvalidSchedule(f"every must be positive, got {seconds:g} s")
        if seconds > MAX_EVERY.total_seconds():  # before timedelta(), which overflows
            raise InvalidSchedule(f"every must be at most 366 days, got {seconds:g} s")
        interval = timedelta(seconds=seconds)
        if interval.total_seconds() != seconds:
            # A timedelta holds whole microseconds: stored, 2.9999999 would be 3 s.
            raise InvalidSchedule(
                f"every must be a whole number of microseconds, got {seconds!r} s (it "
                f"would be stored as {interval.total_seconds()!r} s)")
    else:
        raise InvalidSchedule("every must be a timedelta or a number of seconds, "
                              f"got {shown(value)}")
    if interval <= timedelta(0):
        raise InvalidSchedule(f"every must be positive, got {interval.total_seconds():g} s")
    if interval < MIN_EVERY:
        raise InvalidSchedule(
            f"every must be at least {MIN_EVERY.total_seconds():g} s, got "
            f"{interval.total_seconds():g} s")
    if interval > MAX_EVERY:
        raise InvalidSchedule(f"every must be at most 366 days, got {interval}")
    return interval


def _choice(name: str, value: object, enum: type[StrEnum]) -> Any:
    try:
        return enum(str(value))
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        hints = difflib.get_close_matches(str(value), [m.value for m in enum], n=1)
        hint = f" (did you mean {hints[0]!r}?)" if hints else ""
        raise InvalidSchedule(
            f"{name} must be one of {allowed}, got {shown(value)}{hint}") from None


def _seconds(name: str, value: object, low: float, high: float) -> float:
    seconds = (value.total_seconds() if isinstance(value, timedelta)
               else validation.finite_number(name, value))
    if not low <= seconds <= high:
        raise InvalidSchedule(f"{name} must be between {low:g} and {high:g} seconds, "
                              f"got {seconds:g}")
    return seconds


