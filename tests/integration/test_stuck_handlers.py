"""Thread isolation cannot kill a handler: one that ignores its deadline by more than a
lease is reported stuck (gauge, log line, `explain`), its job is detached so it is
recovered elsewhere, and its thread keeps its slot until the handler finally returns.
Real consumer, real Postgres and SQS."""

from __future__ import annotations

import threading

from shared.core.states import AttemptOutcome, JobState
from shared.ops import explain
from tests.integration.readings import metric
from tests.support.drive import dispatch
from tests.support.wait import wait_for


def test_a_stuck_thread_is_reported_and_keeps_its_slot_until_it_returns(
        client, timer, registry, running, operator_store):
    started, let_go = threading.Event(), threading.Event()

    def ignores_its_deadline(payload, ctx):
        started.set()
        let_go.wait(60)

    registry.add("stuck", ignores_its_deadline)
    registry.add("next", lambda payload, ctx: None)
    consumer = running(concurrency=1, lease_seconds=2, heartbeat_seconds=0.4,
                       visibility_timeout_seconds=2)
    before = metric("tock_stuck_handlers", kind="stuck")
    stuck = client.schedule("stuck", timeout=0.2, max_attempts=1)
    dispatch(timer)
    assert started.wait(30)
    waiting = client.schedule("next")
    dispatch(timer)
    try:
        wait_for(lambda: metric("tock_stuck_handlers", kind="stuck") == before + 1,
                 message="the stuck handler counted")
        row = client.get(stuck.id)
        assert row.state is JobState.RUNNING and row.lease_detached
        assert client.get(waiting.id).state is JobState.DISPATCHED, "no free slot for it"
        story = explain.explain(row, explain.gather(operator_store, row))
        assert any("stuck past its deadline" in d and "thread is still busy" in d
                   for d in story.details), story.details
    finally:
        let_go.set()
    wait_for(lambda: client.get(waiting.id).state is JobState.SUCCEEDED,
             message="the slot came back when the handler returned")
    assert metric("tock_stuck_handlers", kind="stuck") == before
    final = client.get(stuck.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert "returned after its deadline" in final.last_error
    assert consumer.supervisor.live()[0]
