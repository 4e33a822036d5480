"""A small ordered-SQL migration runner.

Migrations are the files `shared/store/migrations/NNNN_name.sql`, applied in order, each in its own
transaction, recorded in `tock_migrations`. An advisory lock makes concurrent `tock migrate`
runs (several containers starting at once) wait for each other instead of racing.

A migration that alters or indexes `tock_jobs` needs a strong lock on it, and while it
waits for one behind a long transaction, every enqueue, claim and outcome queues behind
the migration. So each migration asks for its locks with a short `lock_timeout` and, when
that runs out, rolls back, says who holds them, and tries again a moment later: writers
wait at most `lock_timeout` at a time, never for the long transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import psycopg

from shared.store.errors import translated

log = logging.getLogger("tock.migrate")

_LOCK_ID = 0x746F636B  # "tock"

LOCK_TIMEOUT_SECONDS = 2.0
"""How long a migration's statement waits for a lock before the migration rolls back and
tries again: the longest it makes the writers queued behind it wait."""
RETRY_PAUSE_SECONDS = 1.0
GIVE_UP_AFTER_SECONDS = 600.0
"""How long a migration keeps trying for its locks before it fails, naming the holders."""

_HOLDERS = """
SELECT pid, extract(epoch FROM now() - xact_start)::int, state, left(query, 80)
FROM pg_stat_activity
WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
ORDER BY xact_start LIMIT 3
"""


class MigrationBlocked(Exception):
    """A migration could not take its locks within GIVE_UP_AFTER_SECONDS."""


def available() -> list[tuple[str, str]]:
    """(name, sql) of every migration shipped with this version, in order."""
    files = resources.files("shared.store") / "migrations"
    found = sorted(
        (f.name, f.read_text(encoding="utf-8"))
        for f in files.iterdir()
        if f.name.endswith(".sql")
    )
    return found


def applied(conn: psycopg.Connection[Any]) -> list[str]:
    """Names of the migrations already applied to this database."""
    exists = conn.execute("SELECT to_regclass('tock_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return []
    return [r[0] for r in conn.execute("SELECT name FROM tock_migrations ORDER BY name")]


def missing_migrations(database_url: str) -> list[str]:
    """Migrations this version ships that the database has not applied (translated
    errors: `DatabaseUnavailable` if it cannot be reached)."""
    with translated(), psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        done = set(applied(conn))
    return [name for name, _ in available() if name not in done]


def migrate(database_url: str, *, up_to: str | None = None,
            lock_timeout: float = LOCK_TIMEOUT_SECONDS,
            give_up_after: float = GIVE_UP_AFTER_SECONDS,
            waiting: Callable[[str, str], None] | None = None) -> list[str]:
    """Apply every pending migration (or those up to and including `up_to`, a file name:
    tests build an older schema this way); returns the names applied by this call.
    `waiting(migration, holders)` is told each time a migration rolled back for want of a
    lock (see the module docstring); MigrationBlocked past `give_up_after` seconds."""
    names = [name for name, _ in available()]
    if up_to is not None and up_to not in names:
        raise ValueError(f"no migration named {up_to!r}; there are {names}")
    done: list[str] = []
    with translated(), psycopg.connect(database_url, autocommit=True,
                                       application_name="tock-migrate") as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tock_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            already = set(applied(conn))
            for name, sql in available():
                if up_to is not None and name > up_to:
                    break
                if name in already:
                    continue
                _apply(conn, name, sql, lock_timeout=lock_timeout, give_up_after=give_up_after,
                       waiting=waiting)
                log.info("migration applied", extra={"event": "migration_applied",
                                                     "migration": name})
                done.append(name)
        finally:
            if not conn.closed:  # a lost session has released its lock already
                conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
    return done


def _apply(conn: psycopg.Connection[Any], name: str, sql: str, *, lock_timeout: float,
           give_up_after: float, waiting: Callable[[str, str], None] | None) -> None:
    """One migration in one transaction, tried again while its locks are held elsewhere."""
    deadline = time.monotonic() + give_up_after
    while True:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{max(int(lock_timeout * 1000), 1)}ms'")
                conn.execute(sql.encode())
                conn.execute("INSERT INTO tock_migrations (name) VALUES (%s)", (name,))
            return
        except psycopg.errors.LockNotAvailable:
            holders = _holders(conn)
            if time.monotonic() >= deadline:
                raise MigrationBlocked(
                    f"migration {name} could not take its locks within {give_up_after:g} s "
                    f"(tried every {lock_timeout + RETRY_PAUSE_SECONDS:g} s): {holders}; "
                    "nothing of it was applied. Run `tock migrate` again once they end, or "
                    "end them") from None
            log.warning("migration waiting for a lock", extra={
                "event": "migration_waiting", "migration": name, "holders": holders})
            if waiting is not None:
                waiting(name, holders)
            time.sleep(RETRY_PAUSE_SECONDS)


def _holders(conn: psycopg.Connection[Any]) -> str:
    """The oldest open transactions on this database, in words: the likely holders."""
    rows = conn.execute(_HOLDERS).fetchall()
    if not rows:
        return "no transaction is open now"
    return "oldest open transactions: " + "; ".join(
        f"pid {pid} (open {age} s, {state}: {query!r})" for pid, age, state, query in rows)
