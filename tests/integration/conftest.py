"""Fixtures of the pipeline and robustness tests (`test_pipeline_*.py`,
`test_robustness_*.py`): a timer on the test's queues, an empty task registry, a pinned
clock, and consumers driven one step at a time (`consumers`) or started for real
(`running`); and of the store and history tests: a pinned `now` taken from the database
clock, and a second connection (`other`) that holds locks in an open transaction; and of
the upgrade tests: a database at the module's `BEFORE` migration (`old_url`); and of the
outage tests: a Postgres server of the test's own (`server`), to stop and start for real
(the session's is shared by other tests)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.postgres import PostgresServer, start_postgres
from shared.store.migrate import migrate
from tests.support.drive import Clock, db_now, make_consumer
from timer_service.service import Timer


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    """A migrated Postgres server of the test's own, durable: an immediate stop must not
    lose the migrations."""
    pg = start_postgres(durable=True)
    migrate(pg.url())
    yield pg
    pg.destroy()


@pytest.fixture
def timer(timer_settings, transport):
    t = Timer(timer_settings, transport)
    yield t
    t.close()


@pytest.fixture
def notes_file(tmp_path):
    """Where the isolated tasks (tests/support/isolated_tasks.py) write what they saw."""
    return tmp_path / "notes.jsonl"


@pytest.fixture
def registry():
    return Registry()


@pytest.fixture
def clock(db):
    # A little ahead of the database clock, so jobs enqueued "now" by the test are due.
    return Clock(db_now(db) + timedelta(seconds=2))


@pytest.fixture
def consumers(consumer_settings, registry, transport):
    made = []

    def make(clock=None, **overrides):
        c = make_consumer(consumer_settings, registry, transport, clock, **overrides)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def running(consumer_settings, registry, transport):
    """Start a real consumer (all its loops on their threads); shut it down at the end."""
    made: list[Consumer] = []

    def start(transport_: Any = None, **overrides: Any) -> Consumer:
        settings = consumer_settings.model_copy(update=overrides)
        c = Consumer(settings, registry, transport_ or transport)
        c.start()
        made.append(c)
        return c

    yield start
    for c in made:
        c.shutdown()


@pytest.fixture
def clock_now(db):
    return db_now(db) + timedelta(seconds=2)


@pytest.fixture
def now(db: psycopg.Connection[Any]) -> datetime:
    """The database clock at the start of the test: every `now=` is this plus an offset."""
    return db_now(db)


@pytest.fixture
def other(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection outside autocommit: what it locks stays locked until it commits or rolls
    back (another timer, another consumer, an uncommitted dispatch)."""
    conn = psycopg.connect(database_url, application_name="tock-test-other")
    try:
        yield conn
    finally:
        if not conn.closed:
            conn.rollback()
        conn.close()


@pytest.fixture
def old_url(pg_server, request) -> str:
    """A fresh database migrated up to the test module's `BEFORE` (the schema an upgrade
    test starts from)."""
    url = pg_server.create_database(f"upgrade_{uuid4().hex[:8]}")
    migrate(url, up_to=request.module.BEFORE)
    return url
