"""Thread isolation cannot kill a handler: one that ignores its deadline by more than a
lease is reported stuck (gauge, log line, `explain`), its job is detached so it is
recovered elsewhere, and its thread keeps its slot until the handler finally returns.
Real consumer, real Postgres and SQS."""

from __future__ import annotations

import logging
import threading
import time

from shared.core.states import AttemptOutcome, JobState
from shared.ops import explain
from tests.integration.readings import metric
from tests.support.drive import db_now, dispatch, receive
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


def test_a_consumer_whose_every_slot_is_stuck_is_not_ready_then_stops(
        client, timer, registry, running, operator_store):
    """Nothing can free a stuck thread but a restart: with every slot stuck the consumer
    says it takes no work (readiness, `explain` of a job waiting in SQS), and past
    TOCK_STUCK_EXIT_SECONDS it stops, non-zero, for its orchestrator to restart it."""
    started, let_go = threading.Semaphore(0), threading.Event()

    def never_returns(payload, ctx):
        started.release()
        let_go.wait(60)

    registry.add("stuck", never_returns)
    registry.add("next", lambda payload, ctx: None)
    consumer = running(concurrency=2, lease_seconds=1, heartbeat_seconds=0.2,
                       visibility_timeout_seconds=2, stuck_exit_seconds=3,
                       shutdown_grace_seconds=0.5)
    try:
        for _ in range(2):
            client.schedule("stuck", timeout=0.2, max_attempts=1)
        dispatch(timer)
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        waiting = client.schedule("next")
        dispatch(timer)
        def unready_reason() -> str | None:
            ok, reason = consumer.supervisor.ready()
            return None if ok else reason

        unready = wait_for(unready_reason, message="not ready with every slot stuck")
        assert "every handler slot (2) is held by a handler stuck past its deadline" \
            in unready
        row = client.get(waiting.id)
        assert row.state is JobState.DISPATCHED
        story = explain.explain(row, explain.gather(operator_store, row))
        assert any("every one of their handler slots was busy" in d and "(2/2)" in d
                   for d in story.details), story.details
        wait_for(lambda: consumer.supervisor.fatal, timeout=30,
                 message="the consumer stopping past TOCK_STUCK_EXIT_SECONDS")
        assert "TOCK_STUCK_EXIT_SECONDS=3" in consumer.supervisor.fatal
        # A stop on purpose, said as one: not a crash (a walkthrough read it as one).
        assert consumer.supervisor.fatal.startswith("loop heartbeat stopped the process: ")
        assert consumer.supervisor.exit_code != 0 and not consumer.supervisor.live()[0]
    finally:
        let_go.set()


def test_explain_says_a_stuck_handler_not_a_dead_worker_lost_the_job(
        client, timer, registry, running, operator_store, db):
    """A thread handler that never returns, on a worker that stays alive: every stage of
    `explain` (detached, lease expired, retrying, dead) names the stuck handler, and none
    says the worker stopped heartbeating, while the workers listing shows it alive."""
    started, let_go = threading.Semaphore(0), threading.Event()

    def never_returns(payload, ctx):
        started.release()
        let_go.wait(60)

    registry.add("stuck", never_returns)
    consumer = running(concurrency=2, lease_seconds=2, heartbeat_seconds=0.4,
                       visibility_timeout_seconds=2)
    job = client.schedule("stuck", timeout=0.2, max_attempts=2)

    def story() -> explain.Explanation:
        row = client.get(job.id, with_attempts=True)
        with operator_store.transaction() as tx:
            return explain.explain(row, explain.gather(tx, row))

    def worker_status() -> str:
        found = {w.id: w.status for w in operator_store.workers(stale_after_seconds=30)}
        return found[consumer.worker_id]

    try:
        dispatch(timer)
        assert started.acquire(timeout=30)
        wait_for(lambda: client.get(job.id).lease_detached, message="the job detached")
        running_story = story()
        assert running_story.summary.startswith("Stuck: its handler has run past its 200 ms "
                                                "timeout"), running_story.summary
        assert f"worker {consumer.worker_id}" in running_story.summary
        assert any(f"Worker {consumer.worker_id} is alive" in d
                   for d in running_story.details), running_story.details

        # Its own lease runs out; the timer has not rescued it yet.
        expires = client.get(job.id).lease_expires_at
        wait_for(lambda: db_now(db) > expires, message="the detached lease expired")
        expired = story()
        assert "stopped heartbeating" not in expired.summary, expired.summary
        assert "ran past its 200 ms timeout and did not return" in expired.summary
        assert "A timer rescues it" in expired.next_step
        assert worker_status() == "alive"

        wait_for(lambda: timer.run_once().rescued, message="the rescue")
        retrying = story()
        assert client.get(job.id).state is JobState.RETRYING
        assert "stopped heartbeating" not in retrying.summary, retrying.summary
        assert "attempt 1 of 2 was lost: its handler ran past its 200 ms timeout" in (
            retrying.summary)
        lost = client.get(job.id, with_attempts=True).attempts[0].error or ""
        assert f"worker {consumer.worker_id} let the job go" in lost, \
            "the attempt's own record does not blame a dead worker either"

        wait_for(lambda: dispatch(timer) >= 0 and client.get(job.id).state is JobState.DEAD,
                 message="the second attempt lost too")
        dead = story()
        assert dead.summary.startswith("Dead since "), dead.summary
        assert "stopped heartbeating" not in dead.summary, dead.summary
        assert ("its last attempt (2 of 2) was lost: its handler ran past its 200 ms "
                "timeout and did not return") in dead.summary
        assert f"worker {consumer.worker_id} kept heartbeating" in dead.summary
        assert worker_status() == "alive"
    finally:
        let_go.set()


def test_a_handler_that_returned_is_not_timed_out_while_its_outcome_waits(
        client, timer, registry, consumers, clock, caplog):
    # Its outcome's write can wait past the deadline (a row lock, a stalled Postgres, a
    # hung delete): that is no timeout of the handler, which returned in time.
    registry.add("quick", lambda payload, ctx: None)
    job = client.schedule("quick", timeout=0.2)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    [entry] = receive(consumer, 1)
    consumer.executor.run(entry)  # returned; its outcome not written yet
    item = entry.item
    wait_for(lambda: time.monotonic() - item.started > item.timeout_seconds,
             message="past the deadline")
    caplog.set_level(logging.WARNING, logger="tock.consumer")
    consumer.check_timeouts()
    assert not item.timed_out and not item.context.cancelled.is_set()
    assert not [r for r in caplog.records if getattr(r, "event", None) == "job_timeout"]
    while consumer.complete_pending():
        pass
    assert client.get(job.id).state is JobState.SUCCEEDED
