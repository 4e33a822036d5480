"""A concurrency slot follows the handler, not only the job row: a running job cancelled by
an operator, or recovered elsewhere after its thread handler ignored its deadline, leaves
its handler running on the worker, and no other job of the limit is dispatched into that
slot until the handler returns. Real consumer, timer, Postgres and SQS (LocalStack)."""

from __future__ import annotations

import threading
from typing import Any

from shared.core.states import JobState
from shared.ops import explain
from tests.support.drive import dispatch
from tests.support.wait import wait_for


def _story(client: Any, operator_store: Any, job_id: int) -> explain.Explanation:
    row = client.get(job_id)
    with operator_store.transaction() as tx:
        return explain.explain(row, explain.gather(tx, row))


def _lingering(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM tock_lingering").fetchone()[0])


def test_a_cancelled_handler_that_runs_on_keeps_its_slot_until_it_returns(
        client, db, timer, registry, running, operator_store):
    started, let_go = threading.Event(), threading.Event()
    contexts: list[Any] = []

    def ignores_cancel(payload: dict[str, Any], ctx: Any) -> None:
        if (payload or {}).get("first"):
            contexts.append(ctx)
            started.set()
            let_go.wait(60)  # ignores ctx.cancelled, as a thread handler may

    registry.add("k", ignores_cancel)
    running(concurrency=2, lease_seconds=2, heartbeat_seconds=0.4,
            visibility_timeout_seconds=2)
    client.set_limit("kind", "k", max_running=1)
    first = client.schedule("k", {"first": True})
    dispatch(timer)
    assert started.wait(30)
    second = client.schedule("k")
    try:
        client.cancel(first.id)
        assert dispatch(timer) == 0, "the cancel freed no slot: its handler still runs"
        wait_for(contexts[0].cancelled.is_set, message="the handler was told")
        assert dispatch(timer) == 0, "told is not stopped"
        assert client.get(second.id).state is JobState.SCHEDULED
        story = _story(client, operator_store, second.id)
        assert "(1/1 running)" in story.summary, story.summary
        assert any("held by handlers still running" in d for d in story.details), story.details
    finally:
        let_go.set()
    wait_for(lambda: _lingering(db) == 0, message="a heartbeat saw the handler return")
    wait_for(lambda: dispatch(timer) >= 0 and client.get(second.id).state is JobState.SUCCEEDED,
             message="the slot came back when the handler returned")
    assert client.get(first.id).state is JobState.CANCELLED


def test_a_stuck_handler_keeps_its_slot_after_its_job_is_recovered_elsewhere(
        client, db, timer, registry, running):
    started, let_go = threading.Event(), threading.Event()

    def stuck_once(payload: dict[str, Any], ctx: Any) -> None:
        if (payload or {}).get("stuck") and not started.is_set():
            started.set()
            let_go.wait(60)  # ignores its deadline

    registry.add("k", stuck_once)
    running(concurrency=2, lease_seconds=2, heartbeat_seconds=0.4,
            visibility_timeout_seconds=2)
    client.set_limit("kind", "k", max_running=1)
    stuck = client.schedule("k", {"stuck": True}, timeout=0.2, max_attempts=3)
    dispatch(timer)
    assert started.wait(30)
    other = client.schedule("k")
    try:
        wait_for(lambda: dispatch(timer) >= 0 and client.get(stuck.id).state in (
            JobState.RETRYING, JobState.SCHEDULED), message="the stuck job was rescued")
        assert _lingering(db) == 1
        assert dispatch(timer) == 0, ("the consumer has a free thread, but the limit's one "
                                      "slot is the stuck handler's")
        assert client.get(other.id).state is JobState.SCHEDULED
    finally:
        let_go.set()
    for job in (stuck, other):
        wait_for(lambda j=job: dispatch(timer) >= 0
                 and client.get(j.id).state is JobState.SUCCEEDED,
                 message=f"job {job.id} ran once the handler returned")
    assert _lingering(db) == 0
