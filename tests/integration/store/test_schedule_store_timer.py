"""Conformance of `ScheduleStore` (shared.store.schedule_store / schedules_sql) against the
real Postgres, the statements the timer fires schedules with and what they leave behind:
insert_audit, audit, runs, claim_due, claim_released_buffers, insert_slot_jobs and advance.
One test per method, with pinned `now=` values."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from shared.core.schedules import ScheduleEvent, ScheduleRun
from shared.schedules.slots import slot_key
from shared.store import ScheduleStore
from shared.store.rows import AuditRecord, Cursor, SlotJob
from tests.integration.store.helpers import add_job, count, secs
from tests.integration.store.schedule_rows import M, add_schedule, schedule_row
from tests.support.dashboard import run_to

# --- audit / insert_audit / runs --------------------------------------------------------------


def test_insert_audit_writes_each_record(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
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
    add_schedule(schedule_store, now, "tick")
    add_schedule(schedule_store, now, "other")
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
    add_schedule(schedule_store, now, "tick")
    add_schedule(schedule_store, now, "other")
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


def test_a_run_waiting_to_retry_is_listed_at_its_slot_not_its_retry_time(
        schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
    slots = [now + i * M for i in range(3)]
    made = dict((key, job_id) for job_id, key in schedule_store.insert_slot_jobs(
        [SlotJob("tick", s, slot_key("tick", s)) for s in slots]))
    db.execute("UPDATE tock_jobs SET state = 'retrying', run_at = %s WHERE unique_key = %s",
               (now + 10 * M, slot_key("tick", slots[0])))
    assert [run.slot for run in schedule_store.runs("tick", 10)] == slots[::-1]
    [first] = [run for run in schedule_store.runs("tick", 10) if run.slot == slots[0]]
    assert first == ScheduleRun(made[slot_key("tick", slots[0])], slots[0], "retrying",
                                now + 10 * M)


def test_runs_of_a_job_without_a_run_key_use_its_run_at(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick")
    job = add_job(db, run_at=now + secs(5), schedule_name="tick")
    assert schedule_store.runs("tick", 10) == [
        ScheduleRun(job, now + secs(5), "scheduled", now + secs(5))]


# --- claim_due / claim_released_buffers -------------------------------------------------------


def test_claim_due_takes_due_schedules_in_fire_order_with_their_active_flag(
        schedule_store, db, now):
    add_schedule(schedule_store, now, "done", fire_at=now - secs(3))
    add_schedule(schedule_store, now, "busy", fire_at=now - secs(2))
    add_schedule(schedule_store, now, "due", fire_at=now - secs(1))
    add_schedule(schedule_store, now, "soon", fire_at=now + secs(5))
    add_schedule(schedule_store, now, "later", fire_at=now + secs(60))
    add_schedule(schedule_store, now, "paused", fire_at=now - secs(5))
    add_schedule(schedule_store, now, "finished", fire_at=None)
    db.execute("UPDATE tock_schedules SET paused = true WHERE name = 'paused'")
    db.execute("UPDATE tock_schedules SET next_slot = NULL, next_fire_at = NULL "
               "WHERE name = 'finished'")
    add_job(db, run_at=now - M, schedule_name="done", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="done", state="dead")
    add_job(db, run_at=now - M, schedule_name="busy", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="busy", state="running")
    with schedule_store.transaction() as tx:
        claimed = tx.claim_due(now, lookahead_seconds=10, limit=10)
    assert [(s.name, active) for s, active, _ in claimed] == [
        ("done", False), ("busy", True), ("due", False), ("soon", False)]
    assert [s.name for s, _, _ in schedule_store.claim_due(now, 0, limit=2)] == ["done", "busy"]


@pytest.mark.parametrize("state", ["scheduled", "retrying", "dispatched", "running"])
def test_claim_due_counts_every_unfinished_state_as_active(schedule_store, db, now, state):
    add_schedule(schedule_store, now, "busy", fire_at=now)
    add_job(db, run_at=now - M, schedule_name="busy", state=state)
    assert [(s.name, active) for s, active, _ in schedule_store.claim_due(now, 0, 10)] == [
        ("busy", True)]


def test_claim_due_skips_a_schedule_another_transaction_holds(
        schedule_store, other, impatient, now):
    add_schedule(schedule_store, now, "held", fire_at=now - secs(2))
    add_schedule(schedule_store, now, "free", fire_at=now - secs(1))
    other.execute("SELECT name FROM tock_schedules WHERE name = 'held' FOR UPDATE")
    with ScheduleStore.on(impatient).transaction() as tx:
        assert [s.name for s, _, _ in tx.claim_due(now, 0, 10)] == ["free"]


def test_claim_released_buffers_takes_buffered_schedules_no_run_blocks(
        schedule_store, db, now):
    for name in ("free", "blocked", "paused", "taken", "plain"):
        add_schedule(schedule_store, now, name)
    db.execute("UPDATE tock_schedules SET buffered_slot = %s WHERE name <> 'plain'", (now,))
    db.execute("UPDATE tock_schedules SET paused = true WHERE name = 'paused'")
    add_job(db, run_at=now - M, schedule_name="free", state="succeeded")
    add_job(db, run_at=now - M, schedule_name="blocked", state="running")
    claimed = schedule_store.claim_released_buffers(["taken"], 10)
    assert [(s.name, s.buffered_slot, active) for s, active, _ in claimed] == [
        ("free", now, False)]
    assert {s.name for s, _, _ in schedule_store.claim_released_buffers([], 10)} == {
        "free", "taken"}


def test_a_released_buffer_comes_with_when_its_newest_run_finished(schedule_store, db, now):
    add_schedule(schedule_store, now, "free")
    db.execute("UPDATE tock_schedules SET buffered_slot = %s", (now,))
    older = add_job(db, run_at=now - 2 * M, schedule_name="free")
    newer = add_job(db, run_at=now - M, schedule_name="free")
    run_to(db, newer, "succeeded")  # the run that held the slot back
    run_to(db, older, "dead")  # finished later, but the older run
    finished = db.execute("SELECT finished_at FROM tock_history_jobs WHERE id = %s",
                          (newer,)).fetchone()[0]
    (due,) = schedule_store.claim_released_buffers([], 10)
    assert (due.schedule.name, due.active, due.released_at) == ("free", False, finished)
    db.execute("UPDATE tock_schedules SET buffered_slot = NULL")
    db.execute("UPDATE tock_schedules SET next_fire_at = %s", (now,))
    (due,) = schedule_store.claim_due(now, 0, 10)
    assert due.released_at is None  # nothing buffered: not looked up


def test_claim_released_buffers_skips_a_schedule_another_transaction_holds(
        schedule_store, db, other, impatient, now):
    add_schedule(schedule_store, now, "held")
    add_schedule(schedule_store, now, "free")
    db.execute("UPDATE tock_schedules SET buffered_slot = %s", (now,))
    other.execute("SELECT name FROM tock_schedules WHERE name = 'held' FOR UPDATE")
    with ScheduleStore.on(impatient).transaction() as tx:
        assert [s.name for s, _, _ in tx.claim_released_buffers([], 10)] == ["free"]


# --- insert_slot_jobs / advance ---------------------------------------------------------------


def test_insert_slot_jobs_makes_jobs_from_the_schedules_definition(schedule_store, db, now):
    add_schedule(schedule_store, now, "tick", kind="report", payload={"a": 1}, queue="reports",
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
    add_schedule(schedule_store, now, "tick")
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
        add_schedule(schedule_store, now, name)
    untouched = schedule_row(db, "c")
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
    assert schedule_row(db, "c") == untouched
    assert count(db, "tock_schedules") == 3
