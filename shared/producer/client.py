"""The producer client: put jobs into tock and look after them.

    from shared.client import schedule
    job = schedule("email", {"to": "a@example.com"}, delay=30, key="welcome:42")

Module-level functions use a default `Client` built from `TOCK_*` settings on first use.
Every argument is checked before anything is written; bad input raises `InvalidInput`
with a message that names the argument.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg

from shared.core import validation
from shared.core.errors import InvalidInput, InvalidTransition, JobNotFound
from shared.core.jobs import Job, attempt_from_row
from shared.runtime.settings import ClientSettings
from shared.store import jobs_sql as sql
from shared.store.database import Connection, make_pool, statement, transaction

Seconds = float | int | timedelta


class Client:
    """A connection pool and the producer operations over it. Thread-safe."""

    def __init__(self, settings: ClientSettings | None = None, *, database_url: str | None = None,
                 now: datetime | None = None) -> None:
        self.settings = settings or ClientSettings.load()
        if database_url:
            self.settings = self.settings.model_copy(update={"database_url": database_url})
        self._now = now  # tests pin the database's idea of "now" through this
        # Autocommit connections: enqueue, get, cancel and retry are one statement each (or a
        # read after one) and skip BEGIN/COMMIT (`atomic=False`); multi-statement work still
        # runs in a transaction. Checked on checkout: a restarted database must not fail an
        # application's call.
        self._pool = make_pool(self.settings.database_url, max_size=self.settings.pool_max_size,
                               name="tock-client", autocommit=True)
        self._opened = False
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _conn(self, connection: object | None, *, atomic: bool = True) -> Iterator[Connection]:
        if connection is not None:
            # The caller's transaction: no commit here; a rollback there leaves no job.
            yield _psycopg_connection(connection)
            return
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self._pool.open()
                    self._opened = True
        with (transaction if atomic else statement)(self._pool) as conn:
            yield conn

    # --- enqueue -----------------------------------------------------------------------------

    def schedule(self, kind: str, payload: Any = None, *, at: datetime | None = None,
                 delay: Seconds | None = None, key: str | None = None, priority: int = 0,
                 queue: str | None = None, max_attempts: int | None = None,
                 timeout: Seconds | None = None, tenant: str | None = None,
                 connection: object | None = None) -> Job:
        """Enqueue one job to run now, at `at` (timezone-aware), or after `delay` seconds.

        `key` makes the call idempotent: if a job with that key exists, it is returned (with
        `created=False`) and nothing is written. `connection` (psycopg 3, or SQLAlchemy on
        psycopg) enqueues inside the caller's transaction. `max_attempts` and `timeout`
        default to the task's own defaults (see `consumer.task`).
        """
        spec = dict(kind=kind, payload=payload, at=at, delay=delay, key=key, priority=priority,
                    queue=queue, max_attempts=max_attempts, timeout=timeout, tenant=tenant)
        return self.schedule_many([spec], connection=connection)[0]

    def schedule_many(self, jobs: Iterable[Mapping[str, Any]], *,
                      connection: object | None = None) -> list[Job]:
        """Enqueue many jobs in one round trip. Each item takes the keyword arguments of
        `schedule` (`kind` required). Returns the jobs in input order. All or nothing:
        one invalid item raises before anything is written."""
        columns = self._columns(jobs)
        if not columns["kind"]:
            return []
        with self._conn(connection, atomic=False) as conn:
            rows = conn.execute(sql.INSERT_JOBS, {**columns, "now": self._now}).fetchall()
            inserted = [Job.from_row(r) for r in rows]
            by_key = {j.unique_key: j for j in inserted if j.unique_key}
            missing = [k for k in columns["unique_key"] if k and k not in by_key]
            if missing:
                existing = conn.execute(sql.SELECT_JOBS_BY_KEY, {"keys": missing}).fetchall()
                for row in existing:
                    job = Job.from_row(row, created=False)
                    by_key[job.unique_key] = job  # type: ignore[index]
        keyless = iter(j for j in inserted if not j.unique_key)
        return [by_key[k] if k else next(keyless) for k in columns["unique_key"]]

    def _columns(self, jobs: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
        cols: dict[str, list[Any]] = {c: [] for c in (
            "kind", "queue", "payload", "priority", "at", "delay", "max_attempts",
            "timeout_seconds", "unique_key", "tenant")}
        limit = self.settings.max_payload_bytes
        for index, item in enumerate(jobs):
            if not isinstance(item, Mapping):
                raise InvalidInput(f"job #{index} must be a mapping, got {type(item).__name__}")
            try:
                spec = validation.spec_fields(dict(item))
                at, delay = validation.run_time(spec.get("at"), spec.get("delay"))
                cols["kind"].append(validation.kind(spec["kind"]))
                cols["queue"].append(validation.queue(spec.get("queue")
                                                      or self.settings.default_queue))
                cols["payload"].append(validation.payload(spec.get("payload"), limit))
                cols["priority"].append(validation.priority(spec.get("priority", 0)))
                cols["at"].append(at)
                cols["delay"].append(delay)
                cols["max_attempts"].append(validation.max_attempts(spec.get("max_attempts")))
                cols["timeout_seconds"].append(validation.timeout_seconds(spec.get("timeout")))
                cols["unique_key"].append(validation.optional_text(
                    "key", spec.get("key"), validation.MAX_KEY_LENGTH))
                cols["tenant"].append(validation.optional_text(
                    "tenant", spec.get("tenant"), validation.MAX_TENANT_LENGTH))
            except InvalidInput as exc:
                if index == 0 and len(cols["kind"]) == 0:
                    raise
                raise InvalidInput(f"job #{index}: {exc}") from None
        return cols

    # --- look after jobs -----------------------------------------------------------------------

    def get(self, job_id: int, *, with_attempts: bool = False,
            connection: object | None = None) -> Job:
        """The job as stored now; `with_attempts` adds its finished attempts, oldest first."""
        validation.job_id(job_id)
        with self._conn(connection, atomic=False) as conn:
            row = conn.execute(sql.SELECT_JOB, {"id": job_id}).fetchone()
            if row is None:
                raise JobNotFound(f"no job with id {job_id}")
            job = Job.from_row(row)
            if with_attempts:
                attempts = conn.execute(sql.SELECT_ATTEMPTS, {"id": job_id}).fetchall()
                job = replace(job, attempts=tuple(attempt_from_row(a) for a in attempts))
        return job

    def cancel(self, job_id: int, *, connection: object | None = None) -> Job:
        """Cancel a job that has not finished. A running job's worker sees its lease gone at
        its next heartbeat, signals the handler to stop, and its result is never written."""
        return self._transition(sql.CANCEL_JOB, job_id, "cancel",
                                "scheduled, retrying, dispatched or running", connection)

    def retry(self, job_id: int, *, connection: object | None = None) -> Job:
        """Run a dead or cancelled job again now, with a fresh attempt count."""
        job = self._transition(sql.RETRY_JOB, job_id, "retry", "dead or cancelled", connection)
        return job

    def _transition(self, statement: str, job_id: int, verb: str, allowed: str,
                    connection: object | None) -> Job:
        validation.job_id(job_id)
        with self._conn(connection, atomic=False) as conn:
            row = conn.execute(statement, {"id": job_id, "now": self._now}).fetchone()
            if row is None:
                current = conn.execute(sql.SELECT_JOB, {"id": job_id}).fetchone()
                if current is None:
                    raise JobNotFound(f"no job with id {job_id}")
                state = Job.from_row(current).state
                raise InvalidTransition(
                    f"cannot {verb} job {job_id}: it is {state}; only {allowed} jobs can be")
            if verb == "retry":
                conn.execute(sql.NOTIFY_DUE)
            return Job.from_row(row)


def _psycopg_connection(connection: object) -> Connection:
    """Accept a psycopg 3 connection, or a SQLAlchemy Connection/Session on psycopg."""
    if isinstance(connection, psycopg.Connection):
        return connection
    inner: Any = connection
    if hasattr(inner, "connection") and callable(inner.connection):  # Session
        inner = inner.connection()
    raw = getattr(getattr(inner, "connection", None), "dbapi_connection", None)
    if isinstance(raw, psycopg.Connection):
        return raw
    raise InvalidInput(
        "connection must be a psycopg 3 Connection, or a SQLAlchemy Connection or Session "
        f"using the psycopg driver (postgresql+psycopg://); got {type(connection).__name__}"
    )


_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client, built from `TOCK_*` settings on first use."""
    global _default  # noqa: PLW0603 - one lazily built client per process
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def schedule(kind: str, payload: Any = None, **options: Any) -> Job:
    """`Client.schedule` on the default client."""
    return default_client().schedule(kind, payload, **options)


def schedule_many(jobs: Iterable[Mapping[str, Any]], **options: Any) -> list[Job]:
    """`Client.schedule_many` on the default client."""
    return default_client().schedule_many(jobs, **options)


def get(job_id: int, **options: Any) -> Job:
    """`Client.get` on the default client."""
    return default_client().get(job_id, **options)


def cancel(job_id: int, **options: Any) -> Job:
    """`Client.cancel` on the default client."""
    return default_client().cancel(job_id, **options)


def retry(job_id: int, **options: Any) -> Job:
    """`Client.retry` on the default client."""
    return default_client().retry(job_id, **options)
