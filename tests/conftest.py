"""Test services: one real Postgres cluster and one real SQS server process per session
(per pytest-xdist worker under `make test`), started here. Each test gets its own database
cloned from a migrated template and its own SQS queue prefix, so tests never see each
other's jobs or messages."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from devstack.postgres import PostgresServer, start_postgres
from devstack.sqs import SqsServer, start_sqs
from shared.client import Client
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.store import Database, JobStore, OperatorStore, ScheduleStore
from shared.store.migrate import migrate
from shared.transport.sqs import SqsTransport

_counter = itertools.count()

pytest_plugins = ["tests.support.dashboard"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    server = start_postgres()
    template_url = server.create_database("tock_template")
    migrate(template_url)
    yield server
    server.destroy(wait=False)


@pytest.fixture
def database_url(pg_server: PostgresServer) -> str:
    return pg_server.create_database(f"t{os.getpid()}_{next(_counter)}",
                                     template="tock_template")


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A pool on the test's database, for the stores."""
    d = Database(database_url, max_size=4, name="tock-test")
    yield d
    d.close()


@pytest.fixture
def job_store(database: Database) -> JobStore:
    return JobStore(database)


@pytest.fixture
def schedule_store(database: Database) -> ScheduleStore:
    return ScheduleStore(database)


@pytest.fixture
def operator_store(database: Database) -> OperatorStore:
    return OperatorStore(database)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for arranging and inspecting rows."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def sqs_server() -> Iterator[SqsServer]:
    server = start_sqs(os.environ.get("TOCK_TEST_SQS", "localstack"))
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def queue_prefix(sqs_server: SqsServer) -> str:
    return f"t{uuid.uuid4().hex[:8]}-"


@pytest.fixture
def transport(queue_prefix: str) -> SqsTransport:
    t = SqsTransport(queue_prefix)
    t.create_queue("default", visibility_timeout=60)
    return t


@pytest.fixture
def client(database_url: str) -> Iterator[Client]:
    with Client(ClientSettings(database_url=database_url)) as c:
        yield c


@pytest.fixture
def timer_settings(database_url: str, queue_prefix: str) -> TimerSettings:
    return TimerSettings(database_url=database_url, queue_prefix=queue_prefix,
                         backoff_base_seconds=1, backoff_cap_seconds=1)


@pytest.fixture
def consumer_settings(database_url: str, queue_prefix: str) -> ConsumerSettings:
    return ConsumerSettings(database_url=database_url, queue_prefix=queue_prefix,
                            lease_seconds=30, heartbeat_seconds=10,
                            visibility_timeout_seconds=60, receive_wait_seconds=1,
                            backoff_base_seconds=1, backoff_cap_seconds=1,
                            shutdown_grace_seconds=5)
