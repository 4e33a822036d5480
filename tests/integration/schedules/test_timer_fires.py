"""The timer turning slots into jobs, against real Postgres and SQS, under an injected clock:
slot boundaries, the slot reaching the handler, an outage of hours, overlap, a crash
between the job insert and the cursor update, and three timers racing."""

import threading
from datetime import UTC, datetime, timedelta

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.schedules.slots import slot_key
from tests.support.dashboard import run_to
from timer_service.service import Timer

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)


def make_timer(timer_settings, transport, lookahead=0.0):
    timer = Timer(timer_settings, transport)
    timer.scheduler.lookahead = timedelta(seconds=lookahead)
    return timer


def jobs(db, name):
    return db.execute(
        "SELECT unique_key, run_at, state FROM tock_jobs WHERE schedule_name = %s "
        "ORDER BY run_at, id", (name,)).fetchall()


def test_slot_boundary_and_the_handler_sees_its_slot(client, db, transport, timer_settings,
                                                     consumer_settings):
    client.recurring("tick", "report", {"n": 1}, every=60, now=T0)
    timer = make_timer(timer_settings, transport)
    slot = T0 + 60 * S
    assert timer.run_once(now=slot - MS).fired == 0
    result = timer.run_once(now=slot)
    assert (result.fired, result.dispatched) == (1, 1)
    assert timer.run_once(now=slot + 30 * S).fired == 0  # the same slot never fires twice
    assert jobs(db, "tick") == [("tick:2026-06-01T12:01:00Z", slot, "dispatched")]

    seen = []
    registry = Registry()
    registry.add("report", lambda payload, ctx: seen.append((payload, ctx.scheduled_at, ctx.key)))
    consumer = Consumer(consumer_settings, registry, transport)
    consumer.open()
    assert consumer.receive_once("default", wait_seconds=5) == 1
    consumer.executor.run(consumer.pipe.work.get_nowait())
    assert consumer.complete_pending() == 1
    assert seen == [({"n": 1}, slot, "tick:2026-06-01T12:01:00Z")]
    timer.close()
    consumer.close()


def test_lookahead_makes_the_job_before_its_slot(client, db, transport, timer_settings):
    client.recurring("tick", "report", every=60, now=T0)
    timer = make_timer(timer_settings, transport, lookahead=1.0)
    result = timer.run_once(now=T0 + 59.5 * S)
    assert (result.fired, result.dispatched) == (1, 0)  # made, not yet due
    assert jobs(db, "tick") == [("tick:2026-06-01T12:01:00Z", T0 + 60 * S, "scheduled")]
    timer.close()


def test_outage_of_hours_skip_records_missed_slots_and_runs_the_next(client, db, transport,
                                                                      timer_settings):
    client.recurring("tick", "report", every=60, misfire="skip", now=T0)
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=T0 + 60 * S).fired == 1
    back = T0 + timedelta(hours=4, seconds=90)  # every timer down from 12:01 to 16:01:30
    assert timer.run_once(now=back).fired == 1  # 16:01 is 30 s late: within the grace
    keys = [k for k, _, _ in jobs(db, "tick")]
    assert keys == ["tick:2026-06-01T12:01:00Z", "tick:2026-06-01T16:01:00Z"]
    (event,) = client.schedule_history("tick")
    assert (event.reason, event.slot_count) == ("missed", 239)
    assert (event.first_slot, event.last_slot) == (T0 + 2 * 60 * S, T0 + timedelta(hours=4))
    assert timer.run_once(now=back + 30 * S).fired == 1  # 16:02 on time
    timer.close()


def test_outage_with_misfire_all_backfills_spread_out(client, db, transport, timer_settings):
    client.recurring("hourly", "report", cron="0 * * * *", misfire="all", backfill_max=3,
              backfill_gap=30, now=T0)
    timer = make_timer(timer_settings, transport)
    back = T0 + timedelta(hours=5, minutes=10)
    assert timer.run_once(now=back).fired == 3
    rows = jobs(db, "hourly")
    assert [k for k, _, _ in rows] == [slot_key("hourly", T0 + timedelta(hours=h))
                                       for h in (3, 4, 5)]
    assert [r for _, r, _ in rows] == [back, back + 30 * S, back + 60 * S]
    (event,) = client.schedule_history("hourly")
    assert (event.reason, event.slot_count) == ("missed", 2)
    timer.close()


def finish(db, key):
    db.execute("UPDATE tock_jobs SET state = 'succeeded', finished_at = now() "
               "WHERE unique_key = %s", (key,))


def test_overlap_skip_with_a_run_still_going(client, db, transport, timer_settings):
    client.recurring("sync", "report", every=60, overlap="skip", now=T0)
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=T0 + 60 * S).fired == 1
    db.execute("UPDATE tock_jobs SET state = 'running' WHERE schedule_name = 'sync'")
    assert timer.run_once(now=T0 + 120 * S).fired == 0
    (event,) = client.schedule_history("sync")
    assert (event.reason, event.first_slot) == ("overlap_skipped", T0 + 120 * S)
    finish(db, slot_key("sync", T0 + 60 * S))
    assert timer.run_once(now=T0 + 180 * S).fired == 1
    timer.close()


def test_overlap_buffer_one_runs_the_newest_waiting_slot_when_the_run_ends(
        client, db, transport, timer_settings):
    client.recurring("sync", "report", every=60, overlap="buffer_one", now=T0)
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=T0 + 60 * S).fired == 1
    assert timer.run_once(now=T0 + 120 * S).fired == 0
    assert timer.run_once(now=T0 + 180 * S).fired == 0  # 12:03 replaces 12:02 in the buffer
    finish(db, slot_key("sync", T0 + 60 * S))
    assert timer.run_once(now=T0 + 190 * S).fired == 1
    assert [k for k, _, _ in jobs(db, "sync")] == [slot_key("sync", T0 + 60 * S),
                                                   slot_key("sync", T0 + 180 * S)]
    (event,) = client.schedule_history("sync")
    assert (event.reason, event.first_slot) == ("overlap_replaced", T0 + 120 * S)
    timer.close()


def test_a_buffered_slot_runs_when_a_run_longer_than_the_grace_ends(
        client, db, transport, timer_settings):
    # every=10 s, grace 3 s, the first run still going at the next slot and 5 s past it:
    # the slot it held back is judged late from the run's end (the timers never were
    # away), so it runs; it was dropped as "missed" before.
    start = db.execute("SELECT now() - interval '25 s'").fetchone()[0]
    client.recurring("long", "report", every=10, overlap="buffer_one", misfire_grace=3,
                     start=start, now=start)
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=start + 10 * S).fired == 1
    assert timer.run_once(now=start + 20 * S).fired == 0  # 20 s waits in the buffer
    (first,) = db.execute("SELECT id FROM tock_jobs WHERE unique_key = %s",
                          (slot_key("long", start + 10 * S),)).fetchone()
    run_to(db, first, "succeeded")  # about 25 s: 5 s past the buffered slot
    (ended,) = db.execute("SELECT finished_at FROM tock_history_jobs WHERE id = %s",
                          (first,)).fetchone()
    assert ended - (start + 20 * S) > 3 * S
    assert timer.run_once(now=ended + 500 * MS).fired == 1
    assert slot_key("long", start + 20 * S) in [k for k, _, _ in jobs(db, "long")]
    assert client.schedule_history("long") == []
    timer.close()


def test_a_grace_of_zero_still_runs_the_slots_a_healthy_timer_reaches(
        client, db, transport, timer_settings):
    # skip/buffer_one slots are decided when they come, by the first pass after (one every
    # half lookahead): with misfire_grace=0 each was recorded "missed" by a timer that was up.
    for name, overlap in (("skip", "skip"), ("buffer", "buffer_one"), ("allow", "allow")):
        client.recurring(name, "report", every=2, overlap=overlap, misfire="skip",
                         misfire_grace=0, now=T0)
    timer = make_timer(timer_settings, transport, lookahead=1.0)  # a pass every 0.5 s
    assert timer.run_once(now=T0 + 2 * S + 400 * MS).fired == 3
    for name in ("skip", "buffer", "allow"):
        assert client.schedule_history(name) == [], name
    # An outage is still one: every timer away for 2 s, past grace and pass, misses 4 s.
    timer.run_once(now=T0 + 6 * S + 100 * MS)
    missed = [e.first_slot for e in client.schedule_history("allow") if e.reason == "missed"]
    assert missed == [T0 + 4 * S]
    timer.close()


def test_a_slot_buffered_before_a_pause_does_not_run_after_the_resume(
        client, db, transport, timer_settings):
    client.recurring("sync", "report", every=60, overlap="buffer_one", now=T0)
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=T0 + 60 * S).fired == 1
    assert timer.run_once(now=T0 + 120 * S).fired == 0  # 12:02 waits in the buffer
    client.pause_schedule("sync", now=T0 + 125 * S)
    finish(db, slot_key("sync", T0 + 60 * S))  # the run ends while the schedule is paused
    assert timer.run_once(now=T0 + 300 * S).fired == 0
    client.resume_schedule("sync", now=T0 + 610 * S)
    # Not 12:02, ten minutes stale: the first slot after the resume, 12:11.
    assert timer.run_once(now=T0 + 611 * S).fired == 0
    assert timer.run_once(now=T0 + 660 * S).fired == 1
    assert [k for k, _, _ in jobs(db, "sync")] == [slot_key("sync", T0 + 60 * S),
                                                   slot_key("sync", T0 + 660 * S)]
    dropped = [e for e in client.schedule_history("sync") if e.first_slot == T0 + 120 * S]
    assert [(e.reason, e.slot_count) for e in dropped] == [("paused", 1)]
    timer.close()


def test_overlap_is_judged_when_the_slot_comes_not_a_lookahead_before(
        client, db, transport, timer_settings):
    """A 2 s schedule whose runs take 1.5 s never overlaps: a timer pass half a second before
    the next slot (its lookahead of 1 s reaching that slot) must not skip or buffer it as
    'an earlier run had not finished' when it will have, by the time the slot comes."""
    for name, overlap in (("skip", "skip"), ("buffer", "buffer_one")):
        client.recurring(name, "report", every=2, overlap=overlap, now=T0)
    timer = make_timer(timer_settings, transport, lookahead=1.0)
    first = T0 + 2 * S
    assert timer.run_once(now=first).fired == 2
    db.execute("UPDATE tock_jobs SET state = 'running' WHERE schedule_name IS NOT NULL")
    timer.run_once(now=first + 1500 * MS)  # the next slot is within the lookahead
    for name in ("skip", "buffer"):
        finish(db, slot_key(name, first))  # the runs end before the next slot
    assert timer.run_once(now=first + 2 * S).fired == 2
    for name in ("skip", "buffer"):
        keys = [k for k, _, _ in jobs(db, name)]
        assert keys == [slot_key(name, first), slot_key(name, first + 2 * S)], name
        assert client.schedule_history(name) == [], name
    (run_at,) = db.execute("SELECT run_at FROM tock_jobs WHERE unique_key = %s",
                           (slot_key("skip", first + 2 * S),)).fetchone()
    assert run_at == first + 2 * S
    timer.close()


def test_a_job_made_before_a_crash_is_not_made_again(client, db, transport, timer_settings):
    """The state a crash between the two writes would leave, were they not one transaction:
    the slot's job exists, the cursor has not moved. One pass: still one job, cursor moves."""
    client.recurring("tick", "report", every=60, now=T0)
    slot = T0 + 60 * S
    db.execute("INSERT INTO tock_jobs (kind, run_at, unique_key, schedule_name) "
               "VALUES ('report', %s, %s, 'tick')", (slot, slot_key("tick", slot)))
    timer = make_timer(timer_settings, transport)
    assert timer.run_once(now=slot).fired == 0
    assert len(jobs(db, "tick")) == 1
    cursor, next_slot = db.execute(
        "SELECT cursor_at, next_slot FROM tock_schedules WHERE name = 'tick'").fetchone()
    assert (cursor, next_slot) == (slot, slot + 60 * S)
    timer.close()


def test_three_timers_racing_make_exactly_one_job_per_slot(client, db, transport,
                                                           timer_settings):
    client.recurring("every-1s", "report", every=1, now=T0)
    client.recurring("every-7s", "report", every=7, start=T0, now=T0)
    client.recurring("cron-3s", "report", cron="*/3 * * * * *", tz="Europe/Berlin",
              now=T0)
    client.recurring("spread", "report", every=10, spread=5, now=T0)
    timers = [make_timer(timer_settings, transport) for _ in range(3)]
    steps = 120
    barrier = threading.Barrier(3)
    fired = [0, 0, 0]
    errors = []

    def run(i):
        try:
            for step in range(1, steps + 1):
                barrier.wait(timeout=60)
                # Each timer's clock is a little off from the others', as on real hosts.
                fired[i] += timers[i].run_once(now=T0 + step * S + i * 150 * MS).fired
        except Exception as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    end = T0 + steps * S + 300 * MS
    expected = {
        "every-1s": [T0 + k * S for k in range(1, steps + 1)],
        "every-7s": [T0 + k * S for k in range(7, steps + 1, 7)],
        "cron-3s": [T0 + k * S for k in range(3, steps + 1, 3)],
        # Created at 12:00:00 with its offset still ahead, the 12:00:00 slot fires too.
        "spread": [T0 + k * S for k in range(0, steps + 1, 10)],
    }
    from shared.schedules.slots import spread_offset

    offset = spread_offset("spread", 5)
    expected["spread"] = [s for s in expected["spread"] if s + offset <= end]
    for name, slots in expected.items():
        keys = [k for k, _, _ in jobs(db, name)]
        assert keys == [slot_key(name, s) for s in slots], name
    total = sum(len(v) for v in expected.values())
    assert sum(fired) == total
    assert db.execute("SELECT count(*) FROM tock_schedule_audit").fetchone()[0] == 0
    for timer in timers:
        timer.close()
