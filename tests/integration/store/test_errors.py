"""Errors leave the stores classified (shared.store.errors): against the real server, each
kind of failure comes out as its tock error, never as a raw psycopg one. Then `classify`
itself, on constructed psycopg errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import errors as pgerrors
from psycopg_pool import PoolTimeout

from shared.core.errors import (
    ConnectionLost,
    DatabaseBug,
    DatabaseError,
    DatabaseUnavailable,
    DataRejected,
    LockTimeout,
    Retryable,
)
from shared.store import Database, JobStore, OperatorStore, ScheduleStore
from shared.store.errors import classify, translated
from shared.store.rows import Claim, NewJob
from tests.integration.store.helpers import add_job, count, wait_until_blocked_by
from tests.support.wait import wait_for


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A dedicated autocommit connection, for a store bound to it with `Store.on`."""
    c = psycopg.connect(database_url, autocommit=True)
    yield c
    c.close()


def _raises(error: type[DatabaseError], call: Any, *, sqlstate: str | None = None
            ) -> DatabaseError:
    """`call()` raises exactly `error` (not a subclass), caused by a psycopg/encoding error."""
    with pytest.raises(DatabaseError) as caught:
        call()
    exc = caught.value
    assert type(exc) is error, f"{type(exc).__name__}: {exc}"
    assert not isinstance(exc, psycopg.Error)
    assert isinstance(exc.__cause__, psycopg.Error | UnicodeError)
    if sqlstate is not None:
        assert exc.sqlstate == sqlstate
    return exc


# --- values Postgres refuses: DataRejected ----------------------------------------------------


def test_a_bigint_out_of_range_is_data_rejected(job_store):
    _raises(DataRejected, lambda: job_store.claim_messages(
        [Claim(10**20, uuid4(), 3, 30.0)], "w1", 60))


def test_a_nul_byte_in_a_text_parameter_is_data_rejected(job_store, db):
    _raises(DataRejected, lambda: job_store.insert_jobs(
        [NewJob("k", "default", "{}", tenant="a\x00b")]))
    assert count(db, "tock_jobs") == 0


def test_a_lone_surrogate_is_data_rejected(job_store, db):
    _raises(DataRejected, lambda: job_store.insert_jobs(
        [NewJob("k", "default", "{}", tenant="\ud800")]))
    assert count(db, "tock_jobs") == 0


def test_a_check_constraint_violation_is_data_rejected(job_store, db):
    _raises(DataRejected, lambda: job_store.insert_jobs([NewJob("k", "default", "{}",
                                                                priority=10)]),
            sqlstate="23514")
    assert count(db, "tock_jobs") == 0


def test_a_smallint_out_of_range_is_data_rejected(job_store):
    _raises(DataRejected, lambda: job_store.insert_jobs([NewJob("k", "default", "{}",
                                                                priority=40_000)]),
            sqlstate="22003")


def test_invalid_json_is_data_rejected(job_store):
    _raises(DataRejected, lambda: job_store.insert_jobs([NewJob("k", "default", "{not json")]),
            sqlstate="22P02")


# --- transient failures: Retryable ------------------------------------------------------------


def test_a_statement_timeout_is_retryable(conn):
    conn.execute("SET statement_timeout = '1ms'")
    _raises(Retryable, lambda: JobStore.on(conn)._rows("SELECT pg_sleep(1)"), sqlstate="57014")


def test_a_lock_timeout_is_lock_timeout(conn, other, db):
    job = add_job(db, run_at=db.execute("SELECT now()").fetchone()[0])
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (job,))
    conn.execute("SET lock_timeout = '50ms'")
    _raises(LockTimeout, lambda: JobStore.on(conn).cancel_job(job), sqlstate="55P03")


def test_a_serialization_failure_is_retryable(database_url, db):
    job = add_job(db, run_at=db.execute("SELECT now()").fetchone()[0])
    with psycopg.connect(database_url) as tx_conn:
        tx_conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        tx_conn.execute("SELECT count(*) FROM tock_jobs")  # the snapshot is taken here
        db.execute("UPDATE tock_jobs SET last_error = 'changed' WHERE id = %s", (job,))
        _raises(Retryable, lambda: JobStore.on(tx_conn).cancel_job(job), sqlstate="40001")
        tx_conn.rollback()
    assert db.execute("SELECT state::text FROM tock_jobs WHERE id = %s",
                      (job,)).fetchone() == ("scheduled",)


def test_a_deadlock_is_retryable(database_url, db):
    now = db.execute("SELECT now()").fetchone()[0]
    first, second = add_job(db, run_at=now), add_job(db, run_at=now)
    lock = "SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE"
    with psycopg.connect(database_url) as a, psycopg.connect(database_url) as b:
        a.execute("SET deadlock_timeout = '10s'")  # b detects the deadlock, not a
        b.execute("SET deadlock_timeout = '20ms'")
        a.execute(lock, (first,))
        b.execute(lock, (second,))
        done = threading.Event()

        def a_waits_for_second() -> None:
            try:
                a.execute(lock, (second,))
            finally:
                done.set()

        thread = threading.Thread(target=a_waits_for_second)
        thread.start()
        try:
            wait_until_blocked_by(db, b.info.backend_pid)
            _raises(Retryable, lambda: JobStore.on(b).cancel_job(first), sqlstate="40P01")
            b.rollback()
            assert done.wait(10), "a gets its lock once b has given up"
        finally:
            thread.join(timeout=10)
        a.rollback()


# --- the connection: DatabaseUnavailable ------------------------------------------------------


def test_a_lost_connection_is_database_unavailable(conn, db):
    pid = conn.info.backend_pid
    assert db.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
    _raises(DatabaseUnavailable, lambda: JobStore.on(conn).get_job(1))
    assert conn.closed or conn.broken


@pytest.mark.parametrize("store_cls", [JobStore, ScheduleStore, OperatorStore])
def test_every_store_classifies_a_lost_connection(database_url, db, store_cls):
    c = psycopg.connect(database_url, autocommit=True)
    try:
        db.execute("SELECT pg_terminate_backend(%s, 5000)", (c.info.backend_pid,))
        _raises(DatabaseUnavailable, lambda: store_cls.on(c)._rows("SELECT 1"))
    finally:
        c.close()


def _wait_until_gone(db: Any, pid: int) -> None:
    wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone()[0] == 0,
             timeout=10, interval=0.01, message=f"backend {pid} to end")


def test_a_connection_closed_by_the_idle_session_timeout_is_database_unavailable(
        database_url, db):
    # A server (or a managed service's default) ends sessions idle for too long. A pool
    # without checkout checks (the services': `Database.for_service`) hands out such a
    # connection, and its next statement finds it gone, as after an admin shutdown.
    idle = Database(f"{database_url}?options=-c%20idle_session_timeout%3D100", check=False,
                    name="tock-test-idle")
    try:
        store = JobStore(idle)
        pid = store._rows("SELECT pg_backend_pid()")[0][0]
        _wait_until_gone(db, pid)
        # Lost once handed out: ConnectionLost, the DatabaseUnavailable that cannot say
        # whether a statement sent on it committed (here it could not have).
        _raises(ConnectionLost, lambda: store.get_job(1))
    finally:
        idle.close()


def test_a_transaction_closed_by_the_idle_in_transaction_timeout_is_database_unavailable(
        database_url, db):
    with psycopg.connect(database_url) as tx_conn:
        tx_conn.execute("SET idle_in_transaction_session_timeout = '50ms'")
        tx_conn.execute("SELECT 1")  # a transaction is open, and idle
        _wait_until_gone(db, tx_conn.info.backend_pid)
        _raises(DatabaseUnavailable, lambda: JobStore.on(tx_conn).get_job(1))


def test_a_database_nobody_answers_is_database_unavailable():
    unreachable = Database("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1",
                           timeout=0.2, name="tock-test-unreachable")
    try:
        exc = _raises(DatabaseUnavailable, lambda: JobStore(unreachable).get_job(1))
        assert isinstance(exc.__cause__, PoolTimeout)
    finally:
        unreachable.close()


# --- the statement itself: DatabaseBug --------------------------------------------------------


def test_a_syntax_error_is_a_database_bug(job_store):
    _raises(DatabaseBug, lambda: job_store._rows("SELEKT 1"), sqlstate="42601")


def test_an_unknown_column_is_a_database_bug(operator_store):
    _raises(DatabaseBug, lambda: operator_store._rows("SELECT nope FROM tock_jobs"),
            sqlstate="42703")


def test_a_store_stays_usable_after_a_classified_error(job_store, db):
    with pytest.raises(DatabaseBug):
        job_store._rows("SELEKT 1")
    assert job_store._rows("SELECT 1") == [(1,)]


def test_an_error_inside_a_store_transaction_rolls_it_back(job_store, db):
    now = db.execute("SELECT now()").fetchone()[0]
    with pytest.raises(DataRejected), job_store.transaction() as tx:
        tx.insert_jobs([NewJob("k", "default", "{}")], now=now)
        tx.insert_jobs([NewJob("k", "default", "{}", priority=10)], now=now)
    assert count(db, "tock_jobs") == 0


# --- classify, unit ---------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "expected", "sqlstate"), [
    (pgerrors.ConnectionFailure(), DatabaseUnavailable, "08006"),
    (pgerrors.ConnectionException(), DatabaseUnavailable, "08000"),
    (pgerrors.AdminShutdown(), DatabaseUnavailable, "57P01"),
    (pgerrors.CrashShutdown(), DatabaseUnavailable, "57P02"),
    (pgerrors.CannotConnectNow(), DatabaseUnavailable, "57P03"),
    (pgerrors.LockNotAvailable(), LockTimeout, "55P03"),
    (pgerrors.SerializationFailure(), Retryable, "40001"),
    (pgerrors.DeadlockDetected(), Retryable, "40P01"),
    (pgerrors.QueryCanceled(), Retryable, "57014"),
    (pgerrors.TooManyConnections(), Retryable, "53300"),
    (pgerrors.OutOfMemory(), Retryable, "53200"),
    (pgerrors.NumericValueOutOfRange(), DataRejected, "22003"),
    (pgerrors.CharacterNotInRepertoire(), DataRejected, "22021"),
    (pgerrors.UniqueViolation(), DataRejected, "23505"),
    (pgerrors.CheckViolation(), DataRejected, "23514"),
    (pgerrors.SyntaxError(), DatabaseBug, "42601"),
    (pgerrors.UndefinedColumn(), DatabaseBug, "42703"),
    (pgerrors.InsufficientPrivilege(), DatabaseBug, "42501"),
    (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
     DataRejected, None),
    (psycopg.OperationalError("server closed the connection unexpectedly"),
     DatabaseUnavailable, None),
    (psycopg.InterfaceError("the connection is closed"), DatabaseUnavailable, None),
    (psycopg.ProgrammingError("the query has 1 placeholder but 2 parameters"),
     DatabaseBug, None),
    (PoolTimeout("couldn't get a connection after 30.00 sec"), DatabaseUnavailable, None),
    (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), DataRejected,
     None),
])
def test_classify(error, expected, sqlstate):
    result = classify(error)
    assert type(result) is expected
    assert result.sqlstate == sqlstate


def test_classify_keeps_the_first_line_of_the_message():
    result = classify(psycopg.OperationalError("connection refused\nIs the server running?"))
    assert str(result) == "database unavailable: connection refused"


def test_translated_reraises_psycopg_errors_classified_from_the_original():
    original = pgerrors.DeadlockDetected("deadlock detected")
    with pytest.raises(Retryable) as caught, translated():
        raise original
    assert caught.value.__cause__ is original


def test_translated_lets_other_errors_through():
    with pytest.raises(KeyError), translated():
        raise KeyError("not a database error")


@pytest.mark.parametrize("synchronous_commit", [True, False])
def test_pool_connections_turn_jit_off_pin_synchronous_commit_and_keep_the_urls_own_options(
        database_url, synchronous_commit):
    def settings(url: str) -> tuple[str, str, str]:
        db = Database(url, check=False, synchronous_commit=synchronous_commit)
        try:
            with db.connection() as conn:
                row = conn.execute("SELECT current_setting('jit'), "
                                   "current_setting('synchronous_commit'), "
                                   "current_setting('application_name')").fetchone()
        finally:
            db.close()
        assert row is not None
        return row[0], row[1], row[2]

    with psycopg.connect(database_url) as plain:  # the test server's own default: off
        default = plain.execute("SELECT current_setting('synchronous_commit')").fetchone()
    assert default == ("off",)
    # A durable pool is durable on a server whose default is not.
    commit = "on" if synchronous_commit else "off"
    assert settings(database_url) == ("off", commit, "tock")
    # The URL's options come after tock's: they win, and tock's others still apply.
    assert settings(f"{database_url}?options=-c%20jit%3Don")[:2] == ("on", commit)
