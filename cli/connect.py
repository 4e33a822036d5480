"""How the operator commands reach tock: they talk to Postgres directly (TOCK_DATABASE_URL
or --database-url), like the services do, so they work when the dashboard is down."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from shared.client import Client
from shared.core.errors import ConfigError, DatabaseUnavailable
from shared.runtime.settings import ClientSettings
from shared.store.database import Database, probe, redacted, server_refusal, url_refused
from shared.store.migrate import missing_migrations
from shared.store.operator_store import OperatorStore

PROBE_SECONDS = 5.0
_reachable: set[str] = set()


def settings(args: argparse.Namespace) -> ClientSettings:
    """The client settings, once the database they name has answered: a command against a
    wrong URL or a stopped server says why within seconds, instead of waiting out a pool's
    30 s timeout."""
    loaded = ClientSettings.load(**({"database_url": args.database_url}
                                    if args.database_url else {}))
    check_reachable(loaded.database_url)
    return loaded


def check_reachable(url: str, *, migrated: bool = True) -> None:
    """`DatabaseUnavailable`, saying why and which setting to fix, unless `url` answers;
    `ConfigError` if `migrated` and the database lacks a migration of this version."""
    if url in _reachable:
        return
    reason = probe(url, timeout=PROBE_SECONDS)
    if reason is not None and url_refused(reason):
        raise ConfigError(f"the database at {redacted(url)} refuses what the URL asks for: "
                          f"{reason} (fix TOCK_DATABASE_URL or --database-url)")
    if reason is not None:
        # Not answering (down, restarting, frozen, or another address): where it is may
        # be right, so the setting is named as the place to check, not as the culprit.
        # Up but full or read-only: the URL is right, and the reason says what to do.
        hint = server_refusal(reason) or ("is that server up? TOCK_DATABASE_URL or "
                                          "--database-url says where it is")
        raise DatabaseUnavailable(f"cannot use the database at {redacted(url)}: {reason} "
                                  f"({hint})")
    if migrated:
        pending = missing_migrations(url)
        if pending:
            raise ConfigError(f"the database at {redacted(url)} lacks migration(s) "
                              f"{', '.join(pending)}: run `tock migrate` first")
        _reachable.add(url)


def client(args: argparse.Namespace) -> Client:
    return Client(settings(args))


@contextmanager
def operator_store(args: argparse.Namespace) -> Iterator[OperatorStore]:
    """The operator statements on a small pool of their own, bounded as the client's calls
    are (TOCK_CALL_TIMEOUT_SECONDS)."""
    config = settings(args)
    database = Database(config.database_url, max_size=2, name="tock-cli",
                        answer_timeout=config.call_timeout_seconds,
                        answer_setting="TOCK_CALL_TIMEOUT_SECONDS")
    try:
        yield OperatorStore(database)
    finally:
        database.close()
