"""Connections to Postgres: a pool per process, and the translation of connection failures
into `DatabaseUnavailable` at this one boundary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from shared.core.errors import DatabaseUnavailable

Connection = psycopg.Connection[Any]


def make_pool(database_url: str, *, max_size: int = 10, name: str = "tock",
              check: bool = True, autocommit: bool = False,
              synchronous_commit: bool = True) -> ConnectionPool:
    """A lazily-filled pool.

    `check` tests each connection on checkout (one round trip), so a restarted Postgres
    costs the caller nothing; the services turn it off because their loops retry anyway.
    `autocommit` lets a single statement run as one round trip (no BEGIN/COMMIT); multi-
    statement work still goes through `transaction()`. `synchronous_commit=False` is for
    writes whose loss in a database crash the fences already absorb (see the callers).
    """
    kwargs: dict[str, Any] = {"application_name": name, "autocommit": autocommit}
    if not synchronous_commit:
        kwargs["options"] = "-c synchronous_commit=off"
    return ConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        name=name,
        check=ConnectionPool.check_connection if check else None,
        kwargs=kwargs,
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
        if not _lost_connection(exc):
            raise
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc


@contextmanager
def statement(pool: ConnectionPool) -> Iterator[Connection]:
    """A pooled autocommit connection for one statement: one round trip, atomic on its own.
    Only for pools made with `autocommit=True`."""
    try:
        with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as exc:
        if not _lost_connection(exc):
            raise
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc


def _lost_connection(exc: psycopg.OperationalError) -> bool:
    """Connection-level failures (no SQLSTATE, class 08, or a server shutting down) mean
    the database is unavailable; others (a lock timeout, say) are the statement's own."""
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P"))


def connect(database_url: str, *, autocommit: bool = False) -> Connection:
    """One dedicated connection (LISTEN, tests, CLI)."""
    try:
        return psycopg.connect(database_url, autocommit=autocommit, application_name="tock")
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
