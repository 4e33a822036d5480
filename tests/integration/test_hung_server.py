"""A server that keeps the connection open but says nothing (a frozen host or process: the
kernel still acknowledges, so TCP never gives up): a client call is given up after its call
timeout instead of waiting for ever, says why, and the client works again once the server
does. And a statement Postgres itself is slow to finish (a keyed insert waiting behind
another transaction) is cancelled by the server at the call timeout, saying so. The fault
is real: every process of the test's own Postgres server is stopped with SIGSTOP."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psutil
import psycopg
import pytest

from devstack.postgres import PostgresServer
from shared.client import Client
from shared.core.errors import ConnectionLost, DatabaseUnavailable, Retryable
from shared.core.filters import JobFilter
from shared.core.states import JobState
from shared.ops import jobs as ops_jobs
from shared.runtime.settings import ClientSettings
from shared.store.database import Database
from shared.store.operator_store import OperatorStore
from shared.store.watchdog import GRACE_SECONDS
from tests.support.drive import timer_running
from tests.support.wait import wait_for


@contextmanager
def frozen(server: PostgresServer) -> Iterator[None]:
    """Every process of the server stopped (SIGSTOP) for the block, then continued."""
    postmaster = psutil.Process(int((server.data_dir / "data" / "postmaster.pid")
                                    .read_text().split()[0]))
    processes = [postmaster, *postmaster.children(recursive=True)]
    for p in processes:
        with suppress(psutil.NoSuchProcess):  # a backend whose client just left
            p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in processes:
            with suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)


def _in_thread(call: Callable[[], Any]) -> list[BaseException | Any]:
    """Run `call` on a thread; the list gets its result or its exception."""
    out: list[BaseException | Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test as the call's outcome
            out.append(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


def test_a_statement_to_a_frozen_server_is_given_up_after_the_answer_timeout(server):
    database = Database(server.url(), name="tock-test-hung", check=False, answer_timeout=0.5)
    try:
        with database.connection() as conn:
            conn.execute("SELECT 1")
        with frozen(server):
            def call() -> Any:
                with database.connection() as conn:
                    return conn.execute("SELECT 1").fetchone()
            outcome = _in_thread(call)
            wait_for(lambda: outcome, timeout=0.5 + GRACE_SECONDS + 20,
                     message="the call given up")
        error = outcome[0]
        assert isinstance(error, ConnectionLost), error
        assert "did not answer within 5.5 s" in str(error)
        assert "hung server or proxy" in str(error)
        with database.connection() as conn:  # the cut connection was dropped, not reused
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        database.close()


def test_a_client_call_to_a_frozen_server_fails_in_bounded_time_and_works_after(server):
    client = Client(ClientSettings(database_url=server.url(), call_timeout_seconds=0.5),
                    pool_timeout=2)
    try:
        client.schedule("k")
        with frozen(server):
            outcome = _in_thread(lambda: client.schedule("k"))
            wait_for(lambda: outcome, timeout=60, message="the call given up")
        assert isinstance(outcome[0], DatabaseUnavailable), outcome[0]
        job = wait_for(lambda: _ok(lambda: client.schedule("k")), timeout=30,
                       message="a call succeeding once the server answers again")
        assert client.get(job.id).state is JobState.SCHEDULED
    finally:
        client.close()


def _ok(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except DatabaseUnavailable:
        return None


def test_a_keyed_insert_behind_another_transaction_stops_at_the_call_timeout(server):
    key = "welcome:1"
    client = Client(ClientSettings(database_url=server.url(), call_timeout_seconds=0.5))
    other = psycopg.connect(server.url())  # a transaction left open, holding the key
    try:
        client.schedule("k", key=key, connection=other)
        outcome = _in_thread(lambda: client.schedule("k", key=key))
        wait_for(lambda: outcome, timeout=30, message="the call given up")
        error = outcome[0]
        assert isinstance(error, Retryable), error
        assert "statement timeout" in str(error)
        assert "longer than the call timeout, 0.5 s" in str(error)
        assert "nothing was written" in str(error)
        assert "TOCK_CALL_TIMEOUT_SECONDS" in str(error), "names the setting to raise"
        other.commit()
        again = client.schedule("k", key=key)
        assert not again.created, "the other transaction's job, once it committed"
    finally:
        other.close()
        client.close()


def test_a_timer_logs_its_loops_stalled_on_a_frozen_server_and_resumed_after(
        server, timer_settings, transport, caplog):
    """A hung Postgres raises no error for the services' loops to log: their passes just
    wait. The process says so anyway (`loop_stalled`), and again when the pass ends."""
    settings = timer_settings.model_copy(update={"database_url": server.url()})
    caplog.set_level("INFO", logger="tock.supervisor")
    with timer_running(settings, transport) as timer:
        for loop in timer.supervisor.loops:
            loop.stall_log_seconds = 1.0  # the default 10 s, shortened for the test
        wait_for(lambda: timer.supervisor.ready()[0], timeout=30, message="timer ready")
        with frozen(server):
            wait_for(lambda: "loop_stalled" in caplog.text, timeout=30,
                     message="a stalled loop logged while Postgres is frozen")
        wait_for(lambda: "loop_resumed" in caplog.text, timeout=30,
                 message="the stalled pass's end logged once Postgres answers")
        assert timer.supervisor.live()[0], timer.supervisor.live()[1]


def test_a_consumer_stopping_while_the_server_hangs_stops_within_its_bound(
        server, consumer_settings, timer_settings, registry, transport, monkeypatch, caplog):
    """SIGTERM with a job still running releases it, which writes to Postgres: with every
    Postgres process stopped, that write never ended, and the consumer outlived its grace
    by as long as the freeze (found by a fault walkthrough). It now stops at the bound,
    leaving the job to its lease, as a kill would."""
    from consumer import service

    monkeypatch.setattr(service, "LAST_WRITES_SECONDS", 2.0)
    started, let_go = threading.Event(), threading.Event()

    def slow(payload: Any, ctx: Any) -> None:
        started.set()
        let_go.wait(60)

    registry.add("slow", slow)
    url = server.url()
    consumer = service.Consumer(
        consumer_settings.model_copy(update={"database_url": url,
                                             "shutdown_grace_seconds": 0.5}),
        registry, transport)
    client = Client(ClientSettings(database_url=url))
    try:
        consumer.start()
        job = client.schedule("slow")
        with timer_running(timer_settings.model_copy(update={"database_url": url}),
                           transport):
            assert started.wait(30)
        caplog.set_level(logging.ERROR, logger="tock.consumer")
        with frozen(server):
            stopped = _in_thread(consumer.shutdown)
            wait_for(lambda: stopped, timeout=0.5 + 2.0 + 15, message="shutdown ended")
        assert consumer.cut_short
        assert [r for r in caplog.records if getattr(r, "event", None) == "shutdown_cut_short"]
        # Left to its lease, as a kill would leave it; or released, if the release write
        # stuck in the frozen server committed once it thawed (here the process does not
        # exit; a real one's exit closes the connection and the server rolls it back).
        # Either way it runs again.
        assert client.get(job.id).state in (JobState.RUNNING, JobState.SCHEDULED)
    finally:
        let_go.set()
        client.close()


def test_a_bulk_action_cut_off_by_a_crash_says_how_much_it_did(server):
    """Each batch commits on its own: an error that said only "database unavailable" read
    as nothing done, though thousands of jobs were cancelled (fault walkthrough). The error
    now says how many, and the caller hears of each commit (it logs the partial action)."""
    url = server.url()
    database = Database(url, name="tock-test-bulk", timeout=2)
    client = Client(ClientSettings(database_url=url))
    try:
        client.schedule_many([{"kind": "far", "delay": 3600} for _ in range(5)])
        committed: list[int] = []

        def crash_after_the_first(total: int) -> None:
            committed.append(total)
            server.stop("immediate")

        with pytest.raises(DatabaseUnavailable) as info:
            ops_jobs.run_bulk(OperatorStore(database), "cancel", JobFilter.of(kind="far"),
                              batch_size=2, committed=crash_after_the_first)
        assert committed == [2]
        assert ("; 2 job(s) were cancelled before it (each batch of 2 commits on its own): "
                "run the same action again to finish") in str(info.value)
        server.start()
        states = [client.get(j).state for j in range(1, 6)]
        assert states.count(JobState.CANCELLED) == 2
    finally:
        if not server.running():
            server.start()
        database.close()
        client.close()


def test_a_service_stopped_inside_a_transaction_does_not_hold_its_locks_for_ever(
        database_url, db, client):
    """A timer frozen (SIGSTOP, a hung host) in its dispatch transaction held the job's row
    lock for as long as it stayed frozen: every other timer skipped the job (11 minutes in
    a fault walkthrough). The server now ends a service's session that sits idle inside a
    transaction, and the lock goes with it. (Here the transaction is left idle on purpose;
    the bound is shortened from its default, SERVICE_IDLE_IN_TRANSACTION_SECONDS.)"""
    job = client.schedule("k")
    database = Database.for_service(database_url, name="tock-test-idle", max_size=1,
                                    idle_in_transaction_seconds=0.5)
    try:
        with database.connection() as conn:
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == (
                "500ms",)
            conn.execute("BEGIN")
            conn.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (job.id,))
            # ... and the process stops talking: another session gets the row once the
            # server has ended this one.
            wait_for(lambda: db.execute(
                "SELECT count(*) FROM (SELECT id FROM tock_jobs WHERE id = %s "
                "FOR UPDATE SKIP LOCKED) t", (job.id,)).fetchone() == (1,),
                timeout=15, message="the lock released by the server")
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
    except DatabaseUnavailable:
        pass  # the pool's own words for the same cut
    finally:
        database.close()
    default = Database.for_service(database_url, name="tock-test-default", max_size=1)
    try:
        assert "-c idle_in_transaction_session_timeout=120000" in default._kwargs["options"]
    finally:
        default.close()


def test_an_unexpected_error_in_shutdowns_last_writes_is_raised_not_lost(
        consumer_settings, registry, transport, monkeypatch):
    """The last writes run on a thread of their own (to bound them); an error there must
    still fail the shutdown, as it did on the caller's thread, not die with the thread."""
    from consumer import service

    registry.add("k", lambda payload, ctx: None)
    consumer = service.Consumer(consumer_settings, registry, transport)
    consumer.start()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the worker row could not be written")

    monkeypatch.setattr(consumer.pipe.store, "stop_worker", broken)
    with pytest.raises(RuntimeError, match="the worker row could not be written"):
        consumer.shutdown()
    assert not consumer.cut_short
    consumer.close()
