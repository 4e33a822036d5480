"""How the operator commands reach tock: they talk to Postgres directly (TOCK_DATABASE_URL
or --database-url), like the services do, so they work when the dashboard is down."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from shared.client import Client
from shared.runtime.settings import ClientSettings
from shared.store.database import Database
from shared.store.operator_store import OperatorStore


def settings(args: argparse.Namespace) -> ClientSettings:
    return ClientSettings.load(**({"database_url": args.database_url}
                                  if args.database_url else {}))


def client(args: argparse.Namespace) -> Client:
    return Client(settings(args))


@contextmanager
def operator_store(args: argparse.Namespace) -> Iterator[OperatorStore]:
    """The operator statements on a small pool of their own."""
    database = Database(settings(args).database_url, max_size=2, name="tock-cli")
    try:
        yield OperatorStore(database)
    finally:
        database.close()
