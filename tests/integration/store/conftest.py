"""Fixtures of the store conformance suite: a pinned `now` taken from the database clock,
and a second connection (`other`) that holds row locks in an open transaction."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

from tests.support.drive import db_now


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
def impatient(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection that waits at most 2 s for a row lock: a SKIP LOCKED test
    run on it fails with `LockTimeout` instead of hanging should the statement wait."""
    conn = psycopg.connect(database_url, autocommit=True,
                           application_name="tock-test-impatient")
    conn.execute("SET lock_timeout = '2s'")
    try:
        yield conn
    finally:
        conn.close()
