"""A job its worker gives up (a handler raising `Abandon`, an outcome Postgres refuses)
is let go as a dead worker's would be, though the worker lives on: its lease is detached
from the worker's, so it expires on its own and the timer recovers it, while the worker's
heartbeat keeps its other jobs. Step by step, injected clock, real Postgres and SQS."""

from __future__ import annotations

from datetime import timedelta

from consumer import Abandon
from shared.core.states import AttemptOutcome, JobState
from tests.support.drive import dispatch, receive, run_all


def test_an_abandoned_job_expires_while_its_worker_keeps_beating(
        client, timer, registry, consumers, clock):
    ran: list[int] = []

    def walks_away_once(payload, ctx):
        ran.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Abandon()

    registry.add("drill", walks_away_once)
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("drill", max_attempts=3)
    other = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 2)
    drill = [e for e in entries if e.item.job_id == job.id]
    kept = [e for e in entries if e.item.job_id == other.id]
    run_all(consumer, drill)
    row = client.get(job.id)
    assert row.state is JobState.RUNNING and row.lease_detached, "let go, not just forgotten"
    assert not consumer.pipe.tracker.holds(drill[0].item)

    # The worker lives on and beats (holding the other job): the abandoned one expires
    # one lease after it was let go all the same.
    consumer.lease_keeper.beat(clock.now + timedelta(seconds=25))
    assert timer.run_once(clock.now + timedelta(seconds=29)).rescued == 0
    assert timer.run_once(clock.now + timedelta(seconds=31)).rescued == 1
    assert client.get(other.id).state is JobState.RUNNING, "the worker's lease still holds"
    rescued = client.get(job.id, with_attempts=True)
    assert rescued.state is JobState.RETRYING
    assert [a.outcome for a in rescued.attempts] == [AttemptOutcome.LEASE_EXPIRED]
    run_all(consumer, kept)


def test_an_outcome_postgres_refuses_lets_the_job_go_to_be_recovered(
        client, db, timer, registry, consumers, clock):
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work", max_attempts=3)
    # Postgres refuses this job's move to the history, whatever the attempt's text.
    db.execute(f"ALTER TABLE tock_history_jobs ADD CONSTRAINT refuse_{job.id} "
               f"CHECK (id <> {job.id})")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 1))
    row = client.get(job.id)
    assert row.state is JobState.RUNNING and row.lease_detached
    assert len(consumer.pipe.tracker) == 0
    consumer.lease_keeper.beat(clock.now + timedelta(seconds=25))
    assert timer.run_once(clock.now + timedelta(seconds=31)).rescued == 1
    assert client.get(job.id).state is JobState.RETRYING
