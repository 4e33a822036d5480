"""The consumer keeps working through what used to kill a thread or hold it up: poison
messages, handlers that raise anything, outcomes Postgres would refuse, statement timeouts,
a heartbeat racing a commit, a claim lost in a database crash; and an error nobody
anticipated stops the process instead of leaving it half alive. Real Postgres and real SQS;
faults are injected for real (a held row lock with a statement timeout) or at the transport
seam (a delete that waits, a receive that fails)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from consumer.outcomes import MAX_ERROR_CHARS, MAX_RETRY_AFTER_SECONDS
from consumer.service import Consumer
from shared.core.errors import DatabaseUnavailable, RetryAfter, TransportError
from shared.core.messages import JobMessage
from shared.core.states import AttemptOutcome, JobState
from shared.transport.base import Outgoing
from shared.transport.sqs import SqsTransport
from tests.integration.readings import metric
from tests.support.drive import Clock, db_now, dispatch, make_consumer, receive, run_all
from tests.support.wait import wait_for

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
    before = metric("tock_messages_dropped_total", reason="malformed")
    for i in range(0, len(poison), 10):
        transport.send_batch("default",
                             [Outgoing(str(n), b) for n, b in enumerate(poison[i:i + 10])])
    consumer = running()
    job = client.schedule("work")
    dispatch(timer)
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the real job ran after the poison")
    wait_for(lambda: metric("tock_messages_dropped_total", reason="malformed") >= before + 8,
             message="every malformed message dropped")
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


# --- handlers that raise anything -------------------------------------------------------------

class BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class StrExits(Exception):
    """Found by a chaos walkthrough: turning it into text raised SystemExit out of the
    executor loop; every consumer that claimed the job exited 70, for ever."""

    def __str__(self) -> str:
        raise SystemExit(9)


class StrInterrupts(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


@pytest.mark.parametrize("raised", [
    KeyboardInterrupt(), SystemExit(3), BadStr(), RetryAfter("soon"),  # type: ignore[arg-type]
    StrExits(), StrInterrupts(),
], ids=["KeyboardInterrupt", "SystemExit", "bad __str__", "RetryAfter('soon')",
        "__str__ raising SystemExit", "__str__ raising KeyboardInterrupt"])
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
    registry.add("negative", lambda p, c: (_ for _ in ()).throw(RetryAfter(-1)))
    nul = client.schedule("nul", max_attempts=1)
    nan = client.schedule("nan", max_attempts=2)
    huge = client.schedule("huge", max_attempts=2)
    negative = client.schedule("negative", max_attempts=2)
    dispatch(timer, clock.now)
    run_all(consumer, receive(consumer, 4))
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
    # A negative delay is no delay: the usual backoff (base 1 s: 0.5-1 s), and the error
    # says what was asked, as for None; not a retry at once.
    backed_off = client.get(negative.id)
    assert backed_off.state is JobState.RETRYING
    assert "got -1; retrying with the usual backoff" in (backed_off.last_error or "")
    assert 0.5 <= (backed_off.run_at - clock.now).total_seconds() <= 1.0


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
        lost_before = metric("tock_leases_lost_total")
        assert consumer.heartbeat_once()[1] == 0, "not lost: it is done"
        assert metric("tock_leases_lost_total") == lost_before
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


def _lose_the_claim(db: Any, job_id: int) -> None:
    """What a database crash that lost a claim's asynchronous commit leaves behind."""
    db.execute("UPDATE tock_jobs SET state = 'dispatched', attempt = 0, lease_owner = NULL,"
               " lease_expires_at = NULL WHERE id = %s", (job_id,))


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
        _lose_the_claim(db, job.id)
        run_all(consumer, entries)
        assert client.get(job.id).state is JobState.DISPATCHED
        run_all(consumer, receive(consumer, 1))
        assert client.get(job.id).state is JobState.SUCCEEDED
        assert ran == [1, 1]
    finally:
        consumer.close()


def test_a_claim_lost_in_a_crash_and_seen_by_the_heartbeat_runs_again_at_once(
        client, db, timer, transport, registry, consumer_settings, clock_now):
    """The same lost claim, but the heartbeat got there first: it finds the job not held
    and marks the lease lost while the handler runs. The job is still dispatched with the
    same token, so its message must still be made visible, not deleted: otherwise the job
    waits, dispatched, for the timer's lost-message resend."""
    consumer = make_consumer(consumer_settings, registry, transport, Clock(clock_now))
    beats: list[tuple[int, int]] = []

    def work(payload: Any, ctx: Any) -> None:
        if not beats:
            beats.append(consumer.lease_keeper.beat(clock_now))

    registry.add("work", work)
    try:
        job = client.schedule("work")
        dispatch(timer, clock_now)
        entries = receive(consumer, 1)
        _lose_the_claim(db, job.id)
        run_all(consumer, entries)
        assert beats == [(0, 1)]  # the heartbeat did see the lease as lost
        assert client.get(job.id).state is JobState.DISPATCHED
        run_all(consumer, receive(consumer, 1))  # the message came back: no resend needed
        assert client.get(job.id).state is JobState.SUCCEEDED
        assert len(beats) == 1
    finally:
        consumer.close()


def test_a_wake_up_that_fails_after_the_outcomes_committed_loses_nothing(
        client, timer, transport, registry, consumer_settings, clock_now, caplog,
        monkeypatch):
    """The NOTIFY that wakes the timers for a retry due soon goes after the outcomes'
    commit. If it fails (the connection lost at that instant, a server gone read-only),
    the outcomes stay written and are reported as written: not kept for another pass that
    would match nothing and call them discarded."""
    def boom(payload: Any, ctx: Any) -> None:
        raise RuntimeError("fails, retried soon")

    registry.add("work", boom, max_attempts=3)
    consumer = make_consumer(consumer_settings, registry, transport, Clock(clock_now))
    try:
        job = client.schedule("work")
        dispatch(timer, clock_now)

        def lost(*args: Any, **kwargs: Any) -> None:
            raise DatabaseUnavailable("database unavailable: the connection was lost")

        monkeypatch.setattr(consumer.pipe.store, "notify_due", lost)
        run_all(consumer, receive(consumer, 1))
        assert client.get(job.id).state is JobState.RETRYING
        assert "notify_failed" in caplog.text
        assert "result_discarded" not in caplog.text
    finally:
        consumer.close()
