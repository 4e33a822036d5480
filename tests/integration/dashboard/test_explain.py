"""`shared.explain`: every state's plain-words story with a pinned clock, plus `gather()`
against a real Postgres (workers, jobs due ahead, a paused schedule)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.core.jobs import Attempt, Job
from shared.core.reports import WorkerInfo
from shared.core.states import AttemptOutcome, JobState
from shared.ops import explain
from shared.ops.explain import Context, duration
from tests.support.drive import dispatch, receive

NOW = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)


def job(state: JobState, **kw) -> Job:
    base = dict(id=7, kind="email", queue="default", payload={}, priority=0, state=state,
                run_at=NOW, attempt=0, max_attempts=3, timeout_seconds=30.0, unique_key=None,
                tenant=None, lease_owner=None, lease_expires_at=None, dispatch_token=None,
                dispatched_at=None, last_error=None, created_at=NOW - timedelta(hours=1),
                updated_at=NOW, started_at=None, finished_at=None)
    base.update(kw)
    return Job(**base)


def attempt(n: int, outcome: AttemptOutcome, error: str | None = None,
            worker: str = "w1") -> Attempt:
    return Attempt(n, worker, NOW - timedelta(seconds=10), NOW - timedelta(seconds=5), outcome,
                   error, None)


def worker(status: str = "alive", age: float = 1.0,
           lease_until: datetime | None = None) -> WorkerInfo:
    return WorkerInfo("w1", "host", 1, ["default"], ["email"], 4, 1, NOW - timedelta(hours=1),
                      NOW - timedelta(seconds=age), None, age, lease_until, status)


def test_durations_read_like_people_write_them():
    assert [duration(s) for s in (0.25, 3, 42, 65, 3600, 3720, 90000)] == [
        "250 ms", "3 s", "42 s", "1 min 5 s", "1 h", "1 h 2 min", "1 d 1 h"]


def test_scheduled_not_due_and_due():
    e = explain.explain(job(JobState.SCHEDULED, run_at=NOW + timedelta(minutes=5)),
                        Context(NOW))
    assert e.summary == "Not due until 2026-12-02 15:05:00 UTC (in 5 min)."
    assert e.can_cancel and not e.can_retry
    e = explain.explain(job(JobState.SCHEDULED, run_at=NOW - timedelta(seconds=30)),
                        Context(NOW, due_ahead=12))
    assert e.summary.startswith("Due since 2026-12-02 14:59:30 UTC (30 s ago) and waiting "
                                "for a timer")
    assert "12 due job(s) go before it" in e.summary


def test_retrying_in_backoff_names_the_error():
    j = job(JobState.RETRYING, attempt=1, run_at=NOW + timedelta(seconds=8),
            attempts=(attempt(1, AttemptOutcome.FAILED, "ConnectionError: refused"),))
    e = explain.explain(j, Context(NOW))
    assert e.summary == ("In backoff until 2026-12-02 15:00:08 UTC (in 8 s) after attempt "
                         "1 of 3 failed: ConnectionError: refused.")
    assert e.next_step == "Attempt 2 is dispatched once the backoff ends."


def test_dispatched_says_when_no_consumer_listens():
    j = job(JobState.DISPATCHED, queue="mail", dispatched_at=NOW - timedelta(seconds=4))
    e = explain.explain(j, Context(NOW, queue_workers=0))
    assert e.summary.startswith("Dispatched to SQS queue 'mail' at 2026-12-02 14:59:56 UTC "
                                "(4 s ago) and waiting for a consumer")
    assert any("No live consumer is receiving from queue 'mail'" in d for d in e.details)
    e = explain.explain(j, Context(NOW, queue_workers=2, queue_slots=(3, 8)))
    assert "2 live consumer(s) receive from queue 'mail'." in e.details
    e = explain.explain(j, Context(NOW, queue_workers=2, queue_slots=(8, 8)))
    assert any("but every one of their handler slots was busy at their last heartbeat "
               "(8/8)" in d and "stuck past its deadline" in d for d in e.details), e.details


def test_running_leased_and_lease_expired():
    j = job(JobState.RUNNING, attempt=2, lease_owner="w1", started_at=NOW - timedelta(seconds=3),
            lease_expires_at=NOW + timedelta(seconds=27))
    e = explain.explain(j, Context(NOW, lease_worker=worker()))
    assert e.summary == ("Running: leased by worker w1 until 2026-12-02 15:00:27 UTC "
                         "(in 27 s) (attempt 2 of 3).")
    expired = replace(j, lease_expires_at=NOW - timedelta(seconds=50))
    e = explain.explain(expired, Context(NOW, lease_worker=worker(
        "stale", 45, lease_until=NOW - timedelta(seconds=5))))
    assert "the lease expired 2026-12-02 14:59:55 UTC (5 s ago)" in e.summary, e.summary
    assert "Worker w1 is stale: last heartbeat 45 s ago, its lease expired 5 s ago." in e.details
    assert "A timer rescues it" in e.next_step
    covered = explain.explain(expired, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=20))))
    assert "until 2026-12-02 15:00:20 UTC (in 20 s)" in covered.summary, "the worker's lease"


def test_running_but_detached_says_the_handler_is_stuck_and_its_thread_busy():
    j = job(JobState.RUNNING, attempt=1, lease_owner="w1", lease_detached=True,
            started_at=NOW - timedelta(seconds=70), lease_expires_at=NOW + timedelta(seconds=8))
    e = explain.explain(j, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=25))))
    assert e.summary == (
        "Stuck: its handler has run past its 30 s timeout on worker w1 and not returned "
        "(attempt 1 of 3), so the worker let the job go: it is leased on its own until "
        "2026-12-02 15:00:08 UTC (in 8 s)."), "its own lease, not the worker's"
    stuck = next(d for d in e.details if "stuck past its deadline" in d)
    assert "its thread is still busy and keeps its handler slot" in stuck
    assert "--isolation process" in stuck
    assert "Worker w1 is alive (last heartbeat 1 s ago): only this job was let go" in " ".join(
        e.details)
    assert e.next_step.startswith("A timer recovers it once its own lease expires")


def test_a_stuck_handlers_expired_lease_is_not_blamed_on_its_live_worker():
    """The finding: a detached job's own lease expired while its worker beats on; the
    headline said 'the worker stopped heartbeating'."""
    j = job(JobState.RUNNING, attempt=2, max_attempts=2, timeout_seconds=2.0,
            lease_owner="w1", lease_detached=True, started_at=NOW - timedelta(seconds=8),
            lease_expires_at=NOW - timedelta(seconds=1))
    e = explain.explain(j, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=3))))
    assert e.summary == (
        "Was leased by worker w1 (attempt 2 of 2), but its handler ran past its 2 s timeout "
        "and did not return, so the worker (still alive) let the job go; its own lease "
        "expired 2026-12-02 14:59:59 UTC (1 s ago).")
    assert "stopped heartbeating" not in e.text()
    assert "A timer rescues it" in e.next_step
    # Its worker gone too: no "(still alive)", and its status in the details.
    gone = explain.explain(j, Context(NOW, lease_worker=worker(
        "stale", 9, lease_until=NOW - timedelta(seconds=6))))
    assert "so the worker let the job go" in gone.summary
    assert "Worker w1 is stale: last heartbeat 9 s ago, its lease expired 6 s ago." in (
        gone.details)


def test_a_job_let_go_within_its_deadline_is_abandoned_not_stuck():
    """Abandon (or an outcome Postgres refused) detaches a job too, before its deadline:
    its own lease then ends before the deadline would."""
    j = job(JobState.RUNNING, attempt=1, lease_owner="w1", lease_detached=True,
            started_at=NOW - timedelta(seconds=2), lease_expires_at=NOW + timedelta(seconds=3))
    e = explain.explain(j, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=25))))
    assert e.summary == ("Let go by worker w1 (attempt 1 of 3): the job is leased on its own "
                         "until 2026-12-02 15:00:03 UTC (in 3 s), no longer by the worker's "
                         "heartbeat.")
    assert any("its handler raised Abandon" in d for d in e.details)
    assert not any("stuck" in d for d in e.details)
    expired = explain.explain(replace(j, lease_expires_at=NOW - timedelta(seconds=1)),
                              Context(NOW, lease_worker=worker()))
    assert expired.summary == ("Was leased by worker w1 (attempt 1 of 3), but the worker "
                               "(still alive) let the job go; its own lease expired "
                               "2026-12-02 14:59:59 UTC (1 s ago).")


def test_running_past_its_deadline_says_the_handler_was_told_to_stop():
    j = job(JobState.RUNNING, attempt=1, lease_owner="w1", timeout_seconds=2.0,
            started_at=NOW - timedelta(seconds=5), lease_expires_at=NOW + timedelta(seconds=1))
    e = explain.explain(j, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=3))))
    assert e.summary.startswith("Running: leased by worker w1 until")
    assert any(d.startswith("Its timeout passed 3 s ago: the handler has been told to stop")
               for d in e.details), e.details


LOST = "lease expired at 2026-12-02T14:59:55+00:00: worker w9 stopped heartbeating"


def lost(n: int, ran: float) -> Attempt:
    """A lease_expired attempt that ran `ran` seconds, rescued 5 s ago, as the timer
    records it (whatever the cause, its text blames the worker)."""
    return Attempt(n, "w9", NOW - timedelta(seconds=5 + ran), NOW - timedelta(seconds=5),
                   AttemptOutcome.LEASE_EXPIRED, LOST, None)


def w9(lease_until: datetime, status: str = "alive") -> WorkerInfo:
    return replace(worker(status, lease_until=lease_until), id="w9")


STUCK = ("its handler ran past its 2 s timeout and did not return; worker w9 kept "
         "heartbeating but let the job go, and the timer recovered it when its own lease "
         "expired")


@pytest.mark.parametrize(("ran", "lease_until", "words"), [
    # Its worker's lease outlasted the rescue: the worker did not stop heartbeating.
    (8.0, NOW + timedelta(seconds=2), f"was lost: {STUCK}"),
    (1.0, NOW + timedelta(seconds=2), "was lost: worker w9 let the job go while it kept "
                                      "heartbeating (its handler raised Abandon"),
    # Its worker's lease ran out before the rescue (and it has not beaten since).
    (8.0, NOW - timedelta(seconds=9), "was lost when worker w9 stopped heartbeating"),
    (1.0, NOW - timedelta(seconds=9), "was lost when worker w9 stopped heartbeating"),
    # No row for the worker any more: past its deadline, either could be.
    (8.0, None, "was lost when its lease expired after its handler had run past its 2 s "
                "timeout: the handler did not return, or worker w9 stopped heartbeating"),
    (1.0, None, "was lost when worker w9 stopped heartbeating"),
])
def test_a_lost_attempt_is_blamed_on_what_lost_it(ran, lease_until, words):
    context = Context(NOW, attempt_worker=None if lease_until is None else w9(lease_until))
    dead = job(JobState.DEAD, attempt=2, max_attempts=2, timeout_seconds=2.0,
               finished_at=NOW - timedelta(seconds=5), attempts=(lost(2, ran),))
    e = explain.explain(dead, context)
    assert e.summary.startswith("Dead since 2026-12-02 14:59:55 UTC (5 s ago) because its "
                                f"last attempt (2 of 2) {words}"), e.summary
    retrying = job(JobState.RETRYING, attempt=1, max_attempts=2, timeout_seconds=2.0,
                   run_at=NOW + timedelta(seconds=1), attempts=(lost(1, ran),))
    e = explain.explain(retrying, context)
    assert e.summary.startswith("In backoff until 2026-12-02 15:00:01 UTC (in 1 s) after "
                                f"attempt 1 of 2 {words}"), e.summary
    assert LOST not in e.summary, "not the rescue's own text"


def test_a_lost_attempts_worker_is_matched_by_id():
    """Another worker's lease says nothing about the one that ran the attempt."""
    other = replace(worker(lease_until=NOW + timedelta(seconds=2)), id="w1")
    dead = job(JobState.DEAD, attempt=2, max_attempts=2, timeout_seconds=2.0,
               finished_at=NOW - timedelta(seconds=5), attempts=(lost(2, 1.0),))
    e = explain.explain(dead, Context(NOW, attempt_worker=other))
    assert "was lost when worker w9 stopped heartbeating" in e.summary


@pytest.mark.parametrize(("outcome", "words"), [
    (AttemptOutcome.FAILED, "attempt 3 of 3 failed and no attempts are left: boom"),
    (AttemptOutcome.PERMANENT, "its handler raised a permanent error: boom"),
    (AttemptOutcome.NO_HANDLER, "no consumer has a handler for kind 'email': boom"),
    (AttemptOutcome.LEASE_EXPIRED, "was lost when worker w9 stopped heartbeating"),
])
def test_dead_says_why(outcome, words):
    j = job(JobState.DEAD, attempt=3, finished_at=NOW - timedelta(minutes=2),
            attempts=(attempt(3, outcome, "boom", worker="w9"),))
    e = explain.explain(j, Context(NOW))
    assert e.summary.startswith("Dead since 2026-12-02 14:58:00 UTC (2 min ago) because ")
    assert words in e.summary
    assert e.can_retry and not e.can_cancel


def test_succeeded_and_cancelled():
    j = job(JobState.SUCCEEDED, attempt=1, run_at=NOW - timedelta(seconds=5),
            started_at=NOW - timedelta(seconds=4), finished_at=NOW - timedelta(seconds=1))
    e = explain.explain(j, Context(NOW))
    assert e.summary == "Succeeded at 2026-12-02 14:59:59 UTC (1 s ago) on attempt 1 of 3."
    assert e.details == ["Ran for 3 s and started 1 s after it was due."]
    past = job(JobState.SUCCEEDED, attempt=1, run_at=NOW - timedelta(days=365 * 5),
               created_at=NOW - timedelta(seconds=6), started_at=NOW - timedelta(seconds=4),
               finished_at=NOW - timedelta(seconds=1))
    assert explain.explain(past, Context(NOW)).details == [
        "Ran for 3 s and started 2 s after it was enqueued (its time was already past then)."]
    e = explain.explain(job(JobState.CANCELLED, finished_at=NOW), Context(NOW))
    assert e.summary.startswith("Cancelled at") and e.can_retry


def test_every_state_has_a_story():
    for state in JobState:
        assert explain.explain(job(state), Context(NOW)).summary


def test_gather_reads_workers_queue_and_paused_schedule(client, db, operator_store):

    db.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency) "
               "VALUES ('w1', 'h', 1, '{default}', 4)")
    older = client.schedule("email", delay=0, priority=5)
    mine = client.schedule("email", delay=0)
    db.execute("UPDATE tock_jobs SET run_at = now() - interval '1 min' WHERE id = %s",
               (older.id,))
    ctx = explain.gather(operator_store, client.get(mine.id))
    assert ctx.due_ahead == 1 and ctx.queue_workers == 1 and ctx.schedule is None
    # A worker whose lease has expired (kill -9 under short leases) is no live consumer,
    # however recently it beat.
    db.execute("UPDATE tock_workers SET last_heartbeat = now() - interval '4 s', "
               "lease_expires_at = now() - interval '1 s' WHERE id = 'w1'")
    assert explain.gather(operator_store, client.get(mine.id)).queue_workers == 0
    client.recurring("nightly", "report", every=3600)
    made = client.schedule("report", key="nightly:2026-12-02T02:00:00+00:00")
    db.execute("UPDATE tock_jobs SET schedule_name = 'nightly' WHERE id = %s", (made.id,))
    job_ = client.get(made.id)
    e = explain.explain(job_, explain.gather(operator_store, job_))
    assert ("It was made by recurring schedule 'nightly' for its slot 2026-12-02 02:00:00 "
            "UTC") in " ".join(e.details), e.details
    client.pause_schedule("nightly")
    job_ = client.get(made.id)
    e = explain.explain(job_, explain.gather(operator_store, job_))
    assert any("recurring schedule 'nightly' for its slot 2026-12-02 02:00:00 UTC (" in d
               and d.endswith(" ago), which is paused: the schedule makes no further jobs "
                              "until it is resumed.") for d in e.details), e.details


def test_gather_finds_the_worker_of_the_last_attempt(client, db, operator_store):
    db.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, lease_expires_at)"
               " VALUES ('w9', 'h', 1, '{default}', 4, now() + interval '20 s')")
    made = client.schedule("email", delay=0)
    found = client.get(made.id)
    assert explain.gather(operator_store, found).attempt_worker is None, "no attempt yet"
    with_attempt = replace(found, attempts=(lost(1, 1.0),))
    ctx = explain.gather(operator_store, with_attempt)
    assert ctx.attempt_worker is not None and ctx.attempt_worker.id == "w9"
    assert ctx.lease_worker is None


def test_a_killed_worker_is_stale_once_its_lease_expires_everywhere(
        client, timer, registry, consumers, clock, operator_store):
    """A consumer with 3 s leases claims a job and is killed (it never beats again): from
    the moment its lease expires (when the timer rescues its job) `tock workers`, the
    dashboard and explain call it stale, not alive for 30 s."""
    registry.add("email", lambda payload, ctx: None)
    made = client.schedule("email", max_attempts=3)
    consumer = consumers(clock, lease_seconds=3, heartbeat_seconds=1)
    dispatch(timer, clock.now)
    assert receive(consumer, 1), "claimed"
    consumer.lease_keeper.beat(clock.now)  # its last beat, then kill -9
    worker_id = consumer.worker_id

    def at(seconds: float) -> tuple[str, Context]:
        when_ = clock.now + timedelta(seconds=seconds)
        status = {w.id: w.status for w in operator_store.workers(
            stale_after_seconds=explain.DEFAULT_STALE_AFTER_SECONDS, now=when_)}
        return status[worker_id], explain.gather(operator_store, client.get(
            made.id, with_attempts=True), now=when_)

    status, ctx = at(2)
    assert status == "alive" and ctx.queue_workers == 1
    status, ctx = at(4)  # its 3 s lease ran out 1 s ago
    assert status == "stale" and ctx.queue_workers == 0
    story = explain.explain(client.get(made.id), ctx)
    assert "the worker stopped heartbeating" in story.summary
    assert (f"Worker {worker_id} is stale: last heartbeat 4 s ago, its lease expired 1 s "
            "ago.") in story.details
    assert timer.run_once(ctx.now).rescued == 1, "the timer agrees: its lease is gone"
    _, ctx = at(4)
    story = explain.explain(client.get(made.id, with_attempts=True), ctx)
    assert f"attempt 1 of 3 was lost when worker {worker_id} stopped heartbeating" in (
        story.summary), story.summary
