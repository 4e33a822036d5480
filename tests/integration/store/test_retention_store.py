"""Conformance of `RetentionStore` (shared.store.retention_store / retention_sql) against the
real Postgres: the partition functions of migration 0007 (create with adoption from the
DEFAULT partition, expire), the DDL lock, moving finished rows out of tock_jobs, freeing
expired keys, sweeping DEFAULT partitions, pruning workers and audit records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.core.states import JobState
from shared.schedules.spec import make_spec
from shared.store.retention_sql import DDL_LOCK
from shared.store.retention_store import RetentionStore
from shared.store.rows import Cursor
from tests.integration.store.helpers import (
    add_finished,
    add_history_attempt,
    add_job,
    add_running,
    attempt_sides,
    count,
    insert_row,
    keys,
    run_blocked,
    secs,
    side_of,
)

DAY = timedelta(days=1)
FAR = datetime(2031, 5, 6, 12, 0, tzinfo=UTC)
"""A day with no partition: rows for it land in the DEFAULT partitions."""


@pytest.fixture
def store(database) -> RetentionStore:
    return RetentionStore(database)


def _exists(db, name: str) -> bool:
    return db.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def _bound(db, name: str) -> str:
    return db.execute("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = %s",
                      (name,)).fetchone()[0]


def test_database_now_is_pinned_or_the_database_clock(store, now):
    assert store.database_now(now) == now
    assert store.database_now() >= now


def test_try_ddl_lock_is_held_by_one_transaction_at_a_time(store, other):
    other.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
    with store.transaction() as tx:
        assert tx.try_ddl_lock() is False
    other.rollback()
    with store.transaction() as tx:
        assert tx.try_ddl_lock() is True


def test_ensure_partition_creates_the_day_and_adopts_its_default_rows(store, db):
    early = add_finished(db, state="dead", finished_at=FAR, unique_key="far")
    add_history_attempt(db, early, attempt=1, outcome="failed", finished_at=FAR)
    other_day = add_finished(db, state="dead", finished_at=FAR + DAY)
    assert side_of(db, early) == "tock_history_jobs_dead_default"
    with store.transaction() as tx:
        assert tx.ensure_partition(JobState.DEAD, FAR.date()) is True
    assert _bound(db, "tock_history_jobs_dead_p20310506") == (
        "FOR VALUES FROM ('2031-05-06 00:00:00+00') TO ('2031-05-07 00:00:00+00')")
    assert _exists(db, "tock_history_attempts_dead_p20310506")
    assert side_of(db, early) == "tock_history_jobs_dead_p20310506"
    assert attempt_sides(db, early)[0][1] == "tock_history_attempts_dead_p20310506"
    assert side_of(db, other_day) == "tock_history_jobs_dead_default"
    assert store.ensure_partition(JobState.DEAD, FAR.date()) is False
    with pytest.raises(ValueError):
        store.ensure_partition(JobState.RUNNING, FAR.date())


def test_ensure_partition_waits_for_a_row_being_written_to_the_default_then_adopts_it(
        store, db, other):
    # Another timer is moving a row of that day into the history (no partition yet).
    late = add_finished(other, state="dead", finished_at=FAR)
    assert run_blocked(db, other, lambda: store.ensure_partition(JobState.DEAD, FAR.date()),
                       other.commit) is True
    assert side_of(db, late) == "tock_history_jobs_dead_p20310506"


def test_day_partitions_lists_every_state_and_day(store, db, now):
    # The template database was migrated at the start of the session (maybe yesterday).
    store.ensure_partition(JobState.DEAD, FAR.date())
    today = now.astimezone(UTC).date()
    found = store.day_partitions()
    assert (JobState.DEAD, FAR.date()) in found
    assert {(s, today + n * DAY) for s in (JobState.SUCCEEDED, JobState.DEAD,
                                           JobState.CANCELLED) for n in range(2)} <= set(found)
    assert found == sorted(found, key=lambda p: (p[1], p[0].value))


def test_expire_partition_takes_a_day_out_of_every_read(store, job_store, db, now):
    job = add_finished(db, state="succeeded", finished_at=now, unique_key="k")
    add_history_attempt(db, job, attempt=1, outcome="succeeded", finished_at=now)
    day = now.astimezone(UTC).date()
    with store.transaction() as tx:
        tx.set_lock_timeout()
        assert tx.expire_partition(JobState.SUCCEEDED, day) is True
    name = f"succeeded_p{day:%Y%m%d}"
    assert not _exists(db, f"tock_history_jobs_{name}")
    assert not _exists(db, f"tock_history_attempts_{name}")
    assert store.expired_tables() == [f"tock_expired_jobs_{name}"]
    assert job_store.get_job(job) is None
    assert count(db, "tock_history_attempts") == 0
    assert keys(db) == {"k": job}, "freed by prune_expired, in batches"
    assert store.expire_partition(JobState.SUCCEEDED, day) is False


def test_prune_expired_frees_the_keys_of_its_jobs_only_then_the_table_drops(
        store, db, now):
    jobs = [add_finished(db, state="dead", finished_at=now, unique_key=f"k{i}")
            for i in range(3)]
    add_finished(db, state="dead", finished_at=now)  # keyless
    store.expire_partition(JobState.DEAD, now.astimezone(UTC).date())
    (table,) = store.expired_tables()
    # Meanwhile a producer freed k2 (its job is gone) and a new job took it.
    db.execute("UPDATE tock_keys SET job_id = 999999 WHERE unique_key = 'k2'")
    assert store.prune_expired(table, 2) == 2
    assert store.prune_expired(table, 2) == 1
    assert store.prune_expired(table, 2) == 0
    assert keys(db) == {"k2": 999999}, "a key taken again is not freed"
    assert count(db, table) == 1, "only keyed rows are touched"
    store.drop_expired(table)
    assert store.expired_tables() == []
    assert [j for j in jobs if j in keys(db).values()] == []


def test_sweep_default_deletes_rows_past_retention_with_attempts_and_keys(store, db):
    old = add_finished(db, state="cancelled", finished_at=FAR - 10 * DAY, unique_key="old")
    add_history_attempt(db, old, attempt=1, outcome="failed", finished_at=FAR - 10 * DAY)
    kept = add_finished(db, state="cancelled", finished_at=FAR, unique_key="kept")
    assert store.sweep_default(JobState.CANCELLED, FAR - DAY, 10) == 1
    assert side_of(db, old) is None and attempt_sides(db, old) == []
    assert side_of(db, kept) == "tock_history_jobs_cancelled_default"
    assert keys(db) == {"kept": kept}
    assert store.sweep_default(JobState.CANCELLED, FAR - DAY, 10) == 0


# --- finished rows still in tock_jobs -----------------------------------------------------


def test_finished_days_are_the_utc_days_of_the_next_batch(store, db, now):
    add_job(db, run_at=now, state="dead", finished_at=FAR)
    add_job(db, run_at=now, state="dead", updated_at=FAR - DAY)  # no finished_at
    add_job(db, run_at=now, state="dead", finished_at=FAR + 2 * DAY)
    assert sorted(store.finished_days(JobState.DEAD, 2)) == [(FAR - DAY).date(), FAR.date()]


def test_pick_finished_locks_a_batch_skipping_locked_rows_and_writes_keys(
        store, db, other, now):
    a = add_job(db, run_at=now, state="succeeded", finished_at=now, unique_key="a")
    b = add_job(db, run_at=now, state="succeeded", finished_at=now, unique_key="b")
    c = add_job(db, run_at=now, state="succeeded", finished_at=now)
    add_job(db, run_at=now, state="scheduled")
    db.execute("DELETE FROM tock_keys")  # as before migration 0007
    insert_row(db, "tock_keys", unique_key="b", job_id=12345)  # a stale pointer
    other.execute("SELECT 1 FROM tock_jobs WHERE id = %s FOR UPDATE", (c,))
    with store.transaction() as tx:
        assert sorted(tx.pick_finished(JobState.SUCCEEDED, 10)) == [a, b]
    other.rollback()
    assert keys(db) == {"a": a, "b": b}


def test_move_finished_moves_kept_days_and_deletes_expired_ones(store, db, now):
    keep_from = {JobState.SUCCEEDED: now - DAY, JobState.DEAD: now - 30 * DAY,
                 JobState.CANCELLED: now - DAY}
    moved = add_job(db, run_at=now, state="dead", finished_at=now - 2 * DAY, unique_key="m")
    insert_row(db, "tock_attempts", job_id=moved, attempt=1, finished_at=now - 2 * DAY,
               outcome="failed")
    expired = add_job(db, run_at=now, state="succeeded", finished_at=now - 2 * DAY,
                      unique_key="e")
    insert_row(db, "tock_attempts", job_id=expired, attempt=1, finished_at=now - 2 * DAY,
               outcome="succeeded")
    unfinished = add_job(db, run_at=now)
    with store.transaction() as tx:
        ids = tx.pick_finished(JobState.DEAD, 10) + tx.pick_finished(JobState.SUCCEEDED, 10)
        assert tx.move_finished([*ids, unfinished], keep_from) == (1, 2)
    assert side_of(db, moved) == "tock_history_jobs_dead_default"  # no partition that day
    assert attempt_sides(db, moved)[0][1] == "tock_history_attempts_dead_default"
    assert side_of(db, expired) is None and attempt_sides(db, expired) == []
    assert side_of(db, unfinished) == "hot"
    assert keys(db) == {"m": moved}


# --- workers and audit records ------------------------------------------------------------


def test_prune_workers_forgets_long_stopped_or_silent_workers_holding_nothing(
        store, db, now):
    def worker(worker_id: str, heartbeat: timedelta, stopped: timedelta | None = None) -> None:
        insert_row(db, "tock_workers", id=worker_id, host="h", pid=1, queues=["default"],
                   concurrency=1, started_at=now - 60 * DAY, last_heartbeat=now - heartbeat,
                   stopped_at=None if stopped is None else now - stopped)

    worker("stopped-long-ago", 3 * DAY, stopped=3 * DAY)
    worker("silent-long", 2 * DAY)
    worker("stopped-recently", 2 * DAY, stopped=secs(60))
    worker("alive", secs(5))
    worker("silent-but-busy", 2 * DAY)
    add_running(db, now, worker="silent-but-busy")
    assert store.prune_workers(now - DAY, 1) == 1
    assert store.prune_workers(now - DAY, 10) == 1
    assert store.prune_workers(now - DAY, 10) == 0
    left = {r[0] for r in db.execute("SELECT id FROM tock_workers")}
    assert left == {"stopped-recently", "alive", "silent-but-busy"}


def test_prune_audit_deletes_old_records_oldest_first(store, schedule_store, db, now):
    schedule_store.insert(make_spec("s", "k", every=60), Cursor(now, now, now), now)
    for age in (40, 35, 1):
        insert_row(db, "tock_schedule_audit", schedule="s", reason="missed",
                   first_slot=now, last_slot=now, slot_count=1,
                   recorded_at=now - age * DAY)
    assert store.prune_audit(now - 30 * DAY, 1) == 1
    assert store.prune_audit(now - 30 * DAY, 10) == 1
    ages = [r[0] for r in db.execute("SELECT recorded_at FROM tock_schedule_audit")]
    assert ages == [now - DAY]
