"""What every store shares: it runs its statements either each on a pooled connection of
its `Database` (one autocommit round trip per statement), or all on one connection that
is inside a transaction (`store.transaction()`, or `Store.on(conn)` for a caller's own
transaction). Errors leave it classified (shared.store.errors)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, LiteralString, Self, TypeVar

import psycopg
from psycopg import pq
from psycopg import sql as pgsql

from shared.store.database import Connection, Database
from shared.store.errors import classify, translated

Query = LiteralString | pgsql.SQL | pgsql.Composed
Row = tuple[Any, ...]
S = TypeVar("S", bound="Store")


class Store:
    """Base of the stores. Build with a `Database`, or bind to a connection with `on()`."""

    def __init__(self, db: Database | None = None, *, conn: Connection | None = None) -> None:
        if (db is None) == (conn is None):
            raise TypeError("give a Database or a connection, not both")
        self._db = db
        self._conn = conn

    @classmethod
    def on(cls, conn: Connection) -> Self:
        """This store on `conn`: statements join whatever transaction `conn` is in."""
        return cls(conn=conn)

    def sibling(self, cls: type[S]) -> S:
        """Another store on the same database or connection (the same transaction)."""
        return cls(conn=self._conn) if self._conn is not None else cls(self._db)

    @property
    def database(self) -> Database | None:
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[Self]:
        """The same store, every statement in one transaction (commit at the end). On a
        store bound to a connection: a transaction there (a savepoint if the connection is
        already in one)."""
        if self._conn is not None:
            # BEGIN on an autocommit connection, a savepoint inside a caller's transaction.
            with translated(), self._conn.transaction():
                yield self
            return
        assert self._db is not None
        with self._db.transaction() as conn:
            yield type(self)(conn=conn)

    def _rows(self, query: Query, params: Mapping[str, Any] | None = None) -> list[Row]:
        if self._conn is not None:
            return self._execute(self._conn, query, params)
        assert self._db is not None
        with self._db.connection() as conn:
            return self._execute(conn, query, params)

    def _one(self, query: Query, params: Mapping[str, Any] | None = None) -> Row | None:
        rows = self._rows(query, params)
        return rows[0] if rows else None

    def _run(self, query: Query, params: Mapping[str, Any] | None = None) -> None:
        self._rows(query, params)

    @staticmethod
    def _execute(conn: Connection, query: Query, params: Mapping[str, Any] | None) -> list[Row]:
        try:
            cur = conn.execute(query, params)
            # Whether rows came back, without `cur.description`, which builds a Column per
            # column on every call (a claim returns twelve).
            result = cur.pgresult
            return cur.fetchall() if result is not None and (
                result.nfields or result.status == pq.ExecStatus.TUPLES_OK) else []
        except (psycopg.Error, UnicodeError) as exc:  # parameters are encoded client-side
            raise classify(exc) from exc
