"""Conformance of `ScheduleStore` (shared.store.schedule_store / schedules_sql) against the
real Postgres: one test per method, with pinned `now=` values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from shared.core.schedules import (
    DstFold,
    DstGap,
    Misfire,
    Overlap,
    ScheduleEvent,
    ScheduleRun,
    ScheduleSpec,
)
from shared.schedules.slots import slot_key
from shared.schedules.spec import EPOCH, make_spec
from shared.store import ScheduleStore
from shared.store.rows import AuditRecord, Cursor, SlotJob
from tests.integration.store.helpers import add_job, count, run_blocked, secs
from tests.support.drive import db_now

M = timedelta(minutes=1)


def _spec(name: str = "tick", kind: str = "report", payload: Any = None, **kw: Any
          ) -> ScheduleSpec:
    if "cron" not in kw:
        kw.setdefault("every", 60)
    return make_spec(name, kind, payload, **kw)


def _add(store: ScheduleStore, now: datetime, name: str = "tick", *,
         fire_at: datetime | None = None, **kw: Any) -> None:
    """A schedule whose next slot fires at `fire_at` (default: a minute from now)."""
    fire = fire_at if fire_at is not None else now + M
    assert store.insert(_spec(name, **kw), Cursor(now, fire, fire), now) is not None


def _schedule_row(db: Any, name: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM tock_schedules WHERE name = %s", (name,)).fetchone()
    return row


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
    stored = schedule_store.insert(_spec(every=90), Cursor(now, now + M, now + M), now)
    assert stored is not None
    assert (stored.every, stored.anchor, stored.cron) == (timedelta(seconds=90), EPOCH, None)


def test_insert_of_a_taken_name_is_none_and_changes_nothing(schedule_store, db, now):
    _add(schedule_store, now, "tick", kind="first")
    before = _schedule_row(db, "tick")
    again = schedule_store.insert(_spec("tick", kind="second"),
                                  Cursor(now + M, None, None), now + M)
    assert again is None
    assert _schedule_row(db, "tick") == before
    assert count(db, "tock_schedules") == 1


def test_insert_waits_for_a_concurrent_insert_of_the_same_name(schedule_store, db, other,
                                                               now):
    ScheduleStore.on(other).insert(_spec("tick", kind="theirs"), Cursor(now, None, None), now)
    inserted = run_blocked(db, other, lambda: schedule_store.insert(
        _spec("tick", kind="ours"), Cursor(now, None, None), now), other.commit)
    assert inserted is None
    stored = schedule_store.get("tick")
    assert stored is not None and stored.kind == "theirs"


def test_update_rewrites_definition_and_cursor(schedule_store, db, now):
    _add(schedule_store, now, "tick", kind="first")
    new_spec = _spec("tick", kind="second", payload={"v": 2}, every=300, priority=9,
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
    assert schedule_store.update(_spec("ghost"), Cursor(now, None, None), now) is None
    assert count(db, "tock_schedules") == 0


def test_get_of_a_missing_schedule_is_none(schedule_store):
    assert schedule_store.get("ghost") is None


def test_lock_holds_the_row_until_the_transaction_ends(schedule_store, db, now):
    _add(schedule_store, now, "tick")
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
        _add(schedule_store, now, name)
    assert [s.name for s in schedule_store.list_all()] == ["a-report", "b-report", "c-report"]


def test_list_all_of_none_is_empty(schedule_store):
    assert schedule_store.list_all() == []


# --- set_paused / delete ----------------------------------------------------------------------


def test_set_paused_pauses_and_resumes_with_the_new_cursor(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    db.execute("UPDATE tock_schedules SET buffered_slot = %s WHERE name = 'tick'", (now,))
    paused = schedule_store.set_paused("tick", True, Cursor(now + secs(10), None, None),
                                       now=now + secs(10))
    assert paused is not None
    assert (paused.paused, paused.cursor_at, paused.next_slot, paused.next_fire_at,
            paused.updated_at) == (True, now + secs(10), None, None, now + secs(10))
    assert paused.buffered_slot == now, "the buffered slot is not the cursor's to change"
    resumed = schedule_store.set_paused("tick", False, Cursor(now + M, now + 2 * M,
                                                              now + 2 * M), now=now + M)
    assert resumed is not None
    assert (resumed.paused, resumed.cursor_at, resumed.next_fire_at) == (
        False, now + M, now + 2 * M)
    row = _schedule_row(db, "tick")
    assert row is not None and (row["paused"], row["updated_at"]) == (False, now + M)


def test_set_paused_of_a_missing_schedule_is_none(schedule_store, now):
    assert schedule_store.set_paused("ghost", True, Cursor(now, None, None), now=now) is None


def test_delete_removes_the_schedule_and_its_audit_records(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    _add(schedule_store, now, "keep")
    schedule_store.insert_audit([AuditRecord("tick", "missed", now, now, 1, None),
                                 AuditRecord("keep", "missed", now, now, 1, None)], now)
    assert schedule_store.delete("tick") is True
    assert schedule_store.get("tick") is None
    assert db.execute("SELECT schedule FROM tock_schedule_audit").fetchall() == [("keep",)]
    assert schedule_store.delete("tick") is False
    assert schedule_store.get("keep") is not None


# --- audit / insert_audit / runs --------------------------------------------------------------


def test_insert_audit_writes_each_record(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    schedule_store.insert_audit([
        AuditRecord("tick", "missed", now - 10 * M, now - M, 10, None),
        AuditRecord("tick", "overlap_skipped", now, now, None, "a run was still going"),
    ], now + secs(1))
    rows = db.execute("SELECT schedule, reason, first_slot, last_slot, slot_count, detail, "
                      "recorded_at FROM tock_schedule_audit ORDER BY id").fetchall()
    assert rows == [
        ("tick", "missed", now - 10 * M, now - M, 10, None, now + secs(1)),
        ("tick", "overlap_skipped", now, now, None, "a run was still going", now + secs(1)),
    ]


def test_insert_audit_of_no_records_runs_no_statement(database_url, now):
    closed = psycopg.connect(database_url)
    closed.close()
    ScheduleStore.on(closed).insert_audit([], now)


def test_audit_is_the_schedules_records_newest_first(schedule_store, now):
    _add(schedule_store, now, "tick")
    _add(schedule_store, now, "other")
    for i, reason in enumerate(("missed", "paused", "redefined")):
        schedule_store.insert_audit(
            [AuditRecord("tick", reason, now + i * M, now + i * M, 1, f"#{i}")], now + i * M)
    schedule_store.insert_audit([AuditRecord("other", "missed", now, now, 1, None)], now)
    events = schedule_store.audit("tick", 2)
    assert [(e.reason, e.detail) for e in events] == [("redefined", "#2"), ("paused", "#1")]
    newest = events[0]
    assert newest == ScheduleEvent(newest.id, "tick", "redefined", now + 2 * M, now + 2 * M, 1,
                                   "#2", now + 2 * M)
    assert len(schedule_store.audit("tick", 10)) == 3
    assert schedule_store.audit("ghost", 10) == []


def test_runs_are_the_schedules_jobs_newest_slot_first(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    _add(schedule_store, now, "other")
    slots = [now + i * M for i in range(3)]
    made = dict((key, job_id) for job_id, key in schedule_store.insert_slot_jobs(
        [SlotJob("tick", s, slot_key("tick", s)) for s in slots]))
    schedule_store.insert_slot_jobs([SlotJob("other", now, slot_key("other", now))])
    db.execute("UPDATE tock_jobs SET state = 'succeeded' WHERE unique_key = %s",
               (slot_key("tick", slots[2]),))
    runs = schedule_store.runs("tick", 2)
    assert runs == [
        ScheduleRun(made[slot_key("tick", slots[2])], slots[2], "succeeded", slots[2]),
        ScheduleRun(made[slot_key("tick", slots[1])], slots[1], "scheduled", slots[1]),
    ]


def test_runs_of_a_job_without_a_run_key_use_its_run_at(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    job = add_job(db, run_at=now + secs(5), schedule_name="tick")
    assert schedule_store.runs("tick", 10) == [
        ScheduleRun(job, now + secs(5), "scheduled", now + secs(5))]


# --- claim_due / claim_released_buffers -------------------------------------------------------


def test_claim_due_takes_due_schedules_in_fire_order_with_their_active_flag(
        schedule_store, db, now):
    _add(schedule_store, now, "done", fire_at=now - secs(3))
    _add(schedule_store, now, "busy", fire_at=now - secs(2))
    _add(schedule_store, now, "due", fire_at=now - secs(1))
    _add(schedule_store, now, "soon", fire_at=now + secs(5))
    _add(schedule_store, now, "later", fire_at=now + secs(60))
    _add(schedule_store, now, "paused", fire_at=now - secs(5))
    _add(schedule_store, now, "finished", fire_at=None)
    db.execute("UPDATE tock_schedules SET paused = true WHERE name = 'paused'")
    db.execute("UPDATE tock_schedules SET next_slot = NULL, next_fire_at = NULL "
               "WHERE name = 'finished'")
    add_job(db, run_at=now - M, schedule_name="done", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="done", state="dead")
    add_job(db, run_at=now - M, schedule_name="busy", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="busy", state="running")
    with schedule_store.transaction() as tx:
        claimed = tx.claim_due(now, lookahead_seconds=10, limit=10)
    assert [(s.name, active) for s, active in claimed] == [
        ("done", False), ("busy", True), ("due", False), ("soon", False)]
    assert [s.name for s, _ in schedule_store.claim_due(now, 0, limit=2)] == ["done", "busy"]


@pytest.mark.parametrize("state", ["scheduled", "retrying", "dispatched", "running"])
def test_claim_due_counts_every_unfinished_state_as_active(schedule_store, db, now, state):
    _add(schedule_store, now, "busy", fire_at=now)
    add_job(db, run_at=now - M, schedule_name="busy", state=state)
    assert [(s.name, active) for s, active in schedule_store.claim_due(now, 0, 10)] == [
        ("busy", True)]


def test_claim_due_skips_a_schedule_another_transaction_holds(
        schedule_store, other, impatient, now):
    _add(schedule_store, now, "held", fire_at=now - secs(2))
    _add(schedule_store, now, "free", fire_at=now - secs(1))
    other.execute("SELECT name FROM tock_schedules WHERE name = 'held' FOR UPDATE")
    with ScheduleStore.on(impatient).transaction() as tx:
        assert [s.name for s, _ in tx.claim_due(now, 0, 10)] == ["free"]


def test_claim_released_buffers_takes_buffered_schedules_no_run_blocks(
        schedule_store, db, now):
    for name in ("free", "blocked", "paused", "taken", "plain"):
        _add(schedule_store, now, name)
    db.execute("UPDATE tock_schedules SET buffered_slot = %s WHERE name <> 'plain'", (now,))
    db.execute("UPDATE tock_schedules SET paused = true WHERE name = 'paused'")
    add_job(db, run_at=now - M, schedule_name="free", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="blocked", state="running")
    claimed = schedule_store.claim_released_buffers(["taken"], 10)
    assert [(s.name, s.buffered_slot, active) for s, active in claimed] == [
        ("free", now, False)]
    assert {s.name for s, _ in schedule_store.claim_released_buffers([], 10)} == {
        "free", "taken"}


def test_claim_released_buffers_skips_a_schedule_another_transaction_holds(
        schedule_store, db, other, impatient, now):
    _add(schedule_store, now, "held")
    _add(schedule_store, now, "free")
    db.execute("UPDATE tock_schedules SET buffered_slot = %s", (now,))
    other.execute("SELECT name FROM tock_schedules WHERE name = 'held' FOR UPDATE")
    with ScheduleStore.on(impatient).transaction() as tx:
        assert [s.name for s, _ in tx.claim_released_buffers([], 10)] == ["free"]


# --- insert_slot_jobs / advance ---------------------------------------------------------------


def test_insert_slot_jobs_makes_jobs_from_the_schedules_definition(schedule_store, db, now):
    _add(schedule_store, now, "tick", kind="report", payload={"a": 1}, queue="reports",
         priority=4, max_attempts=3, timeout=9, tenant="acme")
    s1, s2 = now + M, now + 2 * M
    made = schedule_store.insert_slot_jobs([SlotJob("tick", s1, slot_key("tick", s1)),
                                            SlotJob("tick", s2 + secs(3), slot_key("tick", s2))])
    assert sorted(key for _, key in made) == [slot_key("tick", s1), slot_key("tick", s2)]
    rows = db.cursor(row_factory=dict_row).execute(
        "SELECT id, kind, queue, payload, priority, state::text, run_at, max_attempts, "
        "timeout_seconds, unique_key, tenant, schedule_name FROM tock_jobs ORDER BY run_at"
    ).fetchall()
    assert sorted((r["id"], r["unique_key"]) for r in rows) == sorted(made)
    for row, run_at, slot in zip(rows, (s1, s2 + secs(3)), (s1, s2), strict=True):
        del row["id"]
        assert row == {
            "kind": "report", "queue": "reports", "payload": {"a": 1}, "priority": 4,
            "state": "scheduled", "run_at": run_at, "max_attempts": 3,
            "timeout_seconds": 9.0, "unique_key": slot_key("tick", slot), "tenant": "acme",
            "schedule_name": "tick"}


def test_insert_slot_jobs_with_a_taken_run_key_makes_nothing_for_it(schedule_store, db, now):
    _add(schedule_store, now, "tick")
    s1, s2 = now + M, now + 2 * M
    (first,) = schedule_store.insert_slot_jobs([SlotJob("tick", s1, slot_key("tick", s1))])
    made = schedule_store.insert_slot_jobs([SlotJob("tick", s1, slot_key("tick", s1)),
                                            SlotJob("tick", s2, slot_key("tick", s2))])
    assert [key for _, key in made] == [slot_key("tick", s2)]
    assert db.execute("SELECT id FROM tock_jobs WHERE unique_key = %s",
                      (slot_key("tick", s1),)).fetchall() == [(first[0],)]
    assert count(db, "tock_jobs") == 2


def test_insert_slot_jobs_for_an_unknown_schedule_makes_nothing(schedule_store, db, now):
    assert schedule_store.insert_slot_jobs([SlotJob("ghost", now, slot_key("ghost", now))]) == []
    assert count(db, "tock_jobs") == 0


def test_insert_slot_jobs_of_no_slots_runs_no_statement(database_url):
    closed = psycopg.connect(database_url)
    closed.close()
    assert ScheduleStore.on(closed).insert_slot_jobs([]) == []


def test_advance_moves_each_named_cursor(schedule_store, db, now):
    for name in ("a", "b", "c"):
        _add(schedule_store, now, name)
    untouched = _schedule_row(db, "c")
    schedule_store.advance([
        ("a", Cursor(now + M, now + 2 * M, now + 2 * M + secs(4))),
        ("b", Cursor(now + 3 * M, None, None, buffered_slot=now + 2 * M)),
        ("ghost", Cursor(now, None, None)),
    ], now + secs(7))
    a, b = schedule_store.get("a"), schedule_store.get("b")
    assert a is not None and b is not None
    assert (a.cursor_at, a.next_slot, a.next_fire_at, a.buffered_slot, a.updated_at) == (
        now + M, now + 2 * M, now + 2 * M + secs(4), None, now + secs(7))
    assert (b.cursor_at, b.next_slot, b.next_fire_at, b.buffered_slot, b.updated_at) == (
        now + 3 * M, None, None, now + 2 * M, now + secs(7))
    assert _schedule_row(db, "c") == untouched
    assert count(db, "tock_schedules") == 3
