"""The call timeout's watchdog (shared.store.watchdog) under the faults around it: a forked
child, a closed pool, a connection whose backend hangs while new ones work (a proxy with a
dead backend), a call that ends just as it is found late, a transaction whose BEGIN is the
statement that hangs, and a statement timeout after a batch's insert committed. Every
stopped process is continued in a `finally`, and every call that could hang runs on a
thread waited for with a bound."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import psycopg

from shared.client import Client
from shared.core.errors import ConnectionLost, Retryable
from shared.runtime.settings import ClientSettings
from shared.store import watchdog as watchdog_module
from shared.store.database import Database
from shared.store.job_store import JobStore
from tests.integration.test_hung_server import _in_thread, frozen
from tests.support.wait import wait_for


def _outcome(call: Callable[[], Any], timeout: float) -> Any:
    out = _in_thread(call)
    wait_for(lambda: out, timeout=timeout, message="the call to end")
    return out[0]


def test_a_forked_child_leaves_its_parents_connections_alone(server):
    database = Database(server.url(), name="tock-test-fork", check=False, max_size=1,
                        answer_timeout=0.5)
    try:
        inside, leave = threading.Event(), threading.Event()

        def hold() -> None:  # a call of the parent in progress when it forks
            with database.connection():
                inside.set()
                leave.wait(30)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        assert inside.wait(10)
        assert database._watchdog is not None
        deadline = max(d for d, _ in database._watchdog._watched.values())
        pid = os.fork()
        if pid == 0:  # the child: one call of its own, then live past the parent's deadline
            code = 1
            try:
                with database.connection() as conn:
                    conn.execute("SELECT 1")
                while time.monotonic() < deadline + 1.5:  # six rounds of any watchdog
                    time.sleep(0.05)
                code = 0
            finally:
                os._exit(code)
        leave.set()
        holder.join(10)
        finished = wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, timeout=60,
                            message="the child to exit")
        assert finished
        # The parent's connection (back in its pool) was not cut by the child.
        with database.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        database.close()


def test_a_closed_pool_still_cuts_a_hung_call_and_then_leaves_no_thread(server):
    database = Database(server.url(), name="tock-test-close", check=False,
                        answer_timeout=0.5)
    with database.connection() as conn:
        conn.execute("SELECT 1")
    assert database._watchdog is not None
    thread = database._watchdog._thread
    assert thread is not None and thread.is_alive()
    with frozen(server):
        def call() -> Any:
            with database.connection() as conn:
                return conn.execute("SELECT 1").fetchone()
        out = _in_thread(call)
        wait_for(lambda: database._watchdog is not None and database._watchdog._watched,
                 timeout=10, message="the call waiting")
        database.close()
        wait_for(lambda: out, timeout=30, message="the hung call given up after close()")
    assert isinstance(out[0], ConnectionLost), out[0]
    assert "did not answer" in str(out[0])
    wait_for(lambda: not thread.is_alive(), timeout=10, message="the watchdog thread to end")


def test_the_recheck_does_not_hang_on_connections_whose_backend_hangs(server):
    """New connections work, the pool's idle ones never answer (a proxy whose backend
    hung): the recheck after the lost connection gives them up too, and the pool is
    whole again."""
    client = Client(ClientSettings(database_url=server.url(), call_timeout_seconds=0.5,
                                   pool_max_size=3), pool_timeout=2)
    database = client.database
    stopped: list[psutil.Process] = []
    try:
        database.open()
        conns = [database.pool.getconn(timeout=10) for _ in range(3)]
        backends = [psutil.Process(c.info.backend_pid) for c in conns]
        for c in conns:
            database.pool.putconn(c)
        for p in backends:
            p.send_signal(signal.SIGSTOP)
            stopped.append(p)
        _outcome(lambda: client.schedule("k"), timeout=60)
        wait_for(lambda: not database._rechecking.locked(), timeout=60,
                 message="the recheck of the idle connections to end")
        # All three connections serve again: three calls held at once all get one.
        barrier = threading.Barrier(3, timeout=30)

        def held_call() -> Any:
            with database.connection() as conn:
                barrier.wait()
                return conn.execute("SELECT 1").fetchone()
        outs = [_in_thread(held_call) for _ in range(3)]
        wait_for(lambda: all(outs), timeout=60, message="three concurrent calls")
        assert [o[0] for o in outs] == [(1,)] * 3, outs
    finally:
        for p in stopped:
            p.send_signal(signal.SIGCONT)
        client.close()


def test_the_watchdog_cuts_only_the_late_calls_connection(server, monkeypatch):
    """A call found late that ends at that instant: its connection, back in the pool and
    given to the next call, is not cut under that call."""
    database = Database(server.url(), name="tock-test-race", max_size=1, answer_timeout=0.5)
    real_cut = watchdog_module.cut
    next_call_has_it, cut_done = threading.Event(), threading.Event()

    def slow_cut(conn: psycopg.Connection[Any]) -> None:
        # Widen the window between deciding to cut and cutting: wait (a little) for the
        # next call to hold the connection, which it cannot while the late call's block
        # cannot end.
        next_call_has_it.wait(1.0)
        real_cut(conn)
        cut_done.set()

    monkeypatch.setattr(watchdog_module, "cut", slow_cut)
    try:
        watchdog = database._watchdog
        assert watchdog is not None

        def late_call() -> None:
            with database.connection() as conn:
                conn.execute("SELECT 1")
                wait_for(lambda: watchdog.fired(conn), timeout=30, message="found late")

        late = _in_thread(late_call)
        wait_for(lambda: watchdog._fired, timeout=30, message="the watchdog deciding")

        def next_call() -> Any:
            with database.connection() as conn:
                next_call_has_it.set()
                assert cut_done.wait(30)
                return conn.execute("SELECT 1").fetchone()

        assert _outcome(next_call, timeout=60) == (1,)
        wait_for(lambda: late, timeout=30, message="the late call to end")
    finally:
        database.close()


def test_a_transaction_whose_begin_hangs_says_the_server_did_not_answer(server):
    database = Database(server.url(), name="tock-test-begin", check=False,
                        answer_timeout=0.5)
    try:
        with database.connection() as conn:
            conn.execute("SELECT 1")

        def call() -> Any:
            with database.transaction() as conn:
                return conn.execute("SELECT 1").fetchone()

        with frozen(server):
            error = _outcome(call, timeout=60)
        assert isinstance(error, ConnectionLost), error
        assert "did not answer within 5.5 s" in str(error)
    finally:
        database.close()


def test_a_statement_timeout_after_the_insert_committed_does_not_say_nothing_was_written(
        server, monkeypatch):
    client = Client(ClientSettings(database_url=server.url(), call_timeout_seconds=0.5))
    locker = psycopg.connect(server.url())
    try:
        client.schedule("k", key="taken")
        real = JobStore.jobs_by_key

        def behind_a_lock(self: JobStore, keys: Any) -> Any:
            # The retention loop's partition DDL, say, holds the history table meanwhile.
            locker.execute("LOCK TABLE tock_history_jobs IN ACCESS EXCLUSIVE MODE")
            return real(self, keys)

        monkeypatch.setattr(JobStore, "jobs_by_key", behind_a_lock)
        error = _outcome(lambda: client.schedule_many(
            [{"kind": "fresh"}, {"kind": "k", "key": "taken"}]), timeout=60)
        locker.rollback()
        monkeypatch.undo()
        assert isinstance(error, Retryable), error
        count = client._jobs._one("SELECT count(*) FROM tock_jobs WHERE kind = 'fresh'")
        assert count == (1,), "the keyless job was written"
        assert "nothing was written" not in str(error), error
        assert "calling again with the same keys is safe" in str(error)
    finally:
        locker.close()
        client.close()
