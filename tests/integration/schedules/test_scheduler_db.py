"""The scheduler step against Postgres with an injected clock, without SQS: DST nights in
Berlin, the per-timer cap on fires per second, paused schedules."""

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from shared.core.errors import InvalidInput
from shared.schedules.slots import slot_key
from shared.store.rows import SlotJob
from timer_service.scheduler import Scheduler

S = timedelta(seconds=1)


def keys(db, name):
    return [r[0] for r in db.execute(
        "SELECT unique_key FROM tock_jobs WHERE schedule_name = %s ORDER BY run_at, id",
        (name,)).fetchall()]


def walk(scheduler, start, end, step):
    now = start
    while now <= end:
        scheduler.step(now)
        now += step


def test_berlin_fall_back_night_once_and_twice(client, db, schedule_store):
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    client.recurring("half-hourly-once", "report", cron="*/30 * * * *", tz="Europe/Berlin",
                     now=start)
    client.recurring("half-hourly-twice", "report", cron="*/30 * * * *", tz="Europe/Berlin",
              dst_fold="twice", now=start)
    walk(Scheduler(schedule_store, lookahead_seconds=0), start, start + timedelta(hours=4),
         timedelta(minutes=5))
    half_hours = [start + timedelta(minutes=30 * k) for k in range(1, 9)]
    assert keys(db, "half-hourly-twice") == [slot_key("half-hourly-twice", s) for s in half_hours]
    # 02:00 and 02:30 CET (01:00Z, 01:30Z) are the second occurrences: not slots with `once`.
    once = [s for s in half_hours if s.hour != 1]
    assert keys(db, "half-hourly-once") == [slot_key("half-hourly-once", s) for s in once]
    assert db.execute("SELECT count(*) FROM tock_schedule_audit").fetchone()[0] == 0


def test_berlin_spring_forward_night_shift_and_skip(client, db, schedule_store):
    start = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)
    client.recurring("shifted", "report", cron="30 2 * * *", tz="Europe/Berlin",
              now=start)
    client.recurring("skipped", "report", cron="30 2 * * *", tz="Europe/Berlin",
                     dst_gap="skip", now=start)
    walk(Scheduler(schedule_store, lookahead_seconds=0), start, start + timedelta(hours=4),
         timedelta(minutes=5))
    assert keys(db, "shifted") == ["shifted:2026-03-29T01:00:00Z"]  # 03:00 CEST
    assert keys(db, "skipped") == []
    (event,) = client.schedule_history("skipped")
    assert (event.reason, event.first_slot, event.slot_count) == (
        "dst_nonexistent", datetime(2026, 3, 29, 1, 0, tzinfo=UTC), 1)


def test_cap_on_fires_per_second_moves_runs_later_and_drops_none(client, db, schedule_store):
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    for i in range(5):
        client.recurring(f"herd-{i}", "report", cron="0 * * * *", now=t0)
    slot = t0 + timedelta(hours=1)
    made = Scheduler(schedule_store, lookahead_seconds=0, max_fires_per_second=2).step(slot)
    assert made == 5
    run_ats = [r[0] for r in db.execute("SELECT run_at FROM tock_jobs").fetchall()]
    assert Counter(run_ats) == {slot: 2, slot + S: 2, slot + 2 * S: 1}


def test_paused_schedule_does_not_fire_and_resumes_at_the_next_slot(client, db, schedule_store):
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    client.recurring("tick", "report", every=60, now=t0)
    scheduler = Scheduler(schedule_store, lookahead_seconds=0)
    client.pause_schedule("tick", now=t0)
    assert scheduler.step(t0 + 5 * 60 * S) == 0
    client.resume_schedule("tick", now=t0 + 5 * 60 * S + 10 * S)
    assert scheduler.step(t0 + 6 * 60 * S) == 1
    assert keys(db, "tick") == ["tick:2026-06-01T12:06:00Z"]
    (event,) = client.schedule_history("tick")
    assert (event.reason, event.slot_count) == ("paused", 5)


def test_a_broken_row_does_not_stop_the_other_schedules(client, db, schedule_store, caplog):
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    client.recurring("good", "report", every=3600, now=t0)
    client.recurring("broken", "report", cron="0 * * * *", now=t0)
    # As if a tzdata upgrade dropped the zone the schedule was stored with.
    db.execute("UPDATE tock_schedules SET tz = 'Gone/Away' WHERE name = 'broken'")
    assert Scheduler(schedule_store, lookahead_seconds=0).step(t0 + timedelta(hours=1)) == 1
    assert keys(db, "good") == ["good:2026-06-01T13:00:00Z"]
    assert "schedule_plan_failed" in caplog.text


def test_a_run_key_a_producer_cannot_take_any_more_is_refused_at_schedule(client, db):
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    client.recurring("tick", "report", every=60, now=t0)
    taken = slot_key("tick", t0 + 60 * S)
    with pytest.raises(InvalidInput, match="has the form of a schedule's run key"):
        client.schedule("email", key=taken)
    with pytest.raises(InvalidInput, match=r"job #1: key .* run key"):
        client.schedule_many([{"kind": "email"}, {"kind": "email", "key": taken}])
    assert db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 0
    client.schedule("email", key="tick:2026-06-01T12:01:00+00:00")  # another form: fine


def test_a_slot_whose_run_key_another_job_holds_is_audited_not_dropped_in_silence(
        client, db, schedule_store, caplog):
    """A producer of an earlier version could take a schedule's run key with `key=`: the
    timer's insert then makes nothing, which must leave the record every slot not run
    leaves, not pass for another timer's run of it."""
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    client.recurring("tick", "report", every=60, now=t0)
    slot = t0 + 60 * S
    db.execute("INSERT INTO tock_jobs (kind, queue, payload, run_at, unique_key) "
               "VALUES ('email', 'default', '{}', %s, %s)", (t0 + 3600 * S, slot_key("tick", slot)))
    holder = db.execute("SELECT id FROM tock_jobs").fetchone()[0]
    scheduler = Scheduler(schedule_store, lookahead_seconds=0)
    assert scheduler.step(slot) == 0
    assert scheduler.step(slot + 60 * S) == 1, "the next slot is the schedule's own"
    (event,) = client.schedule_history("tick")
    assert (event.reason, event.first_slot, event.slot_count) == ("key_taken", slot, 1)
    assert f"job {holder}, not a run of this schedule" in event.detail
    assert "schedule_slots_not_run" in caplog.text
    # A slot made by another timer is the de-duplication working: nothing recorded.
    client.recurring("tock", "report", every=60, now=t0)
    other = Scheduler(schedule_store, lookahead_seconds=0)
    schedule_store.insert_slot_jobs([SlotJob("tock", slot, slot_key("tock", slot))])
    other.step(slot)
    assert client.schedule_history("tock") == []
