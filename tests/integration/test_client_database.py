"""The producer client's pool against the real test Postgres: the first call connects and
works as before; a database it cannot use is named with the server's reason at once; and a
pool that worked waits for a connection through an outage, then says why it gave up, fails
the following calls at once while the database stays away, and works again as soon as it
is back. The outage is a TCP relay in front of the session's server being closed (the
server itself is shared with other tests and keeps running)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shared.client import Client
from shared.core.errors import ConnectionLost, DatabaseBug, DatabaseUnavailable
from shared.runtime.settings import ClientSettings
from shared.store.database import DOWN_RECHECK_SECONDS, Database
from shared.store.pool_log import Repeats
from shared.store.schedule_store import ScheduleStore
from tests.support.wait import wait_for

SETTING = "TOCK_DATABASE_URL or ClientSettings.database_url"


class Relay:
    """Forwards a local port to the test server; `close()` is the server going away (every
    connection dropped, new ones refused); `open()` brings it back on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.open()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept() blocked on it
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def relay(database_url: str) -> Iterator[Relay]:
    port = int(database_url.split("@127.0.0.1:", 1)[1].split("/", 1)[0])
    r = Relay(port)
    yield r
    r.close()


@contextlib.contextmanager
def cut_off(relay: Relay, database_url: str, timeout: float) -> Iterator[tuple[ScheduleStore, str]]:
    """A store whose pool (through `relay`, waiting up to `timeout` for a connection) has
    worked once, then lost its database: the relay is closed. Yields it and its URL."""
    url = database_url.replace(f":{relay.target_port}/", f":{relay.port}/")
    db = Database(url, name="tock-client", timeout=timeout, setting=SETTING)
    try:
        store = ScheduleStore(db)
        assert store.db_now(None) is not None  # the pool works
        relay.close()
        yield store, url
    finally:
        db.close()


def test_the_first_call_on_a_working_database_connects_and_works(database_url):
    with Client(ClientSettings(database_url=database_url)) as client:
        job = client.schedule("a.ok", {"n": 1})
        assert client.get(job.id).payload == {"n": 1}
        assert client.database._opened


def test_a_database_that_does_not_exist_is_named_with_the_servers_reason(database_url):
    url = database_url.rsplit("/", 1)[0] + "/no_such_db"
    started = time.monotonic()
    with Client(ClientSettings(database_url=url)) as client, \
            pytest.raises(DatabaseUnavailable) as info:
        client.schedule("a.ok")
    assert time.monotonic() - started < 5
    assert str(info.value).startswith(f"cannot use the database at {url}: ")
    assert 'database "no_such_db" does not exist' in str(info.value)
    assert str(info.value).endswith(f"(check {SETTING})")


def test_a_database_without_tocks_schema_says_to_run_migrate(pg_server):
    url = pg_server.create_database(f"empty_{uuid.uuid4().hex[:8]}")
    with Client(ClientSettings(database_url=url)) as client, \
            pytest.raises(DatabaseBug) as info:
        client.schedule("a.ok")
    assert str(info.value) == (
        'relation "tock_jobs" does not exist: this database lacks tock\'s schema, or a '
        "migration of it that this code needs: run `tock migrate` (SQLSTATE 42P01)")


def test_an_outage_is_waited_out_then_explained_then_failed_fast_until_it_ends(
        relay, database_url):
    with cut_off(relay, database_url, 1.5) as (store, url):
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as info:
            store.db_now(None)
        assert time.monotonic() - started >= 1.4  # it waited for the database to come back
        message = str(info.value)
        assert message.startswith(f"cannot use the database at {url}: "), message
        assert "Connection refused" in message
        assert message.endswith(f"(check {SETTING}); no connection within 1.5 s"), message
        assert info.value.__cause__ is not None  # the pool's timeout, kept

        # Known to be down: the next calls fail at once with the same reason.
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="Connection refused"):
                store.db_now(None)
            assert time.monotonic() - started < 0.5

        relay.open()
        # Not a wait for a condition: the property is that a known-down pool asks again
        # once DOWN_RECHECK_SECONDS have passed since its last answer, and then works at
        # the first call; a polling wait would hide a pool that never asks again.
        time.sleep(DOWN_RECHECK_SECONDS)
        assert store.db_now(None) is not None  # back at once


def test_an_application_sees_the_pools_reconnection_warning_once_per_outage(
        relay, database_url, caplog):
    """An application using the client (no tock logging set up) got psycopg's "error
    connecting" warning every 2 s of a call's wait through an outage: the filter that
    tock's processes install came only with their logging."""
    pool_log = logging.getLogger("psycopg.pool")
    for existing in [f for f in pool_log.filters if isinstance(f, Repeats)]:
        pool_log.removeFilter(existing)  # as in a fresh application
    with cut_off(relay, database_url, 6) as (store, _):
        caplog.set_level(logging.WARNING, logger="psycopg.pool")
        with pytest.raises(DatabaseUnavailable):
            store.db_now(None)  # 6 s of reconnection attempts
    connecting = [r for r in caplog.records if r.name == "psycopg.pool"
                  and "error connecting" in r.getMessage()]
    assert len(connecting) == 1, [r.getMessage() for r in connecting]


def test_a_short_outage_of_a_working_pool_is_ridden_out(relay, database_url):
    with cut_off(relay, database_url, 10) as (store, _):
        threading.Timer(1.0, relay.open).start()
        assert store.db_now(None) is not None  # waited, reconnected, answered


class LosingRelay(Relay):
    """A Relay that can lose the server's answer to an INSERT: the statement reaches the
    server and commits, its reply never comes back, and then every connection is cut (a
    crash or a network cut at that instant)."""

    swallow = False

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:  # type: ignore[override]
        from_server = source.getpeername()[1] == self.target_port
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not (self.swallow and from_server and b"INSERT 0 " in data):
                    sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def lose_the_next_insert_reply(self, then_cut_after: float, *, back: bool = True) -> None:
        self.swallow = True

        def cut() -> None:
            self.swallow = False
            self.close()
            if back:
                self.open()

        threading.Timer(then_cut_after, cut).start()


@pytest.fixture
def losing_relay(database_url: str) -> Iterator[LosingRelay]:
    port = int(database_url.split("@127.0.0.1:", 1)[1].split("/", 1)[0])
    r = LosingRelay(port)
    yield r
    r.close()


def test_an_insert_whose_reply_was_lost_is_not_said_to_be_unwritten(losing_relay, database_url,
                                                                    db):
    url = database_url.replace(f":{losing_relay.target_port}/", f":{losing_relay.port}/")
    with Client(ClientSettings(database_url=url)) as client:
        client.schedule("warm")
        losing_relay.lose_the_next_insert_reply(then_cut_after=0.5)
        with pytest.raises(ConnectionLost, match="may have been written") as info:
            client.schedule("lost", {"n": 1})
        assert "key=" in str(info.value)
        # It was in fact written: the error must not claim otherwise.
        assert db.execute("SELECT count(*) FROM tock_jobs WHERE kind = 'lost'").fetchone()[0] == 1
        assert client.schedule("after").created  # the client heals by itself


def test_a_keyed_insert_whose_reply_was_lost_returns_the_job(losing_relay, database_url, db):
    url = database_url.replace(f":{losing_relay.target_port}/", f":{losing_relay.port}/")
    with Client(ClientSettings(database_url=url)) as client:
        client.schedule("warm")
        losing_relay.lose_the_next_insert_reply(then_cut_after=0.5)
        job = client.schedule("lost", {"n": 1}, key="once")
        assert job.kind == "lost" and job.payload == {"n": 1}
        losing_relay.lose_the_next_insert_reply(then_cut_after=0.5)
        jobs = client.schedule_many([{"kind": "lost", "key": "a"}, {"kind": "lost", "key": "b"}])
        assert [j.unique_key for j in jobs] == ["a", "b"]
    rows = db.execute("SELECT unique_key, count(*) FROM tock_jobs WHERE kind = 'lost' "
                      "GROUP BY unique_key ORDER BY 1").fetchall()
    assert rows == [("a", 1), ("b", 1), ("once", 1)]


def test_a_keyed_insert_cut_off_while_the_database_stays_away_says_it_may_be_written(
        losing_relay, database_url, db):
    url = database_url.replace(f":{losing_relay.target_port}/", f":{losing_relay.port}/")
    with Client(ClientSettings(database_url=url), pool_timeout=1.0) as client:
        client.schedule("warm")
        losing_relay.lose_the_next_insert_reply(then_cut_after=0.5, back=False)
        with pytest.raises(ConnectionLost, match="may have been written: calling again with "
                                                 "the same keys is safe"):
            client.schedule("lost", key="once")
        losing_relay.open()

        def call_again() -> Any:  # keyed: calling until the pool asks again is safe
            try:
                return client.schedule("lost", key="once")
            except DatabaseUnavailable:
                return None
        again = wait_for(call_again, timeout=30, message="the keyed call working again")
        assert not again.created  # the cut-off attempt had written it
    assert db.execute("SELECT count(*) FROM tock_jobs WHERE kind = 'lost'").fetchone()[0] == 1
