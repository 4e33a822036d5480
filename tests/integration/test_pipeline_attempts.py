"""The core pipeline, one step at a time, through the attempts of a job: retries with
backoff, permanent errors, unknown kinds and timeouts; leases that expire, heartbeats that
keep them, the fencing of a stale worker, cancellation and the release on shutdown. Real
timer and consumer code, real Postgres, real SQS (LocalStack). Time is pinned through
`now=` (timer) and `clock` (consumer), so lease, backoff and due-time logic is tested
without waiting."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, timedelta

from shared.core.errors import Permanent
from shared.core.reports import Worker
from shared.core.states import AttemptOutcome, JobState
from shared.store.rows import Claim
from tests.integration.readings import metric, queue_empty
from tests.integration.store.helpers import add_running
from tests.support.drive import Clock, db_now, dispatch, receive, run_all
from tests.support.wait import wait_for


def test_failures_retry_with_backoff_then_go_dead(client, db, timer, registry, consumers,
                                                  clock):
    calls = []

    def always_fails(payload, ctx):
        calls.append(ctx.attempt)
        raise RuntimeError(f"boom {ctx.attempt}")

    registry.add("fails", always_fails)
    job = client.schedule("fails", max_attempts=3)
    consumer = consumers(clock)
    for attempt in (1, 2, 3):
        assert dispatch(timer, clock.now) == 1
        run_all(consumer, receive(consumer, 1))
        row = client.get(job.id)
        if attempt < 3:
            assert row.state is JobState.RETRYING
            delay = (row.run_at - clock.now).total_seconds()
            assert 0.5 <= delay <= 1, "equal jitter: at least half of the 1 s step (and cap)"
            clock.advance(2)
    final = client.get(job.id, with_attempts=True)
    assert calls == [1, 2, 3]
    assert final.state is JobState.DEAD
    assert "giving up" in (final.last_error or "")
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED] * 3
    assert [a.attempt for a in final.attempts] == [1, 2, 3]
    assert final.attempts[-1].traceback and "RuntimeError: boom 3" in final.attempts[-1].traceback


def test_permanent_error_is_not_retried(client, timer, registry, consumers, clock):
    def refuses(payload, ctx):
        raise Permanent("bad address")

    registry.add("perm", refuses)
    job = client.schedule("perm", max_attempts=5)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD and final.attempt == 1
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.PERMANENT]
    assert "bad address" in (final.last_error or "")


def test_expired_lease_is_reclaimed_and_stale_worker_cannot_overwrite(
        client, db, timer, registry, consumers, clock):
    results = []
    registry.add("work", lambda payload, ctx: results.append(ctx.attempt))
    job = client.schedule("work", max_attempts=3)
    worker_a = consumers(clock)
    dispatch(timer, clock.now)
    stale_entries = receive(worker_a, 1)  # A claims, then stalls (no heartbeat)
    assert client.get(job.id).lease_owner == worker_a.worker_id

    assert timer.run_once(clock.now + timedelta(seconds=29)).rescued == 0, "lease still valid"
    rescue_at = clock.now + timedelta(seconds=31)
    assert timer.run_once(rescue_at).rescued == 1
    rescued = client.get(job.id)
    assert rescued.state is JobState.RETRYING and "stopped heartbeating" in rescued.last_error
    # When, as people read times elsewhere (the lease ran out 30 s after the claim).
    expired = (clock.now + timedelta(seconds=30)).astimezone(UTC)
    assert rescued.last_error.startswith(
        f"lease expired at {expired:%Y-%m-%d %H:%M:%S} UTC: worker "), rescued.last_error

    clock_b = Clock(rescue_at + timedelta(seconds=5))
    worker_b = consumers(clock_b)
    assert dispatch(timer, clock_b.now) == 1
    run_all(worker_b, receive(worker_b, 1))
    assert client.get(job.id).state is JobState.SUCCEEDED

    # A wakes up and finishes: its fenced completion matches nothing.
    stale_before = metric("tock_stale_completions_total")
    run_all(worker_a, stale_entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED and final.attempt == 2
    assert [(a.attempt, a.worker, a.outcome) for a in final.attempts] == [
        (1, worker_a.worker_id, AttemptOutcome.LEASE_EXPIRED),
        (2, worker_b.worker_id, AttemptOutcome.SUCCEEDED),
    ]
    assert results == [2, 1], "A ran too (at-least-once), but only B's result was written"
    assert metric("tock_stale_completions_total") == stale_before + 1


def test_lease_expiry_on_the_last_attempt_is_dead(client, timer, registry, consumers, clock):
    registry.add("work", lambda payload, ctx: None)
    job = client.schedule("work", max_attempts=1)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    receive(consumer, 1)
    assert timer.run_once(clock.now + timedelta(seconds=31)).rescued == 1
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.LEASE_EXPIRED]


def test_heartbeats_keep_a_job_alive_past_its_lease(client, timer, registry, consumers, clock):
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 1)
    started = clock.now
    for _ in range(4):  # 4 beats, 20 s apart: 80 s in all on a 30 s lease
        clock.advance(20)
        assert consumer.heartbeat_once() == (1, 0)
        assert timer.run_once(clock.now + timedelta(seconds=25)).rescued == 0
    assert clock.now - started > timedelta(seconds=30)
    run_all(consumer, entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.SUCCEEDED]


def test_cancelling_a_running_job_signals_the_handler_and_drops_its_result(
        client, timer, registry, consumers, clock, caplog):
    caplog.set_level(logging.INFO, logger="tock.consumer")
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 1)
    item = entries[0][0]
    client.cancel(job.id)
    assert consumer.heartbeat_once() == (0, 1)
    assert item.context.cancelled.is_set() and item.lease_lost
    run_all(consumer, entries)
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.CANCELLED
    # The attempt it ran is kept, ended by the cancel; the handler's result is not written.
    [attempt] = final.attempts
    assert (attempt.attempt, attempt.worker, attempt.outcome) == (
        1, consumer.worker_id, AttemptOutcome.CANCELLED)
    assert attempt.started_at is not None and attempt.finished_at == final.finished_at
    assert "cancelled while it ran" in (attempt.error or "")
    # An operator's cancel is no alarm: the lost claim and the discarded result are INFO.
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "result_discarded"]
    assert line.levelname == "INFO" and "cancelled while it ran" in line.fields["detail"]
    events = [(r.levelname, r.event, r.fields["job_id"]) for r in caplog.records
              if getattr(r, "event", "") in ("cancelled_by_operator", "lease_lost")]
    assert events == [("INFO", "cancelled_by_operator", job.id)]


def test_a_lease_lost_to_expiry_is_a_warning(client, timer, registry, consumers, clock,
                                             caplog):
    caplog.set_level(logging.INFO, logger="tock.consumer")
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long", max_attempts=3)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    entries = receive(consumer, 1)
    assert timer.run_once(clock.now + timedelta(seconds=31)).rescued == 1  # no heartbeat
    clock.advance(31)
    assert consumer.heartbeat_once() == (0, 1)
    assert entries[0][0].context.cancelled.is_set()
    events = [(r.levelname, r.event, r.fields["job_id"], r.fields["cause"])
              for r in caplog.records
              if getattr(r, "event", "") in ("cancelled_by_operator", "lease_lost")]
    assert events == [("WARNING", "lease_lost", job.id, "taken_over")]


def test_a_claim_lost_to_a_database_crash_is_not_called_taken_over(
        client, timer, registry, consumers, clock, caplog, db):
    caplog.set_level(logging.INFO, logger="tock.consumer")
    registry.add("long", lambda payload, ctx: None)
    job = client.schedule("long")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    receive(consumer, 1)
    # What a crash leaves of a claim whose asynchronous commit was lost: the row as the
    # timer's dispatch left it, with the token this worker claimed it by.
    db.execute("UPDATE tock_jobs SET state = 'dispatched', attempt = attempt - 1, "
               "lease_owner = NULL, lease_expires_at = NULL, started_at = NULL "
               "WHERE id = %s", (job.id,))
    assert consumer.heartbeat_once() == (0, 1)
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "lease_lost"]
    assert (line.levelname, line.fields["cause"]) == ("WARNING", "claim_lost")
    assert "did not survive a database restart" in line.fields["detail"]


def test_unknown_kind_is_retried_with_backoff_then_runs_where_a_handler_is(
        client, timer, registry, consumers, clock):
    # A rolling deploy: this consumer does not know the new kind yet; the next one does.
    registry.add("known", lambda payload, ctx: None)
    job = client.schedule("new.kind", max_attempts=3)
    old = consumers(clock)
    dispatch(timer, clock.now)
    run_all(old, receive(old, 1))
    waiting = client.get(job.id, with_attempts=True)
    assert waiting.state is JobState.RETRYING
    assert "no handler for kind 'new.kind'" in waiting.last_error and "known" in waiting.last_error
    delay = (waiting.run_at - clock.now).total_seconds()
    assert 15 <= delay <= 30, "unknown_kind_backoff_seconds (30) with its floor of half"
    assert [a.outcome for a in waiting.attempts] == [AttemptOutcome.NO_HANDLER]
    registry.add("new.kind", lambda payload, ctx: None)
    new = consumers(Clock(clock.advance(31)))
    dispatch(timer, clock.now)
    run_all(new, receive(new, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED and final.attempt == 2


def test_unknown_kind_goes_dead_after_its_last_attempt(client, timer, registry, consumers,
                                                       clock):
    job = client.schedule("mystery", max_attempts=1)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.DEAD
    assert "no handler for kind 'mystery'" in final.last_error
    assert "giving up" in final.last_error
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.NO_HANDLER]


def test_handler_past_its_timeout_is_signalled_and_counts_as_failure(
        client, timer, registry, consumers):
    registry.add("hangs", lambda payload, ctx: ctx.cancelled.wait(30))
    job = client.schedule("hangs", timeout=0.3, max_attempts=2)
    consumer = consumers()
    dispatch(timer)
    consumer.start()
    try:
        wait_for(lambda: client.get(job.id).state is JobState.RETRYING, timeout=20)
    finally:
        consumer.stop_flag.set()
        consumer.shutdown()
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert "timed out after 0.3 s" in final.last_error


def test_shutdown_releases_unfinished_jobs_for_others_at_once(
        client, db, timer, transport, registry, consumers):
    started = threading.Event()

    def stubborn(payload, ctx):
        started.set()
        ctx.cancelled.wait(30)

    registry.add("long", stubborn)
    job = client.schedule("long")
    consumer = consumers(shutdown_grace_seconds=0.5)
    dispatch(timer)
    consumer.start()
    assert started.wait(20)
    consumer.stop_flag.set()
    consumer.shutdown()
    released = client.get(job.id, with_attempts=True)
    assert released.state is JobState.SCHEDULED
    assert released.attempt == 0, "a release gives the attempt back"
    assert released.lease_owner is None
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert wait_for(lambda: queue_empty(transport), message="released message deleted")
    assert dispatch(timer) == 1, "due again at once"


def test_shutdown_writes_an_outcome_still_queued_and_releases_the_job_not_run(
        client, timer, registry, consumers):
    """At shutdown, a job whose handler returned but whose outcome no completer wrote yet
    is written as it ended, not released (and run again); the job not run is released."""
    registry.add("quick", lambda payload, ctx: None)
    for _ in range(2):
        client.schedule("quick")
    consumer = consumers()
    dispatch(timer)
    ran, not_run = receive(consumer, 2)
    consumer.heartbeat_once()  # the worker's row, as its heartbeat loop would have made
    consumer.executor.run(ran)  # its outcome waits in `done`: no completer thread runs
    consumer._release_unfinished()  # shutdown's step once its grace is over
    while consumer.complete_pending():
        pass
    assert client.get(ran.item.job_id).state is JobState.SUCCEEDED
    released = client.get(not_run.item.job_id, with_attempts=True)
    assert released.state is JobState.SCHEDULED
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]


class _Ticks:
    """The rescuer's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


def _expired_worker(db, store, worker: str) -> int:
    """A running job of `worker`, whose 30 s lease (and the job's) ran out 10 s ago by the
    database clock; returns the job's id."""
    now = db_now(db)
    lease = add_running(db, now, worker=worker, lease_until=now - timedelta(seconds=50))
    store.heartbeat(Worker(worker, "h", 1, ["default"], [], 4, 1), [lease], 30,
                    now=now - timedelta(seconds=40))
    return lease.job_id


def test_a_worker_gets_a_whole_lease_to_renew_after_an_outage_or_a_timer_start(db, timer):
    """On the database clock, a lease runs on while the database is away and no worker can
    renew it. So after this timer starts, and after any of its statements finds the
    database unavailable, a worker's jobs are rescued only once the worker has had a whole
    lease of its own (30 s here) to renew and did not."""
    rescuer = timer.rescuer
    ticks = rescuer.monotonic = _Ticks()
    first = _expired_worker(db, rescuer.store, "w1")
    assert rescuer.rescue_expired() == 0, "a fresh timer may not have seen the outage"
    ticks.at += 29
    assert rescuer.rescue_expired() == 0
    ticks.at += 2
    assert rescuer.rescue_expired() == 1
    assert db.execute("SELECT state::text FROM tock_jobs_all WHERE id = %s",
                      (first,)).fetchone() == ("retrying",)
    second = _expired_worker(db, rescuer.store, "w2")
    assert rescuer.store.database is not None
    rescuer.store.database.unavailable_at = ticks.at  # a statement found it away
    ticks.at += 1
    assert rescuer.rescue_expired() == 0, "back a second ago: w2 may yet renew"
    ticks.at += 29
    assert rescuer.rescue_expired() == 0
    ticks.at += 1.5
    assert rescuer.rescue_expired() == 1
    assert db.execute("SELECT state::text FROM tock_jobs_all WHERE id = %s",
                      (second,)).fetchone() == ("retrying",)


def test_a_claim_its_worker_never_held_is_let_go_and_retried(
        client, timer, registry, consumers, clock):
    # The claim committed in Postgres, but its reply was lost with the connection: the job
    # is running under this live worker's lease, which every beat renews, yet the worker
    # never held it. Without the release it would stay running for ever.
    ran = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.attempt))
    job = client.schedule("work", max_attempts=3)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    token = client.get(job.id).dispatch_token
    assert token is not None
    claimed = consumer.pipe.store.claim_messages(
        [Claim(job.id, token, 3, 60)], consumer.worker_id, 30, clock.now)
    assert [c.id for c in claimed] == [job.id]
    claimed_at = clock.now
    for _ in range(3):  # a live worker, beating every 20 s for 60 s of a 30 s lease
        clock.advance(20)
        consumer.heartbeat_once()
        assert timer.run_once(clock.now + timedelta(seconds=5)).rescued == 0
    clock.advance(20)  # two leases after the claim: let go, for one more lease
    consumer.heartbeat_once()
    row = client.get(job.id)
    assert row.state is JobState.RUNNING and row.lease_expires_at == clock.now + timedelta(
        seconds=30)
    assert timer.run_once(clock.now + timedelta(seconds=29)).rescued == 0
    rescue_at = clock.now + timedelta(seconds=31)
    assert timer.run_once(rescue_at).rescued == 1
    assert client.get(job.id).state is JobState.RETRYING

    clock_b = Clock(rescue_at + timedelta(seconds=5))
    worker_b = consumers(clock_b)
    assert dispatch(timer, clock_b.now) == 1
    run_all(worker_b, receive(worker_b, 1))
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.SUCCEEDED and ran == [2]
    assert [(a.attempt, a.outcome) for a in final.attempts] == [
        (1, AttemptOutcome.LEASE_EXPIRED), (2, AttemptOutcome.SUCCEEDED)]
    assert clock.now - claimed_at == timedelta(seconds=80)
