"""Slot arithmetic: boundaries, no drift, DST in three zones, spreading, preview."""

import calendar
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

from shared.core.schedules import DstFold, DstGap, Timing
from shared.schedules.slots import next_slot, preview, slot_key, slots_after, spread_offset
from shared.schedules.spec import EPOCH


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def cron(expr, tz="UTC", gap=DstGap.SHIFT, fold=DstFold.ONCE):
    return Timing(expr, None, None, tz, gap, fold)


def take(timing, after, n):
    return list(islice(slots_after(timing, after), n))


def local(slot, tz):
    return slot.at.astimezone(ZoneInfo(tz)).strftime("%m-%d %H:%M%z")


def test_interval_slots_are_strictly_after_and_anchored():
    every = Timing(None, timedelta(seconds=15), EPOCH, "UTC")
    assert next_slot(every, utc(2026, 1, 1, 0, 0, 0)).at == utc(2026, 1, 1, 0, 0, 15)
    assert next_slot(every, utc(2026, 1, 1, 0, 0, 14, 999999)).at == utc(2026, 1, 1, 0, 0, 15)
    anchored = Timing(None, timedelta(minutes=10), utc(2026, 1, 1, 0, 3), "UTC")
    assert [s.at for s in take(anchored, utc(2025, 1, 1), 2)] == [
        utc(2026, 1, 1, 0, 3), utc(2026, 1, 1, 0, 13)]  # nothing before the anchor


def test_cron_slot_boundaries_and_seconds_field():
    c = cron("*/5 * * * *")
    assert next_slot(c, utc(2026, 5, 1, 10, 4, 59)).at == utc(2026, 5, 1, 10, 5)
    assert next_slot(c, utc(2026, 5, 1, 10, 5)).at == utc(2026, 5, 1, 10, 10)
    six = cron("*/20 * * * * *")
    assert [s.at for s in take(six, utc(2026, 5, 1, 10, 0, 0), 3)] == [
        utc(2026, 5, 1, 10, 0, 20), utc(2026, 5, 1, 10, 0, 40), utc(2026, 5, 1, 10, 1, 0)]


def test_a_range_that_wraps_round_its_field_runs_through_the_end():
    # README, Timing: 22-2 is 22:00 to 02:00, fri-mon is Friday to Monday
    night = [s.at.hour for s in take(cron("0 22-2 * * *"), utc(2026, 5, 1, 12), 6)]
    assert night == [22, 23, 0, 1, 2, 22]
    days = [s.at.strftime("%a") for s in take(cron("0 0 * * fri-mon"), utc(2026, 5, 4, 1), 5)]
    assert days == ["Fri", "Sat", "Sun", "Mon", "Fri"]
    assert [s.at.minute for s in take(cron("58-1 * * * *"), utc(2026, 5, 1, 9, 50), 4)] == [
        58, 59, 0, 1]


def test_no_drift_restarting_from_any_slot_gives_the_same_sequence():
    for timing in (cron("7,31 */3 * * *", "Europe/Berlin"),
                   Timing(None, timedelta(seconds=7), EPOCH, "UTC")):
        whole = take(timing, utc(2026, 3, 28), 60)
        stepwise = [next_slot(timing, utc(2026, 3, 28))]
        while len(stepwise) < 60:
            stepwise.append(next_slot(timing, stepwise[-1].at))
        assert whole == stepwise


def test_berlin_spring_forward_shift_runs_at_the_first_valid_instant():
    slots = take(cron("30 2 * * *", "Europe/Berlin"), utc(2026, 3, 27), 4)
    assert [local(s, "Europe/Berlin") for s in slots] == [
        "03-27 02:30+0100", "03-28 02:30+0100", "03-29 03:00+0200", "03-30 02:30+0200"]
    assert slots[2].note == "dst_shifted"
    assert slots[2].at == utc(2026, 3, 29, 1, 0)


def test_berlin_gap_times_shifted_onto_one_instant_fire_once():
    slots = take(cron("*/20 * * * *", "Europe/Berlin"), utc(2026, 3, 29, 0, 30), 4)
    assert [local(s, "Europe/Berlin") for s in slots] == [
        "03-29 01:40+0100", "03-29 03:00+0200", "03-29 03:20+0200", "03-29 03:40+0200"]


def test_berlin_spring_forward_skip_leaves_skip_slots():
    slots = take(cron("30 2 * * *", "Europe/Berlin", gap=DstGap.SKIP), utc(2026, 3, 28, 12), 2)
    assert slots[0].skip_reason == "dst_nonexistent"
    assert slots[0].local == datetime(2026, 3, 29, 2, 30)
    assert slots[1].skip_reason is None
    assert local(slots[1], "Europe/Berlin") == "03-30 02:30+0200"


def test_berlin_fall_back_once_and_twice():
    once = take(cron("30 2 * * *", "Europe/Berlin"), utc(2026, 10, 24, 12), 2)
    assert [local(s, "Europe/Berlin") for s in once] == ["10-25 02:30+0200", "10-26 02:30+0100"]
    twice = take(cron("30 2 * * *", "Europe/Berlin", fold=DstFold.TWICE),
                 utc(2026, 10, 24, 12), 3)
    assert [local(s, "Europe/Berlin") for s in twice] == [
        "10-25 02:30+0200", "10-25 02:30+0100", "10-26 02:30+0100"]
    assert [s.note for s in twice] == ["dst_first", "dst_second", None]
    # Asked between the two occurrences, the second one is still ahead.
    between = next_slot(cron("30 2 * * *", "Europe/Berlin", fold=DstFold.TWICE),
                        utc(2026, 10, 25, 0, 45))
    assert local(between, "Europe/Berlin") == "10-25 02:30+0100"
    hourly = take(cron("0 * * * *", "Europe/Berlin", fold=DstFold.TWICE),
                  utc(2026, 10, 24, 23, 30), 3)
    assert [s.at for s in hourly] == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1),
                                      utc(2026, 10, 25, 2)]
    hourly_once = take(cron("0 * * * *", "Europe/Berlin"), utc(2026, 10, 24, 23, 30), 2)
    assert [s.at for s in hourly_once] == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)]


def test_new_york_both_transitions():
    spring = take(cron("15 2 * * *", "America/New_York"), utc(2026, 3, 7, 12), 3)
    assert [local(s, "America/New_York") for s in spring] == [
        "03-08 03:00-0400", "03-09 02:15-0400", "03-10 02:15-0400"]
    fall = take(cron("30 1 * * *", "America/New_York", fold=DstFold.TWICE),
                utc(2026, 10, 31, 12), 3)
    assert [local(s, "America/New_York") for s in fall] == [
        "11-01 01:30-0400", "11-01 01:30-0500", "11-02 01:30-0500"]


def test_lord_howe_thirty_minute_shift():
    tz = "Australia/Lord_Howe"
    # Spring forward 2026-10-04 02:00 -> 02:30 (+10:30 -> +11:00): 02:15 does not exist.
    spring = take(cron("15 2 * * *", tz), utc(2026, 10, 2, 12), 3)
    assert [local(s, tz) for s in spring] == ["10-03 02:15+1030", "10-04 02:30+1100",
                                              "10-05 02:15+1100"]
    skipped = take(cron("15 2 * * *", tz, gap=DstGap.SKIP), utc(2026, 10, 3, 12), 1)
    assert skipped[0].skip_reason == "dst_nonexistent"
    # Fall back 2026-04-05 02:00 -> 01:30: 01:45 happens twice, 30 minutes apart.
    fall = take(cron("45 1 * * *", tz, fold=DstFold.TWICE), utc(2026, 4, 4, 6), 2)
    assert [local(s, fall_tz := tz) for s in fall] == ["04-05 01:45+1100", "04-05 01:45+1030"]
    assert fall[1].at - fall[0].at == timedelta(minutes=30)
    assert fall_tz == tz
    once = take(cron("45 1 * * *", tz), utc(2026, 4, 4, 6), 2)
    assert [local(s, tz) for s in once] == ["04-05 01:45+1100", "04-06 01:45+1030"]


def test_spread_offset_is_stable_and_inside_the_window():
    offsets = {name: spread_offset(name, 300) for name in (f"s{i}" for i in range(200))}
    assert all(timedelta(0) <= o < timedelta(seconds=300) for o in offsets.values())
    assert spread_offset("s1", 300) == offsets["s1"]
    assert len(set(offsets.values())) > 150  # names scatter over the window
    assert spread_offset("s1", 0) == timedelta(0)


def test_preview_gives_real_fire_times():
    timing = cron("30 2 * * *", "Europe/Berlin")
    offset = spread_offset("nightly", 600)
    fires = preview(timing, "nightly", 600, utc(2026, 3, 27, 12), 3)
    assert [f.slot for f in fires] == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0),
                                       utc(2026, 3, 30, 0, 30)]
    assert [f.fire_at - f.slot for f in fires] == [offset] * 3
    assert fires[1].note == "dst_shifted"
    assert fires[1].local.utcoffset() == timedelta(hours=2)
    skip = preview(cron("30 2 * * *", "Europe/Berlin", gap=DstGap.SKIP), "x", 0,
                   utc(2026, 3, 27, 12), 2)
    assert [f.slot.day for f in skip] == [28, 30]


def test_slot_key_is_name_and_utc_iso():
    berlin = datetime(2026, 3, 29, 3, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert slot_key("nightly", berlin) == "nightly:2026-03-29T01:00:00Z"


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Europe/Dublin",
         "Pacific/Chatham", "America/Sao_Paulo"]


def transitions(tz, year):
    zone = ZoneInfo(tz)
    t = utc(year, 1, 1)
    offset = t.astimezone(zone).utcoffset()
    while t.year == year:
        t += timedelta(hours=1)
        now_offset = t.astimezone(zone).utcoffset()
        if now_offset != offset:
            yield t
            offset = now_offset


def test_every_transition_against_brute_force():
    """Around every offset change of 2024-2026 in six zones (30- and 45-minute offsets,
    Dublin's negative DST, Sao Paulo's abolished DST): with dst_fold='twice' the slots are
    exactly the minutes whose local wall time matches the cron, plus one shifted instant per
    gap that swallowed some; with 'once', the second occurrences are dropped."""
    # The cron expressions, as plain predicates on a local wall time (the oracle).
    exprs = {"*/15 * * * *": lambda w: w.minute % 15 == 0,
             "30 2 * * *": lambda w: (w.hour, w.minute) == (2, 30),
             "45 1 * * *": lambda w: (w.hour, w.minute) == (1, 45)}
    checked = 0
    for tz in ZONES:
        zone = ZoneInfo(tz)
        for year in (2024, 2025, 2026):
            for change in transitions(tz, year):
                start, end = change - timedelta(hours=4), change + timedelta(hours=4)
                for expr, matches in exprs.items():
                    twice = cron(expr, tz, fold=DstFold.TWICE)
                    got = []
                    for s in slots_after(twice, start):
                        if s.at > end:
                            break
                        got.append(s)
                    minutes = [start + timedelta(minutes=m) for m in range(1, 8 * 60 + 1)]
                    matching = [m for m in minutes if matches(m.astimezone(zone))]
                    shifted = {s.at for s in got if s.note == "dst_shifted"}
                    assert [s.at for s in got] == sorted(set(matching) | shifted), (
                        tz, expr, change)
                    assert not shifted & set(matching)  # a real time keeps its own note
                    assert all(a.at < b.at for a, b in pairwise(got))
                    for s in got:
                        if s.note == "dst_shifted":  # lands where the offset changes
                            before = (s.at - timedelta(seconds=1)).astimezone(zone).utcoffset()
                            assert before != s.at.astimezone(zone).utcoffset()
                    once = []
                    for s in slots_after(cron(expr, tz), start):
                        if s.at > end:
                            break
                        once.append(s)
                    assert [s.at for s in once] == [s.at for s in got
                                                    if s.note != "dst_second"]
                    checked += 1
    assert checked >= 90


def test_slots_stop_at_the_end_of_the_calendar():
    # A schedule stored with its slots near the year 9999 (before start= was bounded): the
    # slots end with the calendar, and a preview lists those there are, not an error.
    last = Timing(None, timedelta(days=366), utc(9999, 12, 31), "UTC")
    assert [s.at for s in take(last, utc(2026, 1, 1), 3)] == [utc(9999, 12, 31)]
    assert take(cron("0 * * * *"), utc(9999, 12, 31, 22), 5) == []
    assert len(preview(last, "far", 0, utc(2026, 1, 1), 5)) == 1


def test_a_cron_whose_next_slot_is_past_the_year_9999_ends_too():
    # croniter builds the year 10000 with datetime(), which raises ValueError ("year 10000
    # is out of range"), not OverflowError: a leap-day cron after the last leap year.
    assert take(cron("0 0 29 2 *"), utc(9996, 3, 1), 3) == []
    assert preview(cron("0 0 29 2 *"), "leap", 0, utc(9996, 3, 1), 3) == []
    # A cron that can never fire still says so (croniter's error is a ValueError too).
    import pytest
    from croniter import CroniterBadDateError
    with pytest.raises(CroniterBadDateError):
        take(cron("0 0 31 2 *"), utc(2026, 1, 1), 1)


def _nearest_weekday(year: int, month: int, day: int) -> date:
    """The weekday (Mon-Fri) nearest `day` of the month, never in another month; a day past
    the month's end stands for its last day (croniter's reading: 30W fires in February)."""
    last = calendar.monthrange(year, month)[1]
    d = date(year, month, min(day, last))
    if d.weekday() == 5:  # Saturday: the Friday before, or the Monday after the 1st
        return d - timedelta(days=1) if d.day > 1 else d + timedelta(days=2)
    if d.weekday() == 6:  # Sunday: the Monday after, or the Friday before the last day
        return d + timedelta(days=1) if d.day < last else d - timedelta(days=2)
    return d


def test_w_fires_on_the_nearest_weekday_in_every_month():
    """Four years of W slots against the rule: `30W` in February (no 30th) is the weekday
    nearest its last day, `1W` on a Saturday the 1st is Monday the 3rd, never a day of the
    month before."""
    for day in (1, 15, 28, 29, 30, 31):
        slots = take(cron(f"0 9 {day}W * *"), utc(2025, 12, 31, 23), 48)
        assert [s.at.date() for s in slots] == [
            _nearest_weekday(2026 + i // 12, i % 12 + 1, day) for i in range(48)], day
        assert all(s.at.hour == 9 and s.at.weekday() < 5 for s in slots)
    february = [s.at.date() for s in take(cron("0 0 30W * *"), utc(2027, 1, 31), 1)]
    assert february == [date(2027, 2, 26)]  # the 28th is a Sunday, the 27th a Saturday
    assert next_slot(cron("0 0 1W * *"), utc(2026, 7, 31)).at == utc(2026, 8, 3)  # Sat 1st
    # In a zone, on local dates: 31W in Berlin, May 2026 ends on a Sunday
    assert local(next_slot(cron("0 9 31W * *", "Europe/Berlin"), utc(2026, 5, 2)),
                 "Europe/Berlin") == "05-29 09:00+0200"
