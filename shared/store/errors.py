"""The one place that decides what a database error means. Every psycopg error that leaves
`shared.store` has been turned into one of tock's `DatabaseError`s (shared.core.errors):

    connection lost or refused, admin/crash shutdown,     -> DatabaseUnavailable (Retryable)
      idle timeouts, pool timeout (class 08, 57P01-05,
      25P03, no SQLSTATE)
    a write refused as read-only (25006: a standby, or    -> DatabaseReadOnly (Retryable)
      a primary demoted by a failover)
    lock_timeout (55P03)                                  -> LockTimeout (Retryable)
    deadlock (40P01), serialization failure (40001),      -> Retryable
      statement_timeout / cancel (57014), too many
      connections or out of resources (class 53)
    a value Postgres refuses (class 22, 23; NUL bytes,    -> DataRejected
      text that is not valid UTF-8)
    anything else (syntax, undefined column, ...)         -> DatabaseBug (an undefined
      tock_ object says to run `tock migrate`)

Loops retry `Retryable`, drop the input behind a `DataRejected`, and stop the process on a
`DatabaseBug` (shared.runtime.supervisor).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import PoolTimeout

from shared.core.errors import (
    DatabaseBug,
    DatabaseError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DataRejected,
    LockTimeout,
    Retryable,
)

_SHUTDOWN = ("57P01", "57P02", "57P03", "57P04", "57P05", "25P03")
"""admin/crash shutdown, cannot connect now, database dropped, idle session timeout, idle
in transaction timeout: the server has ended (or will not start) the connection."""
_TRANSIENT = ("40001", "40P01", "57014")  # serialization, deadlock, query_canceled (timeouts)
_UNDEFINED = ("42P01", "42703", "42883", "42704")  # table, column, function, type/object


def classify(exc: BaseException) -> DatabaseError:
    """The tock error for a psycopg error (or an encoding error raised while sending)."""
    if isinstance(exc, UnicodeError):
        return DataRejected(f"text the database cannot store: {exc}")
    state = getattr(exc, "sqlstate", None)
    text = _describe(exc)
    if isinstance(exc, PoolTimeout):
        return DatabaseUnavailable(f"database unavailable: {text}")
    if state is None:
        if isinstance(exc, psycopg.DataError):
            return DataRejected(text)  # e.g. a NUL byte in a text parameter
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return DatabaseUnavailable(f"database unavailable: {text}")
        return DatabaseBug(text)
    if state.startswith("08") or state in _SHUTDOWN:
        return DatabaseUnavailable(f"database unavailable: {text}", state)
    if state == "25006":
        return DatabaseReadOnly(
            f"{text}: the database is read-only (a standby, or a primary demoted by a "
            "failover); nothing was written. The connection is dropped, and the next one "
            "goes where the database URL leads: if this goes on, it does not lead to the "
            "primary", state)
    if state == "55P03":
        return LockTimeout(text, state)
    if state in _TRANSIENT or state.startswith("53"):
        return Retryable(text, state)
    if state.startswith(("22", "23")):
        return DataRejected(text, state)
    if state in _UNDEFINED and "tock_" in text:
        # A database tock's migrations have not reached (a fresh one, or code deployed
        # before its migration): say the fix, as the services' start-up check does.
        return DatabaseBug(f"{text}: this database lacks tock's schema, or a migration of "
                           f"it that this code needs: run `tock migrate` (SQLSTATE {state})",
                           state)
    return DatabaseBug(f"{text} (SQLSTATE {state})", state)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise any psycopg error inside the block as its tock error."""
    try:
        yield
    except psycopg.Error as exc:
        raise classify(exc) from exc


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
