"""Lingering handlers (shared.store.lingering_sql): a handler still running for a job its
worker no longer holds keeps the job's concurrency slot. The cancel of a running job writes
the row itself; the worker's heartbeat writes the others (`record_lingering`) and deletes
those whose handler has returned; a stopping worker's go with it, and a dead worker's
when a timer finds it dead. Real Postgres; time pinned through `now=`."""

from __future__ import annotations

from uuid import uuid4

import pytest

from shared.core.filters import JobFilter, action_states
from shared.core.reports import LimitInfo, Worker
from shared.store.database import Database
from shared.store.flow_store import FlowStore
from shared.store.rows import Lease
from tests.integration.store.helpers import (
    add_dispatched,
    add_finished,
    add_job,
    add_running,
    count,
    secs,
)


@pytest.fixture
def flow(database: Database) -> FlowStore:
    return FlowStore(database)


def _beat(job_store, now, *, running=(), worker: str = "w1") -> None:
    job_store.heartbeat(Worker(worker, "h", 1, ["default"], [], 4, 1), [], 30, now=now,
                        running=running)


def _limits(flow, now) -> dict[tuple[str, str], LimitInfo]:
    return {(x.scope, x.key): x for x in flow.limits(now=now)}


def _use(limit: LimitInfo) -> tuple[int | None, int]:
    return limit.in_flight, limit.lingering


def test_a_cancelled_running_job_keeps_its_slots_until_its_handler_returns(
        job_store, flow, db, now):
    _beat(job_store, now)
    lease = add_running(db, now, kind="k", tenant="t", concurrency_key="ck")
    flow.set_limit("kind", "k", max_running=2, rate_per_second=None, burst=None)
    flow.set_limit("tenant", "t", max_running=2, rate_per_second=None, burst=None)
    flow.set_limit("kind_key", "k", max_running=1, rate_per_second=None, burst=None)
    assert job_store.cancel_job(lease.job_id, now=now) is not None
    limits = _limits(flow, now)
    assert _use(limits["kind", "k"]) == (1, 1), "the handler may still run: its slot holds"
    assert _use(limits["tenant", "t"]) == (1, 1)
    assert _use(limits["kind_key", "k"]) == (1, 1)
    assert limits["kind_key", "k"].keys_at_limit == 1
    key = flow.key_limit("k", "ck", now=now)
    assert key is not None and _use(key) == (1, 1)
    assert flow.key_limit("k", "other", now=now).in_flight == 0
    assert count(db, "tock_lingering", "reason = 'cancelled'") == 1

    _beat(job_store, now + secs(1), running=[lease])
    assert _use(_limits(flow, now + secs(1))["kind", "k"]) == (1, 1), "still running here"
    _beat(job_store, now + secs(1))
    assert _use(_limits(flow, now + secs(1))["kind", "k"]) == (1, 1), \
        "written a second ago: the claim may not be tracked yet when a cancel races it"
    _beat(job_store, now + secs(3))
    assert _use(_limits(flow, now + secs(3))["kind", "k"]) == (0, 0), "returned: slot free"
    assert count(db, "tock_lingering") == 0


def test_a_scheduled_or_dispatched_job_cancelled_leaves_no_lingering_row(
        job_store, db, now):
    _beat(job_store, now)
    waiting = add_job(db, run_at=now)
    sent, _ = add_dispatched(db, now)
    for job_id in (waiting, sent):
        assert job_store.cancel_job(job_id, now=now) is not None
    assert count(db, "tock_lingering") == 0


def test_a_dead_workers_lingering_handlers_are_freed_as_its_jobs_would_be_rescued(
        job_store, flow, db, now):
    _beat(job_store, now)
    lease = add_running(db, now, kind="k")
    flow.set_limit("kind", "k", max_running=1, rate_per_second=None, burst=None)
    job_store.cancel_job(lease.job_id, now=now)
    assert job_store.forget_dead_lingering(now + secs(29)) == [], "its lease holds"
    assert job_store.forget_dead_lingering(now + secs(31), since_back=10) == [], \
        "back from an outage 10 s ago: the worker has not had a whole lease to renew"
    assert _use(_limits(flow, now + secs(31))["kind", "k"]) == (1, 1), "counted until then"
    assert job_store.forget_dead_lingering(now + secs(31), since_back=31) == [
        ("w1", lease.job_id)]
    assert _use(_limits(flow, now + secs(31))["kind", "k"]) == (0, 0), \
        "its worker is gone, and its threads with it"


def test_a_stopping_worker_takes_its_lingering_rows_with_it(job_store, db, now):
    _beat(job_store, now)
    _beat(job_store, now, worker="w2")
    for worker in ("w1", "w2"):
        job_store.cancel_job(add_running(db, now, worker=worker).job_id, now=now)
    job_store.stop_worker("w1", now=now)
    assert db.execute("SELECT worker FROM tock_lingering").fetchall() == [("w2",)]


def test_a_stuck_handler_counts_once_while_detached_and_after_its_job_is_rescued(
        job_store, flow, db, now):
    _beat(job_store, now)
    lease = add_running(db, now, kind="k")
    flow.set_limit("kind", "k", max_running=3, rate_per_second=None, burst=None)
    assert job_store.detach_lease(lease, "w1", 30, now=now)
    job_store.record_lingering("w1", [(lease, "stuck")])
    assert _use(_limits(flow, now)["kind", "k"]) == (1, 0), \
        "its job still runs here under the same attempt: one slot, not two"
    db.execute("UPDATE tock_jobs SET state = 'retrying', lease_owner = NULL, "
               "lease_detached = false WHERE id = %s", (lease.job_id,))
    assert _use(_limits(flow, now)["kind", "k"]) == (1, 1), \
        "rescued: the retry waits, and the thread that still runs holds the slot"
    db.execute("UPDATE tock_jobs SET state = 'running', lease_owner = 'w2', attempt = 2 "
               "WHERE id = %s", (lease.job_id,))
    assert _use(_limits(flow, now)["kind", "k"]) == (2, 1), "the retry runs beside it"


def test_record_lingering_finds_the_job_in_the_history_and_writes_once(
        job_store, db, now):
    _beat(job_store, now)
    job_id = add_finished(db, state="dead", finished_at=now, kind="gone", tenant="t")
    lease = Lease(job_id, 1, uuid4())
    job_store.record_lingering("w1", [(lease, "lease_lost")])
    job_store.record_lingering("w1", [(lease, "stuck")])
    row = db.execute("SELECT kind, tenant, reason FROM tock_lingering").fetchall()
    assert row == [("gone", "t", "lease_lost")]


def test_a_bulk_cancel_of_running_jobs_writes_their_lingering_rows(
        operator_store, job_store, db, now):
    _beat(job_store, now)
    running = add_running(db, now, kind="bulk")
    cancelled = operator_store.bulk_batch("cancel", JobFilter.of(kind="bulk"),
                                          action_states("cancel"), after=0, up_to_id=None,
                                          batch_size=10)
    assert cancelled == [running.job_id]
    assert db.execute("SELECT worker, job_id, attempt, kind, reason FROM tock_lingering"
                      ).fetchall() == [("w1", running.job_id, 1, "bulk", "cancelled")]
    assert db.execute("SELECT attempt, worker, outcome::text FROM tock_history_attempts "
                      "WHERE job_id = %s", (running.job_id,)).fetchall() == [
        (1, "w1", "cancelled")], "the attempt it was running is kept, ended by the cancel"
