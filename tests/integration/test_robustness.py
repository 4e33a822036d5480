"""The consumer and timer keep working through what used to kill a thread or hold it up:
poison messages, handlers that raise anything, outcomes Postgres would refuse, statement
timeouts, a hung SQS call, a missing queue, a heartbeat racing a commit. Real Postgres and
real SQS; faults are injected for real (a held row lock with a statement timeout, a
deleted queue) or at the transport seam (a call that hangs)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from consumer.outcomes import MAX_ERROR_CHARS, MAX_RETRY_AFTER_SECONDS
from consumer.service import Consumer
from consumer.tasks import Registry
from shared.core.errors import RetryAfter, TransportError
from shared.core.messages import JobMessage
from shared.core.states import AttemptOutcome, JobState
from shared.transport.sqs import SqsTransport
from tests.support.drive import Clock, db_now, dispatch, make_consumer, receive, run_all
from tests.support.wait import wait_for
from timer_service.service import Timer


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def timer(timer_settings, transport):
    t = Timer(timer_settings, transport)
    yield t
    t.close()


@pytest.fixture
def registry():
    return Registry()


@pytest.fixture
def running(consumer_settings, registry, transport):
    """Start a real consumer (all its loops on their threads); shut it down at the end."""
    made: list[Consumer] = []

    def start(transport_: Any = None, **overrides: Any) -> Consumer:
        settings = consumer_settings.model_copy(update=overrides)
        c = Consumer(settings, registry, transport_ or transport)
        c.start()
        made.append(c)
        return c

    yield start
    for c in made:
        c.shutdown()


# --- poison messages --------------------------------------------------------------------------

def test_poison_messages_of_every_shape_are_dropped_and_the_next_job_runs(
        client, timer, transport, registry, running):
    registry.add("work", lambda payload, ctx: None)
    token = str(uuid.uuid4())
    poison = [
        "not json", "[]", '{"v": 1}', "x" * 5000, '{"v": 1, "job": true, "kind": "w"}',
        f'{{"v": 1, "job": 100000000000000000000, "token": "{token}", "kind": "work"}}',
        f'{{"v": 1, "job": 9223372036854775808, "token": "{token}", "kind": "work"}}',
        f'{{"v": 1, "job": 5, "token": "{token}", "kind": "\\ud800"}}',
        JobMessage(987654321, uuid.uuid4(), "work").encode(),
    ]
    before = _metric("tock_messages_dropped_total", reason="malformed")
    for i in range(0, len(poison), 10):
        transport.send_batch("default", [(str(n), b) for n, b in enumerate(poison[i:i + 10])])
    consumer = running()
    job = client.schedule("work")
    dispatch(timer)
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the real job ran after the poison")
    wait_for(lambda: _metric("tock_messages_dropped_total", reason="malformed") >= before + 8,
             message="every malformed message dropped")
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


# --- handlers that raise anything -------------------------------------------------------------

class BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


@pytest.mark.parametrize("raised", [
    KeyboardInterrupt(), SystemExit(3), BadStr(), RetryAfter("soon"),  # type: ignore[arg-type]
], ids=["KeyboardInterrupt", "SystemExit", "bad __str__", "RetryAfter('soon')"])
def test_whatever_a_handler_raises_is_a_recorded_failed_attempt(
        client, timer, registry, running, raised):
    calls: list[int] = []

    def handler(payload: Any, ctx: Any) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise raised

    registry.add("risky", handler)
    consumer = running(backoff_base_seconds=0.1, backoff_cap_seconds=0.1)
    job = client.schedule("risky", max_attempts=3)
    dispatch(timer)
    wait_for(lambda: client.get(job.id, with_attempts=True).attempts, timeout=30,
             message="the failed attempt recorded")
    failed = client.get(job.id, with_attempts=True)
    assert failed.attempts[0].outcome is AttemptOutcome.FAILED
    assert type(raised).__name__ in (failed.attempts[0].error or "")
    wait_for(lambda: dispatch(timer) >= 0 and client.get(job.id).state is JobState.SUCCEEDED,
             timeout=30, message="the retry ran on a live handler thread")
    assert calls == [1, 2]
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


def test_outcomes_postgres_would_refuse_are_stored_sanitised_and_bounded(
        client, timer, registry, consumers_clock):
    consumer, clock = consumers_clock
    registry.add("nul", lambda p, c: (_ for _ in ()).throw(ValueError("a\x00b \ud800 " * 999)))
    registry.add("nan", lambda p, c: (_ for _ in ()).throw(RetryAfter(float("nan"))))
    registry.add("huge", lambda p, c: (_ for _ in ()).throw(RetryAfter(1e300)))
    nul = client.schedule("nul", max_attempts=1)
    nan = client.schedule("nan", max_attempts=2)
    huge = client.schedule("huge", max_attempts=2)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 3))
    stored = client.get(nul.id, with_attempts=True)
    assert stored.state is JobState.DEAD
    error = stored.last_error or ""
    assert "\\x00" in error and "\x00" not in error and "\\ud800" in error
    assert len(error) <= MAX_ERROR_CHARS and error.endswith("giving up]")
    assert stored.attempts[0].traceback and "\x00" not in stored.attempts[0].traceback
    retried = client.get(nan.id)
    assert retried.state is JobState.RETRYING and "RetryAfter needs a number" in retried.last_error
    capped = client.get(huge.id)
    delay = (capped.run_at - clock.now).total_seconds()
    assert MAX_RETRY_AFTER_SECONDS - 60 <= delay <= MAX_RETRY_AFTER_SECONDS + 60


@pytest.fixture
def consumers_clock(consumer_settings, registry, transport, db):
    clock = Clock(db_now(db) + timedelta(seconds=2))
    consumer = make_consumer(consumer_settings, registry, transport, clock)
    yield consumer, clock
    consumer.close()


# --- database errors the loops outlive ----------------------------------------------------------

def test_a_statement_timeout_in_the_completer_is_retried_not_fatal(
        client, db, database_url, timer, registry, running):
    """A held row lock makes the outcome write wait past statement_timeout (57014): the
    completer backs off and writes it once the lock is gone."""
    started, release = threading.Event(), threading.Event()
    registry.add("slow", lambda p, c: (started.set(), release.wait(30)))
    db.execute(f'ALTER DATABASE "{database_url.rsplit("/", 1)[1]}" '
               "SET statement_timeout = '300ms'")
    consumer = running()
    job = client.schedule("slow")
    dispatch(timer)
    assert started.wait(30)
    with psycopg.connect(database_url) as locker:
        locker.execute("SET statement_timeout = 0")
        locker.execute("SELECT 1 FROM tock_jobs WHERE id = %s FOR UPDATE", (job.id,))
        release.set()
        wait_for(lambda: consumer.completer._failures._last_text is not None, timeout=30,
                 message="the completer met the statement timeout")
        assert consumer.supervisor.live()[0]
        locker.rollback()
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the outcome written after the lock went away")
    assert consumer.supervisor.live()[0]


# --- SQS faults --------------------------------------------------------------------------------

class HangingVisibility:
    """ChangeMessageVisibilityBatch hangs until released; everything else is real."""

    def __init__(self, inner: SqsTransport) -> None:
        self.inner = inner
        self.hanging = threading.Event()
        self.release = threading.Event()

    def change_visibility_batch(self, queue: str, receipts: list[str], timeout: int) -> Any:
        if receipts:
            self.hanging.set()
            self.release.wait(60)
        return self.inner.change_visibility_batch(queue, receipts, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_hung_visibility_call_never_holds_up_the_database_heartbeat(
        client, db, timer, transport, registry, running):
    started, done = threading.Event(), threading.Event()
    registry.add("long", lambda p, c: (started.set(), done.wait(60)))
    hanging = HangingVisibility(transport)
    running(hanging, lease_seconds=2, heartbeat_seconds=0.5, visibility_timeout_seconds=30)
    job = client.schedule("long")
    dispatch(timer)
    assert started.wait(30)
    assert hanging.hanging.wait(30), "the visibility call is hanging"

    def expiry() -> Any:
        return db.execute("SELECT lease_expires_at FROM tock_jobs WHERE id = %s",
                          (job.id,)).fetchone()[0]

    first = expiry()
    wait_for(lambda: expiry() > first + timedelta(seconds=1), timeout=20,
             message="the database lease renewed while SQS hangs")
    hanging.release.set()
    done.set()
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the job finished on its single lease")
    assert [a.outcome for a in client.get(job.id, with_attempts=True).attempts] == [
        AttemptOutcome.SUCCEEDED]


def test_a_deleted_queue_is_recreated_and_its_jobs_run(
        client, timer_settings, consumer_settings, queue_prefix, registry):
    """TOCK_CREATE_QUEUES=1: a queue deleted under a running system (a LocalStack restart
    loses them all) is created again by the first call that finds it gone."""
    registry.add("work", lambda p, c: None)
    setup = SqsTransport(queue_prefix)
    setup.create_queue("default")
    timer = Timer(timer_settings.model_copy(update={"create_queues": True}))
    consumer = Consumer(consumer_settings.model_copy(update={"create_queues": True}),
                        registry)
    consumer.start()
    try:
        first = client.schedule("work")
        dispatch(timer)
        wait_for(lambda: client.get(first.id).state is JobState.SUCCEEDED, timeout=30,
                 message="a job before the queue goes")
        setup.client.delete_queue(QueueUrl=setup.url("default"))
        second = client.schedule("work")
        wait_for(lambda: dispatch(timer) >= 0 and
                 client.get(second.id).state is JobState.SUCCEEDED, timeout=60,
                 message="a job after the queue was deleted")
    finally:
        consumer.shutdown()
        timer.close()


def test_a_job_sqs_refuses_backs_off_alone_and_explain_says_why(
        client, db, timer_settings, transport, clock_now):
    """A job for a queue with no SQS queue is put back with a backoff of its own: the jobs
    behind it are dispatched, and explain names the reason."""
    timer = Timer(timer_settings.model_copy(update={"batch_size": 1}), transport)
    try:
        lost = client.schedule("k", queue="nowhere", priority=9)
        fine = [client.schedule("k") for _ in range(3)]
        now = clock_now
        first = timer.run_once(now)
        assert (first.dispatched, first.refused) == (0, 1)
        assert dispatch(timer, now) == 3, "the refused job does not head every claim"
        refused = client.get(lost.id)
        assert refused.state is JobState.SCHEDULED and refused.dispatch_failures == 1
        assert refused.run_at > now
        assert all(client.get(j.id).state is JobState.DISPATCHED for j in fine)
        from shared.ops import explain
        from shared.store import Database, OperatorStore

        database = Database(timer_settings.database_url, max_size=1)
        try:
            why = explain.explain(refused, explain.gather(OperatorStore(database), refused))
        finally:
            database.close()
        assert "SQS refused to take it 1 time(s)" in why.summary
        assert "QueueMissing" in why.summary or "does not exist" in why.summary
    finally:
        timer.close()


@pytest.fixture
def clock_now(db):
    return db_now(db) + timedelta(seconds=2)


def test_a_backlog_older_than_the_dispatch_timeout_is_not_sent_again(
        client, timer, transport, clock_now):
    """Messages waiting in SQS are not lost, however old: nothing is re-sent until the
    queue holds fewer messages than the database says it should."""
    jobs = client.schedule_many([{"kind": "k"} for _ in range(12)])
    dispatch(timer, clock_now)
    tokens = {j.id: client.get(j.id).dispatch_token for j in jobs}
    later = clock_now + timedelta(minutes=10)
    assert timer.run_once(later).redispatched == 0
    assert {j.id: client.get(j.id).dispatch_token for j in jobs} == tokens, "nothing resent"
    transport.client.purge_queue(QueueUrl=transport.url("default"))
    wait_for(lambda: transport.depth("default") == 0, timeout=30, message="queue purged")
    again = timer.run_once(later)
    assert (again.redispatched, again.dispatched) == (12, 12)
    assert all(client.get(j.id).dispatch_token != tokens[j.id] for j in jobs)


# --- heartbeats and commits ---------------------------------------------------------------------

class DeleteWaits:
    """DeleteMessageBatch waits until told to go on: a heartbeat runs between the outcome's
    commit and the delete."""

    def __init__(self, inner: SqsTransport) -> None:
        self.inner = inner
        self.waiting = threading.Event()
        self.go = threading.Event()

    def delete_batch(self, queue: str, receipts: list[str]) -> Any:
        self.waiting.set()
        self.go.wait(30)
        return self.inner.delete_batch(queue, receipts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_heartbeat_after_the_outcome_commit_is_no_lost_lease(
        client, timer, transport, registry, consumer_settings, clock_now):
    registry.add("work", lambda p, c: None)
    slow = DeleteWaits(transport)
    consumer = make_consumer(consumer_settings, registry, slow, Clock(clock_now))
    try:
        job = client.schedule("work")
        dispatch(timer, clock_now)
        entries = receive(consumer, 1)
        consumer.executor.run(entries[0])
        finishing = threading.Thread(target=consumer.complete_pending)
        finishing.start()
        assert slow.waiting.wait(30)
        lost_before = _metric("tock_leases_lost_total")
        assert consumer.heartbeat_once()[1] == 0, "not lost: it is done"
        assert _metric("tock_leases_lost_total") == lost_before
        slow.go.set()
        finishing.join(30)
        assert client.get(job.id).state is JobState.SUCCEEDED
    finally:
        slow.go.set()
        consumer.close()


# --- supervision --------------------------------------------------------------------------------

class BrokenReceive:
    """A receive that fails with an error nobody anticipated (a bug, not an outage)."""

    def __init__(self, inner: SqsTransport) -> None:
        self.inner = inner

    def receive(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the receive path")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_unexpected_error_in_any_loop_stops_the_process_non_zero(
        consumer_settings, registry, transport):
    consumer = Consumer(consumer_settings, registry, BrokenReceive(transport))
    code: list[int] = []
    runner = threading.Thread(target=lambda: code.append(consumer.run_forever()))
    runner.start()
    runner.join(60)
    assert code == [70], "run_forever returns EX_SOFTWARE after a loop crash"
    live, reason = consumer.supervisor.live()
    assert not live and "claim-default" in reason and "RuntimeError" in reason


def test_transport_errors_are_waited_out_not_fatal(consumer_settings, registry, transport):
    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        def receive(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls < 4:
                raise TransportError("SQS ReceiveMessage failed: endpoint unreachable")
            return transport.receive(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(transport, name)

    flaky = Flaky()
    consumer = Consumer(consumer_settings.model_copy(update={"queues": ["default"]}),
                        registry, flaky)
    consumer.start()
    try:
        wait_for(lambda: flaky.calls >= 6, timeout=30, message="receives go on")
        assert consumer.supervisor.live()[0]
    finally:
        consumer.shutdown()


def test_a_claim_lost_in_a_database_crash_runs_again_at_once(
        client, db, timer, transport, registry, consumer_settings, clock_now):
    """The claim commits asynchronously; a crash may lose it after the handler ran. Its
    result then matches no row, and the job is still dispatched with the same token: the
    message is made visible again instead of deleted, so the job runs again now."""
    ran: list[int] = []
    registry.add("work", lambda p, c: ran.append(c.attempt))
    consumer = make_consumer(consumer_settings, registry, transport, Clock(clock_now))
    try:
        job = client.schedule("work")
        dispatch(timer, clock_now)
        entries = receive(consumer, 1)
        # What a crash that lost the claim's commit leaves behind.
        db.execute("UPDATE tock_jobs SET state = 'dispatched', attempt = 0, lease_owner = NULL,"
                   " lease_expires_at = NULL WHERE id = %s", (job.id,))
        run_all(consumer, entries)
        assert client.get(job.id).state is JobState.DISPATCHED
        run_all(consumer, receive(consumer, 1))
        assert client.get(job.id).state is JobState.SUCCEEDED
        assert ran == [1, 1]
    finally:
        consumer.close()
