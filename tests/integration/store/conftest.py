"""Fixtures of the store conformance suite: a connection that refuses to wait for locks
(`impatient`). The pinned `now` and the second connection `other` are in
tests/integration/conftest.py (the retention and key tests use them too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest


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
