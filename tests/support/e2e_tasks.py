"""Handlers for the process-level tests: each run is recorded in `e2e_runs` in the job's own
database, so a test can count how many times each job really ran."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from consumer import TaskContext, task

DDL = """CREATE TABLE IF NOT EXISTS e2e_runs (
    job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())"""


_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["TOCK_DATABASE_URL"], autocommit=True)
        _local.conn = conn
    return conn


def _record(ctx: TaskContext) -> int:
    """Record this run; returns how many runs of the job there have been, this one included."""
    conn = _conn()
    conn.execute("INSERT INTO e2e_runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
                 (ctx.job_id, ctx.attempt, os.getpid()))
    row = conn.execute("SELECT count(*) FROM e2e_runs WHERE job_id = %s",
                       (ctx.job_id,)).fetchone()
    return int(row[0]) if row else 0


@task("record")
def record(payload: Any, ctx: TaskContext) -> None:
    _record(ctx)


@task("block_first")
def block_first(payload: Any, ctx: TaskContext) -> None:
    """The first run records itself, then blocks until cancelled (or killed)."""
    if _record(ctx) == 1:
        ctx.cancelled.wait(120)


@task("hang_first")
def hang_first(payload: Any, ctx: TaskContext) -> None:
    """The first run records itself, then hangs past its timeout ignoring ctx.cancelled
    (only a killed process ends it); later runs record themselves and return."""
    if _record(ctx) == 1:
        time.sleep(120)
