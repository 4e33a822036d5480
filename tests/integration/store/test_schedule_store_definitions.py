"""Conformance of `ScheduleStore` (shared.store.schedule_store / schedules_sql) against the
real Postgres, the statements on schedule definitions: db_now, insert, update, get, lock,
list_all, set_paused and delete. One test per method, with pinned `now=` values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest

from shared.core.schedules import DstFold, DstGap, Misfire, Overlap
from shared.schedules.spec import EPOCH, make_spec
from shared.store import ScheduleStore
from shared.store.rows import AuditRecord, Cursor
from tests.integration.store.helpers import count, run_blocked, secs
from tests.integration.store.schedule_rows import M, add_schedule, schedule_row, schedule_spec
from tests.support.drive import db_now

# --- db_now -----------------------------------------------------------------------------------


def test_db_now_pinned_is_the_same_instant_in_utc(schedule_store, now):
    berlin_summer = timezone(timedelta(hours=2))
    pinned = datetime(2026, 6, 1, 14, 30, 15, 123456, tzinfo=berlin_summer)
    value = schedule_store.db_now(pinned)
    assert value == pinned
    assert value.tzinfo is UTC and value.hour == 12


def test_db_now_unpinned_is_the_database_clock_in_utc(schedule_store, db):
    before = db_now(db)
    value = schedule_store.db_now()
    assert before <= value <= db_now(db)
    assert value.tzinfo is UTC


# --- insert / update / get / lock / list_all ---------------------------------------------------


def test_insert_stores_every_definition_column_and_the_cursor(schedule_store, db, now):
    spec = make_spec("nightly", "report", {"region": "eu"}, cron="30 2 * * *",
                     tz="Europe/Berlin", queue="reports", priority=4, max_attempts=3,
                     timeout=90, tenant="acme", misfire="latest", misfire_grace=120,
                     backfill_max=7, backfill_gap=2.5, overlap="buffer_one", dst_gap="skip",
                     dst_fold="twice", spread=30, jitter=5, now=now)
    cursor = Cursor(now, now + 60 * M, now + 60 * M + secs(12))
    stored = schedule_store.insert(spec, cursor, now)
    assert stored is not None
    assert stored.spec == spec, "the definition round-trips through the row"
    assert (stored.name, stored.cron, stored.tz, stored.misfire, stored.overlap,
            stored.dst_gap, stored.dst_fold) == (
        "nightly", "30 2 * * *", "Europe/Berlin", Misfire.LATEST, Overlap.BUFFER_ONE,
        DstGap.SKIP, DstFold.TWICE)
    assert (stored.cursor_at, stored.next_slot, stored.next_fire_at, stored.buffered_slot) == (
        now, now + 60 * M, now + 60 * M + secs(12), None)
    assert (stored.paused, stored.created_at, stored.updated_at) == (False, now, now)
    assert schedule_store.get("nightly") == stored


def test_insert_of_an_every_schedule_stores_interval_and_anchor(schedule_store, now):
    stored = schedule_store.insert(schedule_spec(every=90), Cursor(now, now + M, now + M), now)
    assert stored is not None
    assert (stored.every, stored.anchor, stored.cron) == (timedelta(seconds=90), EPOCH, None)


def test_insert_of_a_taken_name_is_none_and_changes_nothing(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick", kind="first")
    before = schedule_row(db, "tick")
    again = schedule_store.insert(schedule_spec("tick", kind="second"),
                                  Cursor(now + M, None, None), now + M)
    assert again is None
    assert schedule_row(db, "tick") == before
    assert count(db, "tock_schedules") == 1


def test_insert_waits_for_a_concurrent_insert_of_the_same_name(schedule_store, db, other,
                                                               now):
    ScheduleStore.on(other).insert(schedule_spec("tick", kind="theirs"), Cursor(now, None, None),
                                   now)
    inserted = run_blocked(db, other, lambda: schedule_store.insert(
        schedule_spec("tick", kind="ours"), Cursor(now, None, None), now), other.commit)
    assert inserted is None
    stored = schedule_store.get("tick")
    assert stored is not None and stored.kind == "theirs"


def test_update_rewrites_definition_and_cursor(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick", kind="first")
    new_spec = schedule_spec("tick", kind="second", payload={"v": 2}, every=300, priority=9,
                             overlap="skip")
    cursor = Cursor(now + M, now + 5 * M, now + 5 * M + secs(1), buffered_slot=now)
    updated = schedule_store.update(new_spec, cursor, now + secs(30))
    assert updated is not None
    assert updated.spec == new_spec
    assert (updated.cursor_at, updated.next_slot, updated.next_fire_at,
            updated.buffered_slot) == (now + M, now + 5 * M, now + 5 * M + secs(1), now)
    assert (updated.created_at, updated.updated_at) == (now, now + secs(30))
    assert schedule_store.get("tick") == updated


def test_update_of_a_missing_schedule_is_none(schedule_store, db, now):
    assert schedule_store.update(schedule_spec("ghost"), Cursor(now, None, None), now) is None
    assert count(db, "tock_schedules") == 0


def test_get_of_a_missing_schedule_is_none(schedule_store):
    assert schedule_store.get("ghost") is None


def test_lock_holds_the_row_until_the_transaction_ends(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
    nowait = "SELECT name FROM tock_schedules WHERE name = 'tick' FOR UPDATE NOWAIT"
    with schedule_store.transaction() as tx:
        locked = tx.lock("tick")
        assert locked is not None and locked.name == "tick"
        with pytest.raises(psycopg.errors.LockNotAvailable):
            db.execute(nowait)
        assert tx.lock("ghost") is None
    assert db.execute(nowait).fetchall() == [("tick",)]


def test_list_all_is_every_schedule_by_name(schedule_store, now):
    for name in ("b-report", "a-report", "c-report"):
        add_schedule(schedule_store, now, name)
    assert [s.name for s in schedule_store.list_all()] == ["a-report", "b-report", "c-report"]


def test_list_all_of_none_is_empty(schedule_store):
    assert schedule_store.list_all() == []


# --- set_paused / delete ----------------------------------------------------------------------


def test_set_paused_pauses_and_resumes_with_the_new_cursor(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
    db.execute("UPDATE tock_schedules SET buffered_slot = %s WHERE name = 'tick'", (now,))
    paused = schedule_store.set_paused("tick", True, Cursor(now + secs(10), None, None, now),
                                       now=now + secs(10))
    assert paused is not None
    assert (paused.paused, paused.cursor_at, paused.next_slot, paused.next_fire_at,
            paused.updated_at) == (True, now + secs(10), None, None, now + secs(10))
    assert paused.buffered_slot == now, "kept by a cursor that keeps it (the pause's)"
    resumed = schedule_store.set_paused("tick", False, Cursor(now + M, now + 2 * M,
                                                              now + 2 * M), now=now + M)
    assert resumed is not None
    assert (resumed.paused, resumed.cursor_at, resumed.next_fire_at) == (
        False, now + M, now + 2 * M)
    assert resumed.buffered_slot is None, "a restart's cursor buffers nothing (the resume's)"
    row = schedule_row(db, "tick")
    assert row is not None and (row["paused"], row["updated_at"]) == (False, now + M)


def test_set_paused_of_a_missing_schedule_is_none(schedule_store, now):
    assert schedule_store.set_paused("ghost", True, Cursor(now, None, None), now=now) is None


def test_delete_removes_the_schedule_and_its_audit_records(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
    add_schedule(schedule_store, now, "keep")
    schedule_store.insert_audit([AuditRecord("tick", "missed", now, now, 1, None),
                                 AuditRecord("keep", "missed", now, now, 1, None)], now)
    assert schedule_store.delete("tick") is True
    assert schedule_store.get("tick") is None
    assert db.execute("SELECT schedule FROM tock_schedule_audit").fetchall() == [("keep",)]
    assert schedule_store.delete("tick") is False
    assert schedule_store.get("keep") is not None
