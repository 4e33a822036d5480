"""Connections to Postgres: one `Database` (a connection pool) per process role, and a
`Listener` for LISTEN/NOTIFY. Errors leave this module classified (shared.store.errors).
Callers use the stores (`JobStore`, `ScheduleStore`, `OperatorStore`), not connections."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from shared.core.errors import InvalidInput
from shared.store.errors import translated

Connection = psycopg.Connection[Any]


class Database:
    """A lazily opened pool to one database.

    `check` tests each connection on checkout (one round trip), so a restarted Postgres
    costs the caller nothing; the services turn it off because their loops retry anyway.
    `autocommit` lets a single statement run as one round trip (no BEGIN/COMMIT);
    multi-statement work goes through `transaction()`. `synchronous_commit=False` is for
    writes whose loss in a database crash the fences already absorb (see the callers).
    """

    def __init__(self, url: str, *, max_size: int = 10, name: str = "tock", check: bool = True,
                 autocommit: bool = True, synchronous_commit: bool = True,
                 timeout: float = 30.0) -> None:
        self.url = url
        self.name = name
        kwargs: dict[str, Any] = {"application_name": name, "autocommit": autocommit}
        if not synchronous_commit:
            kwargs["options"] = "-c synchronous_commit=off"
        self.pool = ConnectionPool(
            url, min_size=1, max_size=max_size, open=False, name=name,
            check=ConnectionPool.check_connection if check else None,
            kwargs=kwargs, timeout=timeout, reconnect_timeout=0,
        )
        self._opened = False
        self._lock = threading.Lock()

    def open(self) -> None:
        """Start the pool (idempotent); connections are made in the background."""
        if self._opened:
            return
        with self._lock:
            if not self._opened:
                self.pool.open(wait=False)
                self._opened = True

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A pooled connection inside one transaction: commits on success, rolls back on
        error."""
        self.open()
        with translated(), self.pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection for single autocommit statements (one round trip each)."""
        self.open()
        with translated(), self.pool.connection() as conn:
            yield conn

    def listener(self, channel: str) -> Listener:
        """A dedicated connection that LISTENs on `channel`."""
        return Listener(self.url, channel)


class Listener:
    """LISTEN on one channel over its own connection; `wait(t)` returns on the first
    NOTIFY or after t seconds."""

    def __init__(self, url: str, channel: str) -> None:
        with translated():
            self._conn = psycopg.connect(url, autocommit=True, application_name="tock-listen")
            self._conn.execute(f"LISTEN {channel}")  # a constant of ours, never user input

    def wait(self, timeout: float) -> bool:
        """True if a notification came within `timeout` seconds."""
        with translated():
            return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        self._conn.close()


def probe(url: str, timeout: float = 2.0) -> str | None:
    """None if the database answers a query within `timeout`, else why not, in words
    (a pool would only say it timed out)."""
    try:
        with psycopg.connect(url, connect_timeout=max(int(timeout), 1),
                             application_name="tock-probe") as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        return lines[-1] if lines else type(exc).__name__
    return None


def connect(url: str, *, autocommit: bool = False) -> Connection:
    """One dedicated connection (migrations, tests)."""
    with translated():
        return psycopg.connect(url, autocommit=autocommit, application_name="tock")


def adopt_connection(connection: object) -> Connection:
    """A caller's own connection, to run tock's statements in the caller's transaction:
    a psycopg 3 connection, or a SQLAlchemy Connection or Session on the psycopg driver."""
    if isinstance(connection, psycopg.Connection):
        return connection
    inner: Any = connection
    if hasattr(inner, "connection") and callable(inner.connection):  # Session
        inner = inner.connection()
    raw = getattr(getattr(inner, "connection", None), "dbapi_connection", None)
    if isinstance(raw, psycopg.Connection):
        return raw
    raise InvalidInput(
        "connection must be a psycopg 3 Connection, or a SQLAlchemy Connection or Session "
        f"using the psycopg driver (postgresql+psycopg://); got {type(connection).__name__}"
    )
