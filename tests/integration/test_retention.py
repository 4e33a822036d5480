"""The timer's retention loop (timer_service/retention.py) against the real Postgres, one
pass at a time with a pinned clock: day partitions made ahead, days dropped whole past
each state's retention with their keys, finished rows left in tock_jobs moved in batches,
DEFAULT partitions adopted and swept, workers and audit records pruned, several timers
sharing the work, and a DDL that never queues writers behind it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, time, timedelta

import pytest

from shared.core.states import AttemptOutcome, JobState
from shared.store import Database
from shared.store.retention_store import RetentionStore
from shared.store.rows import AttemptResult
from tests.integration.store.helpers import (
    add_finished,
    add_job,
    add_running,
    attempt_sides,
    day_table,
    insert_row,
    keys,
    side_of,
)
from timer_service.retention import Retention

DAY = timedelta(days=1)
HOURS = {JobState.SUCCEEDED: 168, JobState.DEAD: 720, JobState.CANCELLED: 168}


def make_loop(database: Database, batch_size: int = 3) -> Retention:
    return Retention(RetentionStore(database), retention_hours=HOURS, workers_hours=24,
                     audit_hours=720, batch_size=batch_size, interval_seconds=60)


@pytest.fixture
def loop(database) -> Retention:
    return make_loop(database)


@pytest.fixture
def t0(now) -> datetime:
    """Noon (UTC) five days from now: a day with no partition yet."""
    return datetime.combine((now + 5 * DAY).astimezone(UTC).date(), time(12), UTC)


def _tables(db, like: str) -> set[str]:
    return {r[0] for r in db.execute("SELECT relname FROM pg_class WHERE relname LIKE %s",
                                     (like,))}


def _finish_one_of_each(job_store, db, at: datetime) -> dict[str, int]:
    """A succeeded, a dead and a cancelled job, each with a key, finished at `at`."""
    ok, dead = add_running(db, at, unique_key="ok"), add_running(db, at, unique_key="dead")
    job_store.finish_attempts([
        AttemptResult(ok, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
        AttemptResult(dead, JobState.DEAD, AttemptOutcome.PERMANENT, error="no")], "w1",
        now=at)
    cancelled = add_job(db, run_at=at, unique_key="cancelled")
    job_store.cancel_job(cancelled, now=at)
    return {"succeeded": ok.job_id, "dead": dead.job_id, "cancelled": cancelled}


def test_partitions_are_made_ahead_once(loop, db, t0):
    report = loop.run_pass(t0)
    assert report.created == 9
    for state in ("succeeded", "dead", "cancelled"):
        for n in range(3):
            day = t0 + n * DAY
            assert _tables(db, day_table("tock_history_jobs", state, day))
            assert _tables(db, day_table("tock_history_attempts", state, day))
    assert not _tables(db, day_table("tock_history_jobs", "dead", t0 - DAY)), \
        "no day behind today without rows for it"
    assert loop.run_pass(t0).created == 0
    assert loop.run_once(t0) == 0, "nothing left to do at once"


def test_a_day_is_dropped_whole_past_its_states_retention_with_its_keys(
        loop, job_store, client, db, t0):
    loop.run_pass(t0)
    jobs = _finish_one_of_each(job_store, db, t0)
    assert {s: side_of(db, j) for s, j in jobs.items()} == {
        s: day_table("tock_history_jobs", s, t0) for s in jobs}
    # 7 days later the day is still within 168 h (it is dropped once it has *ended* that
    # long ago), so the key still finds its job.
    loop.run_pass(t0 + 7 * DAY)
    assert side_of(db, jobs["succeeded"]) is not None
    assert client.schedule("again", key="ok").id == jobs["succeeded"]

    report = loop.run_pass(t0 + 8 * DAY)
    assert (report.expired, report.keys_freed, report.dropped) == (2, 2, 2)
    assert side_of(db, jobs["succeeded"]) is None and side_of(db, jobs["cancelled"]) is None
    assert attempt_sides(db, jobs["succeeded"]) == []
    assert side_of(db, jobs["dead"]) == day_table("tock_history_jobs", "dead", t0)
    assert keys(db) == {"dead": jobs["dead"]}
    assert _tables(db, "tock_expired_%") == set()
    fresh = client.schedule("again", key="ok")
    assert fresh.created and fresh.id != jobs["succeeded"], "the key is free again"
    assert client.schedule("again", key="dead").id == jobs["dead"], "dead: kept 720 h"

    loop.run_pass(t0 + 31 * DAY)
    assert side_of(db, jobs["dead"]) is None
    assert "dead" not in keys(db)


def test_keys_of_an_expired_day_are_freed_in_batches(loop, db, t0):
    loop.run_pass(t0)
    held = [add_finished(db, state="succeeded", finished_at=t0, unique_key=f"k{i}")
            for i in range(7)]
    report = loop.run_pass(t0 + 8 * DAY)  # batches of 3: 3 + 3 + 1 keys, then the drop
    assert report.keys_freed == 7 and report.dropped == report.expired
    assert keys(db) == {} and side_of(db, held[0]) is None
    assert _tables(db, "tock_expired_%") == set()


def test_finished_rows_left_in_tock_jobs_move_in_batches(loop, db, now):
    within = [add_job(db, run_at=now, state=s, finished_at=now - DAY, unique_key=f"w{i}")
              for i, s in enumerate(["succeeded", "dead", "cancelled"] * 3)]
    past = add_job(db, run_at=now, state="succeeded", finished_at=now - 20 * DAY,
                   unique_key="past")
    insert_row(db, "tock_attempts", job_id=past, attempt=1, finished_at=now - 20 * DAY,
               outcome="succeeded")
    unfinished = add_job(db, run_at=now, unique_key="u")
    db.execute("DELETE FROM tock_keys")  # as before migration 0007
    report = loop.run_pass(now)
    assert (report.moved, report.deleted) == (9, 1)
    yesterday = {s: day_table("tock_history_jobs", s, now - DAY)
                 for s in ("succeeded", "dead", "cancelled")}
    assert {side_of(db, j) for j in within} == set(yesterday.values()), \
        "the day partitions of their finish were made first"
    assert side_of(db, past) is None and attempt_sides(db, past) == []
    assert side_of(db, unfinished) == "hot"
    assert keys(db) == {f"w{i}": j for i, j in enumerate(within)}


def test_a_pass_is_bounded_and_asks_for_the_next_at_once(database, db, now):
    from timer_service.retention import BATCHES_PER_PASS

    for _ in range(2 * BATCHES_PER_PASS + 1):
        add_job(db, run_at=now, state="succeeded", finished_at=now)
    loop = make_loop(database, batch_size=2)
    report = loop.run_pass(now)
    assert (report.moved, report.more) == (2 * BATCHES_PER_PASS, True)
    assert loop.run_once(now) == 0, "the rest fits in one batch"
    assert db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 0


def test_default_rows_are_adopted_by_their_day_or_swept_past_retention(
        loop, job_store, db, t0):
    lease = add_running(db, t0)
    job_store.finish_attempts([AttemptResult(lease, JobState.SUCCEEDED,
                                             AttemptOutcome.SUCCEEDED)], "w1", now=t0)
    assert side_of(db, lease.job_id) == "tock_history_jobs_succeeded_default"
    old = add_finished(db, state="dead", finished_at=t0 - 100 * DAY, unique_key="old")
    report = loop.run_pass(t0)
    assert side_of(db, lease.job_id) == day_table("tock_history_jobs", "succeeded", t0)
    assert report.swept == 1 and side_of(db, old) is None and keys(db) == {}


def test_workers_and_audit_records_are_pruned(loop, db, schedule_store, now):
    from shared.schedules.spec import make_spec
    from shared.store.rows import Cursor

    insert_row(db, "tock_workers", id="gone", host="h", pid=1, queues=["q"], concurrency=1,
               started_at=now - 3 * DAY, last_heartbeat=now - 2 * DAY)
    insert_row(db, "tock_workers", id="here", host="h", pid=2, queues=["q"], concurrency=1,
               started_at=now, last_heartbeat=now)
    schedule_store.insert(make_spec("s", "k", every=60), Cursor(now, now, now), now)
    for age in (31, 1):
        insert_row(db, "tock_schedule_audit", schedule="s", reason="missed", first_slot=now,
                   last_slot=now, slot_count=1, recorded_at=now - age * DAY)
    report = loop.run_pass(now)
    assert (report.workers, report.audit) == (1, 1)
    assert [r[0] for r in db.execute("SELECT id FROM tock_workers")] == ["here"]


def test_locked_rows_are_skipped_and_nothing_waits(loop, db, other, now):
    busy = add_job(db, run_at=now, state="dead", finished_at=now)
    free = add_job(db, run_at=now, state="dead", finished_at=now)
    due = add_job(db, run_at=now)
    # Another timer holds one finished row, and a dispatch holds the due one.
    other.execute("SELECT 1 FROM tock_jobs WHERE id = ANY(%s) FOR UPDATE", ([busy, due],))
    report = loop.run_pass(now)
    assert report.moved == 1
    assert side_of(db, busy) == "hot" and side_of(db, free) != "hot"
    other.rollback()
    assert loop.run_pass(now).moved == 1


def test_ddl_gives_up_at_once_when_readers_hold_the_parent(loop, job_store, db, other, t0):
    loop.run_pass(t0)
    jobs = _finish_one_of_each(job_store, db, t0)
    other.execute("SELECT count(*) FROM tock_history_jobs_succeeded")  # holds ACCESS SHARE
    report = loop.run_pass(t0 + 8 * DAY)  # waits at most the DDL lock timeout (1 s)
    assert side_of(db, jobs["succeeded"]) is not None, "not detached while read"
    assert report.expired <= 1
    other.rollback()
    loop.run_pass(t0 + 8 * DAY)
    assert side_of(db, jobs["succeeded"]) is None and side_of(db, jobs["cancelled"]) is None


def test_two_timers_share_the_work(database_url, db, now):
    ids = [add_job(db, run_at=now, state="succeeded", finished_at=now, unique_key=f"k{i}")
           for i in range(300)]
    errors: list[BaseException] = []
    pools = [Database(database_url, max_size=2, name=f"tock-retention-{n}") for n in range(2)]
    barrier = threading.Barrier(2)

    def run(pool: Database) -> None:
        try:
            barrier.wait()
            loop = make_loop(pool, batch_size=10)
            while loop.run_once(now):
                pass
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in pools]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for p in pools:
        p.close()
    assert not errors, errors
    assert db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 0
    assert db.execute("SELECT count(*), count(DISTINCT id) FROM tock_history_jobs"
                      ).fetchone() == (300, 300)
    assert keys(db) == {f"k{i}": j for i, j in enumerate(ids)}


def test_the_timer_runs_retention_as_one_of_its_loops(timer_settings, transport):
    from timer_service.service import Timer

    timer = Timer(timer_settings.model_copy(update={"retention_interval_seconds": 5}),
                  transport)
    try:
        assert timer.retention in timer.supervisor.loops
        assert timer.retention.idle_seconds == 5
        assert timer.retention.retention == {s: timedelta(hours=h) for s, h in HOURS.items()}
    finally:
        timer.close()
