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
        "0.2 s", "3 s", "42 s", "1 min 5 s", "1 h", "1 h 2 min", "1 d 1 h"]


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
    e = explain.explain(j, Context(NOW, queue_workers=2))
    assert any("2 live consumer(s)" in d for d in e.details)


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
    assert "Worker w1 is stale: last heartbeat 45 s ago." in e.details
    assert "A timer rescues it" in e.next_step
    covered = explain.explain(expired, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=20))))
    assert "until 2026-12-02 15:00:20 UTC (in 20 s)" in covered.summary, "the worker's lease"


def test_running_but_detached_says_the_handler_is_stuck_and_its_thread_busy():
    j = job(JobState.RUNNING, attempt=1, lease_owner="w1", lease_detached=True,
            started_at=NOW - timedelta(seconds=70), lease_expires_at=NOW + timedelta(seconds=8))
    e = explain.explain(j, Context(NOW, lease_worker=worker(
        lease_until=NOW + timedelta(seconds=25))))
    assert "until 2026-12-02 15:00:08 UTC (in 8 s)" in e.summary, "its own lease, not the worker's"
    stuck = next(d for d in e.details if "stuck past its deadline" in d)
    assert "its thread is still busy and keeps its handler slot" in stuck
    assert "--isolation process" in stuck


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
    assert ctx.due_ahead == 1 and ctx.queue_workers == 1 and ctx.paused_schedule is None
    client.recurring("nightly", "report", every=3600)
    made = client.schedule("report", key="nightly:2026-12-02T02:00:00+00:00")
    db.execute("UPDATE tock_jobs SET schedule_name = 'nightly' WHERE id = %s", (made.id,))
    client.pause_schedule("nightly")
    job_ = client.get(made.id)
    e = explain.explain(job_, explain.gather(operator_store, job_))
    assert any("recurring schedule 'nightly', which is paused" in d for d in e.details)
