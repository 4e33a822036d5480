"""The policies as a pure function of (definition, state, now)."""

import random
from datetime import UTC, datetime, timedelta

from shared.schedules.policies import MAX_SCAN, ScheduleState, plan
from shared.schedules.slots import spread_offset
from shared.schedules.spec import make_spec

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def every(seconds=60, **kw):
    return make_spec(kw.pop("name", "tick"), "report", every=seconds, now=T0, **kw)


def test_on_time_slot_fires_with_run_at_the_slot():
    p = plan(every(60), ScheduleState(T0), T0 + 60 * S)
    assert [(f.slot, f.run_at, f.why) for f in p.fires] == [(T0 + 60 * S, T0 + 60 * S, "on_time")]
    assert p.cursor == T0 + 60 * S
    assert p.next_slot == T0 + 120 * S
    assert p.audits == []


def test_not_due_yet_fires_nothing_but_lookahead_makes_it_early():
    assert plan(every(60), ScheduleState(T0), T0 + 59 * S).fires == []
    early = plan(every(60), ScheduleState(T0), T0 + 59 * S, lookahead=S)
    assert [f.run_at for f in early.fires] == [T0 + 60 * S]


def test_late_within_grace_runs_and_is_not_a_misfire():
    p = plan(every(60), ScheduleState(T0), T0 + 60 * S + 59 * S)
    assert [f.why for f in p.fires] == ["late"]
    assert p.audits == []


def test_misfire_skip_after_an_outage_of_hours_records_every_missed_slot():
    # Down from 12:00 to 15:00:30; slots every minute.
    now = T0 + timedelta(hours=3, seconds=30)
    p = plan(every(60), ScheduleState(T0), now)
    assert [f.slot for f in p.fires] == [T0 + timedelta(hours=3)]  # 30 s late: within grace
    (audit,) = p.audits
    assert audit.reason == "missed"
    assert (audit.first_slot, audit.last_slot, audit.slot_count) == (
        T0 + 60 * S, T0 + timedelta(hours=3) - 60 * S, 179)
    assert p.next_slot == T0 + timedelta(hours=3, minutes=1)


def test_misfire_latest_runs_once_for_the_most_recent_missed_slot():
    hourly = make_spec("h", "report", cron="0 * * * *", misfire="latest", now=T0)
    now = T0 + timedelta(hours=3, minutes=20)
    p = plan(hourly, ScheduleState(T0), now)
    assert [(f.slot, f.why, f.run_at) for f in p.fires] == [
        (T0 + timedelta(hours=3), "misfire_latest", now)]
    (audit,) = p.audits
    assert (audit.first_slot, audit.last_slot, audit.slot_count) == (
        T0 + timedelta(hours=1), T0 + timedelta(hours=2), 2)


def test_misfire_all_backfills_capped_and_spread():
    spec = every(60, misfire="all", backfill_max=5, backfill_gap=10)
    now = T0 + timedelta(minutes=30, seconds=30)
    p = plan(spec, ScheduleState(T0), now)
    backfill = [f for f in p.fires if f.why == "backfill"]
    assert [f.slot for f in backfill] == [T0 + timedelta(minutes=m) for m in range(25, 30)]
    assert [f.run_at for f in backfill] == [now + i * 10 * S for i in range(5)]
    assert [f.why for f in p.fires if f.why != "backfill"] == ["late"]
    (audit,) = p.audits
    assert (audit.first_slot, audit.last_slot, audit.slot_count) == (
        T0 + 60 * S, T0 + timedelta(minutes=24), 24)
    assert "backfill_max=5" in audit.detail


def test_overlap_skip_and_buffer_one():
    state = ScheduleState(T0, has_active_run=True)
    skip = plan(every(60, overlap="skip"), state, T0 + 60 * S)
    assert skip.fires == []
    assert [(a.reason, a.first_slot) for a in skip.audits] == [("overlap_skipped", T0 + 60 * S)]

    buf = every(60, overlap="buffer_one")
    first = plan(buf, state, T0 + 60 * S)
    assert first.fires == [] and first.buffered_slot == T0 + 60 * S
    second = plan(buf, ScheduleState(first.cursor, first.buffered_slot, True), T0 + 120 * S)
    assert second.buffered_slot == T0 + 120 * S
    assert [(a.reason, a.first_slot) for a in second.audits] == [
        ("overlap_replaced", T0 + 60 * S)]
    released = plan(buf, ScheduleState(second.cursor, second.buffered_slot, False),
                    T0 + 150 * S)
    assert [(f.slot, f.why) for f in released.fires] == [(T0 + 120 * S, "buffered")]
    assert released.buffered_slot is None
    allow = plan(every(60), state, T0 + 60 * S)
    assert len(allow.fires) == 1


def test_a_buffered_slot_runs_when_a_run_longer_than_the_grace_ends():
    # every=10 s, grace 3 s, a run of 15 s: the slot it held back is 5 s past its time
    # when the run ends, yet the timers never were away; it runs then.
    buf = every(10, overlap="buffer_one", misfire_grace=3)
    ended = T0 + 25 * S
    freed = plan(buf, ScheduleState(T0 + 20 * S, T0 + 20 * S, False, released_at=ended),
                 ended + S / 2)
    assert [(f.slot, f.why) for f in freed.fires] == [(T0 + 20 * S, "buffered")]
    assert freed.audits == []
    # Freed, then every timer away past the grace: missed, as after any outage.
    stale = plan(buf, ScheduleState(T0 + 20 * S, T0 + 20 * S, False, released_at=ended),
                 ended + 4 * S)
    assert stale.fires == [] or all(f.slot != T0 + 20 * S for f in stale.fires)
    assert [(a.reason, a.first_slot) for a in stale.audits] == [("missed", T0 + 20 * S)]


def test_spread_and_jitter_place_the_run_inside_the_window():
    spec = every(3600, name="hourly-report", spread=600, jitter=30)
    offset = spread_offset("hourly-report", 600)
    slot = T0 + timedelta(hours=1)
    assert plan(spec, ScheduleState(T0), slot).fires == [] or offset == timedelta(0)
    p = plan(spec, ScheduleState(T0), slot + offset, rng=random.Random(7))
    (fire,) = p.fires
    assert fire.slot == slot
    assert slot + offset <= fire.run_at < slot + offset + 30 * S
    assert p.next_fire_at == slot + timedelta(hours=1) + offset


def test_dst_skip_is_audited():
    spec = make_spec("n", "report", cron="30 2 * * *", tz="Europe/Berlin", dst_gap="skip",
                     now=T0)
    cursor = datetime(2026, 3, 28, 12, tzinfo=UTC)
    p = plan(spec, ScheduleState(cursor), datetime(2026, 3, 29, 1, 0, 5, tzinfo=UTC))
    assert p.fires == []
    assert [(a.reason, a.slot_count) for a in p.audits] == [("dst_nonexistent", 1)]
    assert p.next_slot == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


def test_an_outage_longer_than_the_scan_limit_is_one_uncounted_range():
    now = T0 + timedelta(seconds=3 * MAX_SCAN)
    p = plan(every(1, misfire="latest", misfire_grace=0), ScheduleState(T0), now)
    assert [(f.slot, f.why) for f in p.fires] == [(now, "on_time")]
    (audit,) = p.audits
    assert audit.slot_count is None and audit.first_slot == T0 + S
    assert "not counted" in audit.detail
    assert p.cursor == now


def test_a_slot_buffered_before_an_outage_is_not_run_after_it():
    # Held back by an overlap, then every timer was away past the grace: running it at
    # the recovery, 86 s late, went against misfire='latest' (fault walkthrough).
    buf = every(2, overlap="buffer_one", misfire="latest")
    slot = T0 + 2 * S
    now = T0 + 88 * S  # 86 s past the buffered slot; the grace is 60 s
    p = plan(buf, ScheduleState(slot, slot, False), now)
    assert "buffered" not in [f.why for f in p.fires]
    stale = [a for a in p.audits if a.first_slot == slot]
    assert [(a.reason, a.slot_count) for a in stale] == [("missed", 1)]
    assert "overlap='buffer_one'" in stale[0].detail
    # The slots within the grace (T0+28 s to T0+88 s): the first runs, the last waits in
    # the buffer, and the 29 between replace one another there: one record, not 29.
    assert [(f.slot, f.why) for f in p.fires] == [(T0 + 28 * S, "late")]
    assert p.buffered_slot == now
    replaced = [(a.first_slot, a.last_slot, a.slot_count) for a in p.audits
                if a.reason == "overlap_replaced"]
    assert replaced == [(T0 + 30 * S, T0 + 86 * S, 29)]


def test_a_buffered_slot_within_the_grace_still_runs():
    buf = every(60, overlap="buffer_one")
    slot = T0 + 60 * S
    p = plan(buf, ScheduleState(slot, slot, False), slot + 30 * S)
    assert [(f.slot, f.why) for f in p.fires] == [(slot, "buffered")]
