"""Connections to Postgres: a pool per process, and the translation of connection failures
into `DatabaseUnavailable` at this one boundary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from shared.errors import DatabaseUnavailable

Connection = psycopg.Connection[Any]


def make_pool(database_url: str, *, max_size: int = 10, name: str = "tock") -> ConnectionPool:
    """A lazily-filled pool; connections are checked before use so a restarted Postgres
    costs one failed check, not one failed job."""
    return ConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        name=name,
        check=ConnectionPool.check_connection,
        kwargs={"application_name": name},
        timeout=30,
        reconnect_timeout=0,
    )


@contextmanager
def transaction(pool: ConnectionPool) -> Iterator[Connection]:
    """A pooled connection inside one transaction: commits on success, rolls back on error."""
    try:
        with pool.connection() as conn, conn.transaction():
            yield conn
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
    except psycopg.errors.AdminShutdown as exc:  # pragma: no cover - subclass of above on some
        raise DatabaseUnavailable(str(exc)) from exc


def connect(database_url: str, *, autocommit: bool = False) -> Connection:
    """One dedicated connection (LISTEN, tests, CLI)."""
    try:
        return psycopg.connect(database_url, autocommit=autocommit, application_name="tock")
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
