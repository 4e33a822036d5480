"""A small ordered-SQL migration runner.

Migrations are the files `shared/store/migrations/NNNN_name.sql`, applied in order, each in its own
transaction, recorded in `tock_migrations`. An advisory lock makes concurrent `tock migrate`
runs (several containers starting at once) wait for each other instead of racing.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

import psycopg

from shared.store.errors import translated

log = logging.getLogger("tock.migrate")

_LOCK_ID = 0x746F636B  # "tock"


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


def migrate(database_url: str, *, up_to: str | None = None) -> list[str]:
    """Apply every pending migration (or those up to and including `up_to`, a file name:
    tests build an older schema this way); returns the names applied by this call."""
    names = [name for name, _ in available()]
    if up_to is not None and up_to not in names:
        raise ValueError(f"no migration named {up_to!r}; there are {names}")
    done: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
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
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO tock_migrations (name) VALUES (%s)", (name,))
                log.info("migration applied", extra={"event": "migration_applied",
                                                     "migration": name})
                done.append(name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
    return done
