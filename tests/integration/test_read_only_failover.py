"""A primary demoted under running processes (a failover whose old writer stays up as a
reader, reached through an old connection or a stale DNS answer): its writes fail with
SQLSTATE 25006. That used to be a `DatabaseBug`, which stops a timer or consumer; now it is
`DatabaseReadOnly`, a retryable error, the connection is dropped, and every process goes on
by itself once writes are taken again. The fault is real: the test's own Postgres is made
read-only for new transactions (`default_transaction_read_only`, reloaded), which is what
libpq's own primary check reads too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from devstack.postgres import PostgresServer
from shared.client import Client
from shared.core.errors import DatabaseReadOnly, Retryable
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings
from shared.store import JobStore
from shared.store.database import Database
from tests.support.drive import timer_running
from tests.support.wait import wait_for


@contextmanager
def read_only(server: PostgresServer) -> Iterator[None]:
    """The server refuses writes (and libpq's read-write check) for the block."""
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
        try:
            yield
        finally:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            admin.execute("SELECT pg_reload_conf()")
            # The reload is a signal the postmaster acts on in its own time: a connection
            # made before it has, though after this block, is still read-only (CI met one).
            # The fault ends when a new connection takes writes.
            wait_for(lambda: _new_session_writable(server), timeout=10,
                     message="the server to take writes again")


def _new_session_writable(server: PostgresServer) -> bool:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute("SHOW default_transaction_read_only").fetchone()
        return row is not None and row[0] == "off"


def _write(db: Database) -> Retryable | None:
    """The error of one write through `db`'s pool, or None if it was taken."""
    try:
        with db.connection() as conn:
            conn.execute("UPDATE tock_jobs SET priority = priority WHERE false")
    except Retryable as exc:
        return exc
    return None


def test_a_write_to_a_read_only_server_is_retryable_and_its_connection_dropped(server):
    db = Database(server.url(), check=False, max_size=1, timeout=2)
    try:
        with db.connection() as conn:  # a pooled connection, made while writes were taken
            old_pid = conn.info.backend_pid
        errors: list[Retryable | None] = []
        with read_only(server):
            wait_for(lambda: errors.append(_write(db)) or errors[-1] is not None, timeout=10,
                     message="the write refused once the reload reached the session")
        first = errors[-1]
        assert isinstance(first, DatabaseReadOnly), first
        assert "nothing was written" in str(first)
        # Writes are taken again: the pool hands out a new connection, not the old one.
        wait_for(lambda: _write(db) is None, timeout=10, message="writes taken again")
        with db.connection() as conn:
            assert conn.info.backend_pid != old_pid
    finally:
        db.close()


def test_timer_and_consumer_ride_out_a_demoted_primary_and_go_on(
        server, timer_settings, consumer_settings, registry, transport, running) -> None:
    ran: list[int] = []
    registry.add("work", lambda payload, ctx: ran.append(payload["n"]))
    url = server.url()
    client = Client(ClientSettings(database_url=url))
    try:
        consumer = running(database_url=url)
        with timer_running(timer_settings.model_copy(update={"database_url": url}),
                           transport) as timer:
            first = [client.schedule("work", {"n": i}) for i in range(5)]
            wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED
                                 for j in first), timeout=30, message="the first jobs ran")
            accepted: list[int] = []  # before the reload reached the server
            with read_only(server):
                # The client says what is wrong, as a retryable error; nothing is written.
                def refused() -> bool:
                    try:
                        accepted.append(client.schedule("work", {"n": -1}).id)
                    except Retryable:
                        return True
                    return False
                wait_for(refused, timeout=30, message="a client write refused as read-only")
                # Every loop of both processes meets the read-only server: none crashes.
                wait_for(lambda: not timer.supervisor.ready()[0]
                         or not consumer.supervisor.ready()[0], timeout=30,
                         message="a process notices the read-only server")
                assert timer.supervisor.live()[0], timer.supervisor.live()[1]
                assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]
            later = [client.schedule("work", {"n": i}) for i in range(5, 10)]
            wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED
                                 for j in later), timeout=60,
                     message="jobs run again once writes are taken")
            wait_for(lambda: all(client.get(i).state is JobState.SUCCEEDED for i in accepted),
                     timeout=60, message="jobs accepted before the switch ran too")
            assert timer.supervisor.fatal is None and consumer.supervisor.fatal is None
            assert timer.supervisor.live()[0] and consumer.supervisor.live()[0]
        assert set(ran) == set(range(10)) | ({-1} if accepted else set())
        with psycopg.connect(url) as conn:  # the refused calls wrote nothing
            assert conn.execute("SELECT count(*) FROM tock_jobs_all WHERE payload->>'n' = '-1'"
                                ).fetchone() == (len(accepted),)
    finally:
        client.close()



@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_store_write_refused_as_read_only_drops_its_connection(server, in_transaction):
    """The stores classify psycopg's error themselves (Store._execute), before it leaves
    the pool's block: the connection must be dropped all the same, or a demoted primary's
    old connection is handed out again, and refuses, until the pool's max lifetime."""
    db = Database(server.url(), check=False, max_size=1, timeout=2)
    store = JobStore(db)

    def write() -> None:
        if in_transaction:
            with store.transaction() as tx:
                tx.release_untracked("w", [], 60.0, 30.0)
        else:
            store.release_untracked("w", [], 60.0, 30.0)

    try:
        with db.connection() as conn:
            old_pid = conn.info.backend_pid
        with read_only(server):
            refusal = _first_refusal(write, "a store write refused as read-only")
        assert isinstance(refusal, DatabaseReadOnly), refusal
        wait_for(lambda: write() is None, timeout=10, message="writes taken again")
        with db.connection() as conn:
            assert conn.info.backend_pid != old_pid
    finally:
        db.close()


@pytest.mark.parametrize("attrs", ["", "?target_session_attrs=any"])
def test_a_write_refused_as_read_only_counts_as_an_outage_for_the_rescuer(server, attrs):
    """No worker can renew its lease while the database refuses writes: the timer's rescuer
    must give workers a whole lease after it (`Database.unavailable_at`, as after any
    outage), or every job whose lease ran out meanwhile is rescued while its handler still
    runs. With a URL that keeps `target_session_attrs=any` every statement of the outage
    is such a refusal, none a refused connection."""
    db = Database(server.url() + attrs, check=False, max_size=1, timeout=2)
    store = JobStore(db)
    try:
        store.release_untracked("w", [], 60.0, 30.0)  # a connection open before the switch
        with read_only(server):
            def refused() -> bool:
                try:
                    store.release_untracked("w", [], 60.0, 30.0)
                except DatabaseReadOnly:
                    return True
                return False
            wait_for(refused, timeout=10, message="a store write refused as read-only")
        assert db.unavailable_at is not None
    finally:
        db.close()


def test_the_probe_and_a_listener_refuse_a_read_only_server_as_the_pools_do(server):
    """`probe` (start-up checks, the CLI, the dashboard's /readyz) said a read-only server
    was fine while no pool could connect to it (the CLI then waited out its pool's 30 s);
    a LISTEN connection on a demoted server would never hear a NOTIFY."""
    from shared.store.database import Listener, probe
    with read_only(server):
        wait_for(lambda: probe(server.url()) is not None, timeout=10,
                 message="the probe refuses a read-only server")
        assert "read-only" in str(probe(server.url()))
        assert probe(server.url() + "?target_session_attrs=any") is None  # the URL decides
        with pytest.raises(Retryable):
            Listener(server.url(), "tock_due")
    assert probe(server.url()) is None


def test_the_consumer_s_ping_refuses_a_read_only_server_and_drops_the_connection(server):
    """The ping a consumer asks before it receives again: a read-only server answers, but
    receiving from it would only walk messages towards the dead-letter queue."""
    db = Database(server.url(), check=False, max_size=1, timeout=2)
    store = JobStore(db)
    try:
        store.ping()
        with db.connection() as conn:
            old_pid = conn.info.backend_pid
        with read_only(server):
            refusal = _first_refusal(store.ping, "the ping refused once the reload landed")
        assert isinstance(refusal, DatabaseReadOnly), refusal
        wait_for(lambda: _ping_ok(store), timeout=10, message="the ping passes again")
        with db.connection() as conn:
            assert conn.info.backend_pid != old_pid
    finally:
        db.close()


def _first_refusal(call: Callable[[], object], what: str) -> Retryable:
    """Call `call` until it raises Retryable (the read-only reload takes a moment to land);
    that error."""
    errors: list[Retryable] = []

    def refused() -> bool:
        try:
            call()
        except Retryable as exc:
            errors.append(exc)
            return True
        return False
    wait_for(refused, timeout=10, message=what)
    return errors[0]


def _ping_ok(store: JobStore) -> bool:
    try:
        store.ping()
    except Retryable:
        return False
    return True
