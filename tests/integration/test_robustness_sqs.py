"""The consumer and timer keep working through SQS faults: a hung visibility call, a queue
deleted under a running system, a job SQS refuses to take, and a backlog older than the
dispatch timeout (not sent again unless messages are really gone). Real Postgres and real
SQS; faults are injected for real (a deleted queue, a purged queue) or at the transport
seam (a call that hangs)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from consumer.claimer import Claimer
from consumer.service import Consumer
from shared.core.errors import TransportError
from shared.core.reports import Worker
from shared.core.states import AttemptOutcome, JobState
from shared.transport.base import MAX_WAIT_SECONDS, EntryFailure, Outgoing
from shared.transport.sqs import ATTEMPTS, NO_REPLY, SqsTransport
from tests.faults.waiting import hold_fault
from tests.integration.store.helpers import add_dispatched, add_running
from tests.support.drive import db_now, dispatch, make_consumer, receive
from tests.support.sqs_gateway import SqsGateway
from tests.support.wait import wait_for
from timer_service.dispatcher import (
    REFUSED_BACKOFF_CAP_SECONDS,
    REPORT_EVERY_SECONDS,
    STUCK_AFTER_FAILURES,
)
from timer_service.service import Timer


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

    def expiry() -> Any:  # the job's lease is its worker's
        return db.execute("SELECT w.lease_expires_at FROM tock_jobs j JOIN tock_workers w "
                          "ON w.id = j.lease_owner WHERE j.id = %s", (job.id,)).fetchone()[0]

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


def test_a_pass_sqs_refuses_entirely_is_no_success_until_a_send_succeeds(
        client, timer_settings, transport, clock_now, caplog):
    """Readiness tells the truth through an SQS outage: a pass whose every send was refused
    does not count, nor do the passes after it that find nothing due (the refused jobs
    back off); the jobs refused STUCK_AFTER_FAILURES times are reported in one line per
    queue and pass, not one per job."""
    caplog.set_level(logging.INFO, logger="tock.timer.dispatch")
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10}), transport)
    dispatcher = timer.dispatcher
    try:
        client.schedule_many([{"kind": "k", "queue": "nowhere"} for _ in range(3)])
        now = clock_now
        for _ in range(STUCK_AFTER_FAILURES):
            assert dispatcher.run_once(now) == 0
            now += timedelta(seconds=REFUSED_BACKOFF_CAP_SECONDS + 1)
        assert dispatcher.last_success_age(time.monotonic()) is None
        stuck = [r for r in caplog.records if getattr(r, "event", "") == "dispatch_stuck"]
        assert len(stuck) == 1, "one line for the queue, not one per job"
        assert (stuck[0].fields["queue"], stuck[0].fields["jobs"],
                len(stuck[0].fields["job_ids"])) == ("nowhere", 3, 3)
        # Jobs falling due one by one reach the streak in passes of their own (a chaos
        # walkthrough saw 147 lines in a minute of outage): one line per queue every
        # REPORT_EVERY_SECONDS, counting the ones in between.
        clock = [time.monotonic()]
        dispatcher.monotonic = lambda: clock[0]
        for late in range(2):
            client.schedule("k", queue="nowhere")
            for _ in range(STUCK_AFTER_FAILURES):
                dispatcher.run_once(now)
                now += timedelta(seconds=REFUSED_BACKOFF_CAP_SECONDS + 1)
            if late == 0:
                clock[0] += REPORT_EVERY_SECONDS
        stuck = [r for r in caplog.records if getattr(r, "event", "") == "dispatch_stuck"]
        assert [r.fields["jobs"] for r in stuck] == [3, 2], "the second line counts both"
        dispatcher.run_once(now)  # the refused jobs back off: nothing due
        assert dispatcher.last_success_age(time.monotonic()) is None, "still refusing"
        client.schedule("k")
        dispatcher.run_once(now + timedelta(seconds=1))
        assert dispatcher.last_success_age(time.monotonic()) is not None, "a send got through"
    finally:
        timer.close()


def test_a_consumer_that_cannot_receive_from_its_queue_is_not_ready(
        consumer_settings, registry, transport):
    """Its heartbeat is fine, but SQS will not hand it work: not ready, from the start,
    while no receive from its queue has gone through (and once one has not for the wait
    plus a call's timeout plus 5 s), and ready once it can receive."""
    settings = consumer_settings.model_copy(update={
        "queues": ["absent"], "receive_wait_seconds": 0, "sqs_call_timeout_seconds": 1})
    consumer = Consumer(settings, registry, transport)
    consumer.start()
    try:
        ready, why = consumer.supervisor.ready()
        assert not ready and "no successful claim-absent pass yet" in why, why
        transport.create_queue("absent", visibility_timeout=consumer_settings
                               .visibility_timeout_seconds)
        wait_for(lambda: consumer.supervisor.ready()[0], timeout=30,
                 message="ready once it receives")
        transport.client.delete_queue(QueueUrl=transport.url("absent"))
        wait_for(lambda: not consumer.supervisor.ready()[0], timeout=30,
                 message="not ready again once its queue is gone")
        assert "claim-absent" in consumer.supervisor.ready()[1]
    finally:
        consumer.shutdown()


class FinishesFirst:
    """Between the visibility keeper's list of jobs and its call, the completer finishes
    one of them: deletes its message and forgets it. Everything else is real."""

    def __init__(self, inner: Any, tracker: Any, item: Any) -> None:
        self.inner, self.tracker, self.item = inner, tracker, item

    def change_visibility_batch(self, queue: str, receipts: list[str], timeout: int) -> Any:
        self.inner.delete_batch(queue, [self.item.receipt])
        self.tracker.forget(self.item)
        return self.inner.change_visibility_batch(queue, receipts, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_refused_visibility_extension_of_a_job_just_finished_is_not_reported(
        client, timer, registry, consumers, clock, caplog):
    """SQS refuses the receipt of a message the completer deleted meanwhile: nothing is
    wrong, and no `visibility_extend_failed` warning says otherwise (it did, in ordinary
    runs). A job still held whose message is gone (a redelivered copy deleted by another
    receiver) is said once at INFO and not extended again (it warned every heartbeat); any
    other refusal of a held job's extension is still a warning."""
    caplog.set_level(logging.INFO)
    registry.add("work", lambda payload, ctx: None)
    consumer = consumers(clock)
    client.schedule_many([{"kind": "work"}, {"kind": "work"}])
    dispatch(timer)
    assert len(receive(consumer, 2)) == 2
    pipe = consumer.pipe
    done, held = pipe.tracker.items()
    real = pipe.transport
    pipe.transport = FinishesFirst(real, pipe.tracker, done)
    try:
        assert consumer.visibility.extend() == 0
    finally:
        pipe.transport = real
    assert not [r for r in caplog.records if getattr(r, "event", "") ==
                "visibility_extend_failed"]
    real.delete_batch(held.queue, [held.receipt])  # gone, though the job is still held
    assert consumer.visibility.extend() == 0
    assert consumer.visibility.extend() == 0  # not asked again
    stopped = [r for r in caplog.records if getattr(r, "event", "") ==
               "visibility_extend_stopped"]
    assert [(r.levelname, r.fields["job_ids"]) for r in stopped] == [("INFO", [held.job_id])]
    assert held.message_gone and pipe.tracker.holds(held)
    held.message_gone = False
    pipe.transport = Refuses(real)
    try:
        assert consumer.visibility.extend() == 1
    finally:
        pipe.transport = real
    assert [r.fields["code"] for r in caplog.records
            if getattr(r, "event", "") == "visibility_extend_failed"] == ["InternalError"]


class Refuses:
    """Every visibility extension refused for a reason other than a gone message."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def change_visibility_batch(self, queue: str, receipts: list[str], timeout: int) -> Any:
        return [EntryFailure(str(i), "InternalError", "try again") for i in range(len(receipts))]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_shutdown_keeps_to_its_grace_while_a_receive_hangs(
        consumer_settings, registry, transport, queue_prefix, sqs_server, monkeypatch):
    # SQS stops answering (a partition: connections open, no reply). A receive then waits
    # out up to three call timeouts; the shutdown must not wait for it, or the platform's
    # SIGKILL (ECS StopTimeout, terminationGracePeriodSeconds) comes before the release.
    from tests.faults.proxy import TcpProxy

    upstream = int(sqs_server.endpoint.rsplit(":", 1)[1].rstrip("/"))
    proxy = TcpProxy(upstream).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{proxy.port}")
    hanging = SqsTransport(queue_prefix, call_timeout_seconds=10)
    settings = consumer_settings.model_copy(update={
        "shutdown_grace_seconds": 1.0, "receive_wait_seconds": 1,
        "sqs_call_timeout_seconds": 10})
    consumer = Consumer(settings, registry, hanging)
    try:
        consumer.start()
        wait_for(lambda: proxy.stats.accepted > 0, message="a receive through the proxy")
        proxy.partition("hang")
        wait_for(lambda: proxy.stats.held >= 1, message="a receive hanging")
        started = time.monotonic()
        consumer.shutdown()
        took = time.monotonic() - started
    finally:
        proxy.close()
    # The hung receive alone would hold it 3 x (10 + 20) s; the grace is 1 s, and the
    # other loops settle at once (no job was running).
    assert took < 10, f"shutdown took {took:.1f} s"


POISON = "not a tock message"


class HangingDropDelete:
    """SQS hands out the poison message and the job's message in one receive, then is cut
    off: the DeleteMessageBatch of the poison message hangs until released (as a call into
    a partition does, up to its timeouts). Everything else is real."""

    def __init__(self, inner: SqsTransport) -> None:
        self.inner = inner
        self.poison: set[str] = set()
        self.hanging = threading.Event()
        self.release = threading.Event()
        self._one_receiver = threading.Lock()

    def receive(self, queue: str, max_messages: int, wait_seconds: int,
                visibility_timeout: int) -> Any:
        got: list[Any] = []
        with self._one_receiver:  # both messages to one receiver thread
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += self.inner.receive(queue, max_messages - len(got), 1,
                                          visibility_timeout)
        self.poison |= {m.receipt for m in got if m.body == POISON}
        return got

    def delete_batch(self, queue: str, receipts: list[str]) -> Any:
        if self.poison & set(receipts):
            self.hanging.set()
            self.release.wait(60)
        return self.inner.delete_batch(queue, receipts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_claimed_jobs_do_not_wait_for_sqs_deleting_the_messages_that_claimed_nothing(
        client, db, timer, transport, registry, running, caplog):
    """A receive brings a job's message and one that claims nothing (poison, a stale copy);
    SQS is cut off before the second is deleted. The claimed job is tracked and runs at
    once: it used to wait, untracked, for the delete, and a delete hung past two leases
    got it let go by the heartbeat (`untracked_job_released`) and rescued by the timer
    while this worker was about to run it: run twice."""
    caplog.set_level(logging.INFO)
    ran = threading.Event()
    attempts: list[int] = []
    registry.add("work", lambda p, c: (attempts.append(c.attempt), ran.set()))
    transport.client.send_message(QueueUrl=transport.url("default"), MessageBody=POISON)
    job = client.schedule("work")
    dispatch(timer)
    hanging = HangingDropDelete(transport)
    running(hanging, lease_seconds=2, heartbeat_seconds=0.5, visibility_timeout_seconds=30)
    assert hanging.hanging.wait(30), "the poison message's delete hangs"
    try:
        assert ran.wait(10), "the claimed job runs while SQS hangs on the other delete"
        # The fault's window, not a wait for the system: the delete hangs for three leases
        # (2 s each) while a timer pass runs every 0.2 s, any of which would rescue the job
        # were it let go. The property is that none does.
        for _ in range(30):
            timer.run_once()
            hold_fault(0.2, "between two timer passes while the delete hangs")
    finally:
        hanging.release.set()
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the job succeeded")
    assert [a.outcome for a in client.get(job.id, with_attempts=True).attempts] == [
        AttemptOutcome.SUCCEEDED]
    assert attempts == [1], "one run"
    assert not [r for r in caplog.records if getattr(r, "event", "") in (
        "untracked_job_released", "lease_expired", "result_discarded")]


def test_an_sqs_that_does_not_answer_gets_three_tries_and_a_receive_stays_within_the_bound(
        monkeypatch, consumer_settings, registry):
    """An endpoint that accepts connections and never answers (SQS cut off): each call is
    tried ATTEMPTS times, as TOCK_SQS_CALL_TIMEOUT_SECONDS' description says (botocore's
    `max_attempts: 3` made it 4), and the receivers' pass bound covers a long poll that
    hangs through all of them, so a partition does not fail liveness (it did past 92 s by
    default, where a hung receive took 4 x 30 s)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{silent.getsockname()[1]}")
    try:
        hung = SqsTransport("silent-", call_timeout_seconds=0.5)
        try:
            hung.depth("default")
        except Exception as exc:
            assert "timeout" in str(exc).lower()
        else:
            raise AssertionError("a silent endpoint answered")
        assert len(accepted) == ATTEMPTS == 3, "one connection per try"
    finally:
        silent.close()
        for conn in accepted:
            conn.close()
    poll = hung._poll.meta.config
    assert poll.read_timeout == 0.5 + MAX_WAIT_SECONDS
    settings = consumer_settings.model_copy(update={"sqs_call_timeout_seconds": 10})
    consumer = Consumer(settings, registry, SqsTransport(settings.queue_prefix))
    try:
        claimer = consumer.claimers["default"]
        assert isinstance(claimer, Claimer)
        hung_receive = ATTEMPTS * (settings.sqs_call_timeout_seconds + MAX_WAIT_SECONDS) + 7
        assert claimer.pass_bound_seconds > hung_receive
    finally:
        consumer.close()


def test_a_running_jobs_message_deleted_as_a_redelivery_resends_no_waiting_job(
        client, timer, transport, registry, consumers, clock, clock_now):
    """A running job's message can be gone while it runs: its visibility lapsed (an SQS
    partition), another receiver got the copy and deleted it (`not_dispatched`). The
    lost-message check counted one message in flight per running job, took the gap for a
    lost message of a waiting job and re-sent it, though its message was still queued
    (the job then lost its place: its first message was dropped as stale)."""
    registry.add("work", lambda p, c: None)
    running_job = client.schedule("work")
    dispatch(timer, clock_now)
    consumer = consumers(clock)
    assert len(receive(consumer, 1)) == 1
    (item,) = consumer.in_flight()
    assert item.job_id == running_job.id
    transport.delete_batch("default", [item.receipt])  # the redelivered copy's drop
    waiting = client.schedule_many([{"kind": "work"}, {"kind": "work"}])
    dispatch(timer, clock_now)
    tokens = {j.id: client.get(j.id).dispatch_token for j in waiting}
    later = clock_now + timedelta(minutes=10)
    assert timer.lost_messages.redispatch_stuck(later) == 0
    assert {j.id: client.get(j.id).dispatch_token for j in waiting} == tokens, "none resent"


def test_a_lost_message_is_resent_while_running_jobs_hold_messages_of_their_own(
        client, timer, transport, registry, consumers, clock, clock_now):
    """Each running job holds its message in flight until its outcome is written. Counted
    as dispatched jobs' messages, those hid one lost message each: a job whose message
    was purged waited minutes while work flowed (found by a fault walkthrough)."""
    registry.add("work", lambda p, c: None)
    running_job = client.schedule("work")
    dispatch(timer, clock_now)
    consumer = consumers(clock)
    assert [i.job_id for i in (e.item for e in receive(consumer, 1))] == [running_job.id]
    waiting = client.schedule("work")
    dispatch(timer, clock_now)
    sent = client.get(waiting.id).dispatch_token
    [message] = transport.receive("default", 1, 0, 30)  # lost: someone else deleted it
    assert transport.delete_batch("default", [message.receipt]) == []
    later = clock_now + timedelta(minutes=10)
    assert timer.lost_messages.redispatch_stuck(later) == 1
    again = client.get(waiting.id)
    assert again.state is JobState.SCHEDULED and again.dispatch_token != sent


def test_a_queue_made_as_its_first_batch_is_sent_resends_nothing(
        client, timer, transport, clock_now):
    """The claim's now() (dispatched_at) comes before the queue the send creates: judged
    by the queue's creation time alone, the whole first batch looked lost and went twice."""
    early = clock_now - timedelta(seconds=5)
    jobs = client.schedule_many([{"kind": "work", "queue": "fresh", "at": early}
                                 for _ in range(3)])
    transport.create_queue("fresh", visibility_timeout=60)
    try:
        assert dispatch(timer, early) == 3
        tokens = {j.id: client.get(j.id).dispatch_token for j in jobs}
        assert timer.lost_messages.redispatch_stuck(clock_now + timedelta(minutes=10)) == 0
        assert {j.id: client.get(j.id).dispatch_token for j in jobs} == tokens
    finally:
        transport.client.delete_queue(QueueUrl=transport.url("fresh"))


def test_messages_lost_with_a_recreated_queue_are_resent_while_running_jobs_hold_others(
        client, db, timer, transport, registry, consumers, clock, clock_now):
    """A queue deleted and created again (a LocalStack restart) loses what was sent to it.
    Counting alone missed that while running jobs held messages in the new queue (as many
    as were lost, here): the lost jobs waited until those finished, for minutes under load
    (found by hand: make run, LocalStack killed). Sent before the queue's creation time,
    they are re-sent at once."""
    registry.add("work", lambda p, c: None)
    lost = client.schedule_many([{"kind": "work"}, {"kind": "work"}])
    dispatch(timer, clock_now)
    sent = {j.id: client.get(j.id).dispatch_token for j in lost}
    # SQS gives the creation time in whole seconds: make it later than those dispatches.
    wait_for(lambda: db_now(db) > clock_now + timedelta(seconds=1.5), timeout=10,
             message="a second past the dispatch")
    transport.client.delete_queue(QueueUrl=transport.url("default"))
    transport.create_queue("default", visibility_timeout=60)
    created = transport.created_at("default")
    assert created is not None and created > clock_now
    held = client.schedule_many([{"kind": "work"}, {"kind": "work"}])
    assert dispatch(timer, db_now(db) + timedelta(seconds=2)) == 2
    consumer = consumers(clock)
    assert len(receive(consumer, 2)) == 2
    assert {i.job_id for i in consumer.in_flight()} == {j.id for j in held}
    assert transport.depth("default") == 2, "as many messages as dispatched jobs"
    later = clock_now + timedelta(minutes=10)
    assert timer.lost_messages.redispatch_stuck(later) == 2
    for job in lost:
        again = client.get(job.id)
        assert again.state in (JobState.SCHEDULED, JobState.RETRYING), again.state
        assert again.dispatch_token != sent[job.id]


def test_empty_replies_from_sqs_are_failures_and_the_timer_sends_again_after(
        client, timer_settings, transport, queue_prefix, clock_now):
    """A LocalStack being killed or started answers 200 with an empty body, which boto3
    returns as a reply with no fields. Nothing may read that as success, nor crash on it:
    a queue lookup is a TransportError (it was a KeyError that stopped the timer's dispatch
    loop), and a batch entry the reply does not mention failed (a send the reply did not
    confirm leaves the job due)."""
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client())
        via.url("default")  # known before the server goes strange, as in a running timer
        timer = Timer(timer_settings, via)
        try:
            job = client.schedule("k")
            transport.send_batch("default", [Outgoing("m", "held")])
            [held] = wait_for(lambda: via.receive("default", wait_seconds=1,
                                                  visibility_timeout=60),
                              timeout=20, message="the message arrives")
            gateway.empty = True

            with pytest.raises(TransportError, match="answered without QueueUrl"):
                SqsTransport(queue_prefix, client=gateway.client()).url("default")
            with pytest.raises(TransportError, match="answered without QueueUrl"):
                SqsTransport(queue_prefix, client=gateway.client()).create_queue("other")
            assert [f.code for f in via.delete_batch("default", [held.receipt])] == [NO_REPLY]
            assert [f.code for f in via.change_visibility_batch(
                "default", [held.receipt], 30)] == [NO_REPLY]
            first = timer.run_once(clock_now)
            assert (first.dispatched, first.refused) == (0, 1)
            assert client.get(job.id).state is JobState.SCHEDULED
            assert gateway.emptied >= 5

            gateway.empty = False
            again = timer.run_once(clock_now + timedelta(minutes=10))
            assert (again.dispatched, again.refused) == (1, 0)
            assert client.get(job.id).state is JobState.DISPATCHED
        finally:
            timer.close()


@pytest.mark.parametrize(("operation", "reply", "call"), [
    ("GetQueueAttributes", b"", "counts"),
    ("GetQueueAttributes", b'{"Attributes": "x"}', "counts"),
    ("GetQueueAttributes", b'{"Attributes": {"ApproximateNumberOfMessages": "abc"}}', "counts"),
    ("GetQueueAttributes", b'{"Attributes": {"CreatedTimestamp": "9' + b"9" * 30 + b'"}}',
     "created_at"),
    ("ReceiveMessage", b'{"Messages": "x"}', "receive"),
    ("ReceiveMessage", b'{"Messages": [1]}', "receive"),
    ("ReceiveMessage", b'{"Messages": [{"MessageId": 5, "ReceiptHandle": "r"}]}', "receive"),
    ("SendMessageBatch", b'{"Successful": "x"}', "send"),
])
def test_a_reply_of_the_wrong_shape_is_a_transport_error_not_a_crash(
        transport, queue_prefix, operation, reply, call):
    """A chaos walkthrough's proxy garbled SQS's replies: the timer's and the consumer's
    loops crashed (exit 70) on an int() of "abc", a timestamp out of range and botocore's
    own AttributeError. Each is a TransportError, which the loops retry."""
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client())
        via.url("default")
        gateway.replies[operation] = reply
        calls = {"counts": lambda: via.counts("default"),
                 "created_at": lambda: via.created_at("default"),
                 "receive": lambda: via.receive("default", wait_seconds=0),
                 "send": lambda: via.send_batch("default", [Outgoing("1", "b")])}
        with pytest.raises(TransportError, match="SQS"):
            calls[call]()


def test_an_empty_count_reply_sends_no_backlog_again(client, timer_settings, transport,
                                                      queue_prefix, clock_now):
    """Read as zeros, an empty GetQueueAttributes reply said the queue was empty, and the
    timer sent every old dispatched job again, pass after pass (a chaos walkthrough saw
    the same jobs go out three times in 30 s). No count, no evidence, no resend."""
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client())
        timer = Timer(timer_settings, via)
        try:
            jobs = client.schedule_many([{"kind": "k"} for _ in range(5)])
            dispatch(timer, clock_now)
            tokens = {j.id: client.get(j.id).dispatch_token for j in jobs}
            gateway.replies["GetQueueAttributes"] = b""
            later = clock_now + timedelta(minutes=10)
            assert timer.lost_messages.redispatch_stuck(later) == 0
            assert {j.id: client.get(j.id).dispatch_token for j in jobs} == tokens
            gateway.replies.clear()
            assert timer.lost_messages.redispatch_stuck(later) == 0, "all five are in SQS"
        finally:
            timer.close()


def test_a_hung_sqs_does_not_hold_up_the_lease_rescue(db, timer_settings, transport,
                                                      queue_prefix):
    """The lost-message check asks SQS, which can hang for 3 x the call timeout per queue;
    it shared a pass with the lease rescue, so a consumer killed during an SQS freeze had
    its jobs rescued half a minute late (a chaos walkthrough). Now the rescue goes on."""
    settings = timer_settings.model_copy(update={"dispatch_timeout_seconds": 5,
                                                  "maintenance_interval_seconds": 0.2})
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        timer = Timer(settings, SqsTransport(queue_prefix, client=gateway.client()))
        try:
            now = db_now(db)
            add_dispatched(db, now, dispatched_at=now - timedelta(minutes=5))
            lease = add_running(db, now, worker="gone", lease_until=now - timedelta(seconds=5))
            timer.rescuer.store.heartbeat(Worker("gone", "h", 1, ["default"], [], 4, 1),
                                          [lease], 1, now=now - timedelta(seconds=6))
            gateway.hang.add("GetQueueAttributes")
            timer.start()
            wait_for(lambda: gateway.held, timeout=30, message="the SQS count to hang")
            wait_for(lambda: db.execute("SELECT state::text FROM tock_jobs_all WHERE id = %s",
                                        (lease.job_id,)).fetchone()[0] == "retrying",
                     timeout=30, message="the expired lease rescued while SQS hangs")
            assert not gateway.release.is_set()
        finally:
            gateway.release.set()
            timer.stop()


def test_a_hung_delete_is_not_followed_by_the_rest_of_the_pass(
        consumer_settings, registry, transport, queue_prefix):
    """The completer deletes a written group's messages 10 per call: into an SQS that does
    not answer, each call waited out its retries, and the outcomes behind them waited for
    all of them (a pass of 5 x 3 x the call timeout failed liveness). One unanswered call
    ends the pass: the rest come back after their visibility timeout and claim nothing."""
    settings = consumer_settings.model_copy(update={"sqs_call_timeout_seconds": 0.5})
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client(read_timeout=0.5,
                                                                attempts=ATTEMPTS))
        via.url("default")
        consumer = make_consumer(settings, registry, via)
        try:
            gateway.hang.add("DeleteMessageBatch")
            consumer.pipe.delete("default", [f"receipt-{i}" for i in range(50)])
            assert gateway.held == ATTEMPTS, "one call's tries, then no more"
            gateway.hang.add("ChangeMessageVisibilityBatch")
            consumer.pipe.make_visible("default", [f"receipt-{i}" for i in range(50)])
            assert gateway.held == 2 * ATTEMPTS
        finally:
            gateway.release.set()
            consumer.close()
    assert consumer.completer.pass_bound_seconds >= 120
    slow = consumer_settings.model_copy(update={"sqs_call_timeout_seconds": 45})
    bound = make_consumer(slow, registry, transport)
    try:
        # A 45 s call timeout: one unanswered call takes 3 x 45 s, within the bound.
        assert bound.completer.pass_bound_seconds >= 3 * 45
        assert bound.visibility.pass_bound_seconds >= 3 * 45
    finally:
        bound.close()


def test_a_creation_time_with_a_fraction_is_read(transport, queue_prefix):
    """moto's server gives CreatedTimestamp with a fraction of a second ("1796609476.27"),
    which `int()` refused: the lost-message check crashed on it."""
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client())
        via.url("default")
        gateway.replies["GetQueueAttributes"] = (
            b'{"Attributes": {"CreatedTimestamp": "1796609476.278097"}}')
        created = via.created_at("default")
        assert created is not None and created.timestamp() == pytest.approx(1796609476.278097)


def test_outcomes_are_written_while_a_delete_hangs(client, consumer_settings, registry,
                                                   timer, transport, queue_prefix, running):
    """The completer deleted each batch's messages on its own thread: a DeleteMessageBatch
    that hung held up every outcome behind it (a chaos walkthrough: finished jobs written
    30 s late). The deletes are the deleter loop's now; the outcomes go on."""
    registry.add("quick", lambda p, c: None)
    with SqsGateway(os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        via = SqsTransport(queue_prefix, client=gateway.client(read_timeout=60))
        consumer = running(via)
        try:
            gateway.hang.add("DeleteMessageBatch")
            first = client.schedule("quick")
            dispatch(timer)
            wait_for(lambda: client.get(first.id).state is JobState.SUCCEEDED, timeout=30,
                     message="the first job's outcome")
            wait_for(lambda: gateway.held, timeout=30, message="its delete to hang")
            second = client.schedule("quick")
            dispatch(timer)
            wait_for(lambda: client.get(second.id).state is JobState.SUCCEEDED, timeout=20,
                     message="the second job's outcome, while the first delete hangs")
            assert not gateway.release.is_set()
        finally:
            gateway.release.set()
    wait_for(lambda: transport.depth("default") == 0, timeout=60,
             message="both messages deleted once SQS answers")
    assert consumer.deleter.pass_bound_seconds >= 120
