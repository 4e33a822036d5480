"""The producer client: put jobs into tock and look after them.

    from shared.client import schedule
    job = schedule("email", {"to": "a@example.com"}, delay=30, key="welcome:42")

Every argument is checked before anything is written; bad input raises `InvalidInput`
with a message that names the argument. (`shared.client` combines this client with the
recurring-schedules API and provides the process-wide default.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from shared.core import validation
from shared.core.config import ProducerConfig
from shared.core.errors import (
    ConnectionLost,
    DatabaseReadOnly,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    Retryable,
)
from shared.core.jobs import Job
from shared.core.limits import LimitSpec, limit_target
from shared.core.reports import LimitInfo
from shared.core.states import JobState
from shared.store.database import Database, adopt_connection
from shared.store.flow_store import FlowStore
from shared.store.job_store import JobStore
from shared.store.known_kinds import KnownKinds
from shared.store.rows import NewJob

Seconds = float | int | timedelta

DATABASE_SETTING = "TOCK_DATABASE_URL or ClientSettings.database_url"
"""Where the client's database comes from, named when it cannot be used."""
CALL_TIMEOUT_SETTING = "TOCK_CALL_TIMEOUT_SECONDS (ClientSettings.call_timeout_seconds)"
"""Where a client call's statement timeout comes from, named when one runs past it."""


KEYED_INSERT_ATTEMPTS = 3
"""Attempts of a keyed insert after the first was cut off in flight (each may wait the
pool's timeout for the database)."""


class Client:
    """A connection pool and the producer operations over it. Thread-safe."""

    def __init__(self, settings: ProducerConfig, *, now: datetime | None = None,
                 pool_timeout: float = 30.0, database_setting: str = DATABASE_SETTING,
                 call_timeout_setting: str | None = CALL_TIMEOUT_SETTING) -> None:
        missing = [name for name in ProducerConfig.__annotations__
                   if not hasattr(settings, name)]
        if missing:  # Client("postgresql://...") would fail later on an attribute
            raise InvalidInput(
                f"Client takes settings, e.g. Client(ClientSettings(database_url=...)) "
                f"(shared.runtime.settings), got {type(settings).__name__}, which has no "
                f"{', '.join(missing)}")
        self.settings = settings
        self._now = now  # tests pin the database's idea of "now" through this
        # Autocommit connections: enqueue, get, cancel and retry are one statement each (or a
        # read after one) and skip BEGIN/COMMIT. Checked on checkout: a restarted database
        # must not fail an application's call. But a database that cannot be used at all
        # (wrong URL, password or host; not running) fails the first call at once, saying
        # why and where to fix it, instead of after the pool's 30 s wait (Database).
        self.database = Database(settings.database_url, max_size=settings.pool_max_size,
                                 name="tock-client", setting=database_setting,
                                 timeout=pool_timeout,
                                 answer_timeout=settings.call_timeout_seconds,
                                 answer_setting=call_timeout_setting)
        self._jobs = JobStore(self.database)
        self._flow = FlowStore(self.database)
        self.known_kinds = KnownKinds(self._jobs)

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    @contextmanager
    def _callers(connection: object | None) -> Iterator[None]:
        """A write refused as read-only on the caller's connection is the caller's to fix:
        tock drops and replaces its own connections (`DatabaseReadOnly` is retryable), but
        not one it was given, which would refuse the same write every time."""
        try:
            yield
        except DatabaseReadOnly as exc:
            if connection is None:
                raise
            raise InvalidInput(
                "connection= is read-only (its transaction is READ ONLY, or its server a "
                "standby): nothing was written, and this connection will refuse every "
                "write; give one in a read-write transaction on the primary") from exc

    def _store(self, connection: object | None) -> JobStore:
        """The job store on the caller's transaction (no commit here: a rollback there leaves
        no job), or on the client's own pool."""
        return JobStore.on(adopt_connection(connection)) if connection is not None \
            else self._jobs

    # --- enqueue -----------------------------------------------------------------------------

    def schedule(self, kind: str, payload: Any = None, *, at: datetime | None = None,
                 delay: Seconds | None = None, key: str | None = None, priority: int = 0,
                 queue: str | None = None, max_attempts: int | None = None,
                 timeout: Seconds | None = None, tenant: str | None = None,
                 concurrency_key: str | None = None,
                 connection: object | None = None) -> Job:
        """Enqueue one job to run now, at `at` (timezone-aware), or after `delay` seconds.

        `key` makes the call idempotent: if a job with that key exists, it is returned (with
        `created=False`) and nothing is written. `connection` (psycopg 3, or SQLAlchemy on
        psycopg) enqueues inside the caller's transaction. `max_attempts` and `timeout`
        default to the task's own defaults (see `consumer.task`). `concurrency_key` is what a
        per-key limit of the kind counts the job under (`set_limit("kind_key", kind, ...)`).
        """
        spec = dict(kind=kind, payload=payload, at=at, delay=delay, key=key, priority=priority,
                    queue=queue, max_attempts=max_attempts, timeout=timeout, tenant=tenant,
                    concurrency_key=concurrency_key)
        return self._enqueue(self._validated([spec], numbered=False), connection)[0]

    def schedule_many(self, jobs: Iterable[Mapping[str, Any]], *,
                      connection: object | None = None) -> list[Job]:
        """Enqueue many jobs in one round trip. Each item takes the keyword arguments of
        `schedule` (`kind` required). Returns the jobs in input order. All or nothing:
        one invalid item raises before anything is written, its message starting with
        `job #N:`, N its index in `jobs` (from 0)."""
        return self._enqueue(self._validated(jobs, numbered=True), connection)

    def _enqueue(self, new: list[NewJob], connection: object | None) -> list[Job]:
        if not new:
            return []
        if self.settings.reject_unknown_kinds:
            self.known_kinds.check(j.kind for j in new)
        store = self._store(connection)
        try:
            with self._callers(connection):
                inserted = store.insert_jobs(new, self._now)
        except ConnectionLost as exc:
            # The insert was sent and the connection lost before its answer: it may have
            # committed. With a key on every job, sending it again is safe (a job the lost
            # attempt made holds its key and is read back below, with created=False), and
            # waits for the database as any call does. Without one it could make a job twice.
            if connection is not None or not all(j.unique_key for j in new):
                raise ConnectionLost(
                    f"{exc}; the connection was lost after the job(s) were sent, so they may "
                    "have been written: calling again could enqueue them twice (give each job "
                    "a key= to make a repeat safe)", exc.sqlstate) from exc
            inserted = self._insert_keyed_again(store, new)
        by_key = {j.unique_key: j for j in inserted if j.unique_key}
        try:
            try:
                self._existing(store, new, by_key)
            except DatabaseUnavailable:
                if connection is not None:
                    raise
                # A read, safe to repeat: a Postgres restart between the insert and it is
                # a delay (the pool waits for the server), as for any other call.
                self._existing(store, new, by_key)
        except DatabaseUnavailable as exc:
            if connection is not None:
                raise
            if not inserted:  # every key was taken: this call wrote nothing
                raise
            raise ConnectionLost(  # the insert did commit: not "nothing was written"
                f"{exc}; the new job(s) were written but those whose key was taken could not "
                "be read: calling again with the same keys is safe", exc.sqlstate) from exc
        except Retryable as exc:
            if connection is not None or exc.sqlstate != "57014":
                raise
            # A statement after the insert ran past the call timeout: its error says
            # "nothing was written", true of that statement only. The insert committed.
            why = (str(exc.__cause__ or exc).strip().splitlines() or ["cancelled"])[0]
            raise Retryable(
                f"{why}: a statement after the new job(s) were written was cancelled (the "
                f"call timeout is {self.settings.call_timeout_seconds:g} s), so those whose "
                "key was taken could not be read: calling again with the same keys is safe",
                exc.sqlstate) from exc
        keyless = iter(j for j in inserted if not j.unique_key)
        out, seen = [], set()
        for j in new:
            if not j.unique_key:
                out.append(next(keyless))
                continue
            found = by_key[j.unique_key]
            # The same job twice in one call: made once, the repeat is "already there".
            out.append(replace(found, created=False) if j.unique_key in seen else found)
            seen.add(j.unique_key)
        return out

    def _insert_keyed_again(self, store: JobStore, new: list[NewJob]) -> list[Job]:
        """The insert of keyed jobs again, after an attempt cut off in flight. A cut (a
        crash, a network cut) can meet the next attempt too, on a connection the pool
        had not yet seen die: each waits for the database as any call does, a few times."""
        for attempt in range(KEYED_INSERT_ATTEMPTS):
            try:
                return store.insert_jobs(new, self._now)
            except DatabaseUnavailable as again:
                if attempt + 1 == KEYED_INSERT_ATTEMPTS:
                    raise ConnectionLost(
                        f"{again}; the first attempt was cut off after the job(s) were sent, "
                        "so they may have been written: calling again with the same keys is "
                        "safe", again.sqlstate) from again
        raise AssertionError("unreachable")

    def _existing(self, store: JobStore, new: list[NewJob], by_key: dict[str, Job]) -> None:
        """Fill `by_key` with the jobs that hold the keys not inserted. A key can be held
        by no job for a moment: its job's day passed its retention and the timer has not
        yet freed its keys. Such a key is freed here (only if no job holds it, in one
        statement) and the job inserted again; at most a few rounds, since a competing
        producer that wins the key leaves a job to read."""
        for _ in range(3):
            missing = list(dict.fromkeys(
                j.unique_key for j in new if j.unique_key and j.unique_key not in by_key))
            if not missing:
                return
            for job in store.jobs_by_key(missing):
                by_key[job.unique_key] = job  # type: ignore[index]
            orphaned = [k for k in missing if k not in by_key]
            if not orphaned or not store.reclaim_keys(orphaned):
                continue
            again = {j.unique_key: j for j in new if j.unique_key in orphaned}
            for job in store.insert_jobs(list(again.values()), self._now):
                by_key[job.unique_key] = job  # type: ignore[index]
        missing = [j.unique_key for j in new if j.unique_key and j.unique_key not in by_key]
        if missing:
            raise Retryable(f"key(s) {missing[:5]} are taken but no job holds "
                                      "them; try again")

    def _validated(self, jobs: Iterable[Mapping[str, Any]], *, numbered: bool) -> list[NewJob]:
        """The jobs checked; `numbered` (schedule_many) starts a message about an item with
        `job #N: ` (its index), as `schedule()`'s one job needs no number."""
        if isinstance(jobs, str | bytes | Mapping) or not isinstance(jobs, Iterable):
            raise InvalidInput(f"jobs must be a list of job mappings, got {type(jobs).__name__}")
        out: list[NewJob] = []
        by_key: dict[str, NewJob] = {}
        limit = self.settings.max_payload_bytes
        for index, item in enumerate(jobs):
            if not isinstance(item, Mapping):
                raise InvalidInput(f"job #{index} must be a mapping, got {type(item).__name__}")
            try:
                spec = validation.spec_fields(dict(item))
                at, delay = validation.run_time(spec.get("at"), spec.get("delay"))
                queue = spec.get("queue")
                job = NewJob(
                    kind=validation.kind(spec["kind"]),
                    queue=validation.queue(self.settings.default_queue if queue is None
                                           else queue),
                    payload=validation.payload(spec.get("payload"), limit),
                    priority=validation.priority(spec.get("priority", 0)),
                    at=at, delay_seconds=delay,
                    max_attempts=validation.max_attempts(spec.get("max_attempts")),
                    timeout_seconds=validation.timeout_seconds(spec.get("timeout")),
                    unique_key=validation.job_key(spec.get("key")),
                    tenant=validation.new_tenant(spec.get("tenant")),
                    concurrency_key=validation.optional_text(
                        "concurrency_key", spec.get("concurrency_key"),
                        validation.MAX_CONCURRENCY_KEY_LENGTH))
                if job.unique_key is not None:
                    earlier = by_key.setdefault(job.unique_key, job)
                    if earlier != job and _canonical(earlier) != _canonical(job):
                        raise InvalidInput(f"key {job.unique_key!r} is given twice with "
                                           "different jobs in one call")
            except InvalidInput as exc:
                if not numbered:
                    raise
                raise InvalidInput(f"job #{index}: {exc}") from None
            out.append(job)
        return out

    # --- look after jobs -----------------------------------------------------------------------

    def get(self, job_id: int, *, with_attempts: bool = False,
            connection: object | None = None) -> Job:
        """The job as stored now; `with_attempts` adds its finished attempts, oldest first."""
        validation.job_id(job_id)
        store = self._store(connection)
        job = store.get_job(job_id)
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        if with_attempts:
            job = replace(job, attempts=tuple(store.attempts(job_id)))
        return job

    def cancel(self, job_id: int, *, connection: object | None = None) -> Job:
        """Cancel a job that has not finished. A running job's worker sees its lease gone at
        its next heartbeat, signals the handler to stop, and its result is never written."""
        validation.job_id(job_id)
        store = self._store(connection)
        with self._callers(connection):
            job = store.cancel_job(job_id, self._now)
        return job or self._refused(store, job_id, "cancel",
                                    "scheduled, retrying, dispatched or running")

    def retry(self, job_id: int, *, connection: object | None = None) -> Job:
        """Run a dead or cancelled job again now, with a fresh attempt count."""
        validation.job_id(job_id)
        store = self._store(connection)
        with self._callers(connection):
            job = store.retry_job(job_id, self._now)
        if job is None:
            # The timer's retention loop may have been moving this (pre-0007) job to the
            # history at that instant: the statement saw it in neither place it could act.
            current = store.get_job(job_id)
            if current is not None and current.state in (JobState.DEAD, JobState.CANCELLED):
                job = store.retry_job(job_id, self._now)
        if job is None:
            return self._refused(store, job_id, "retry", "dead or cancelled")
        store.notify_due()
        return job

    # --- fair share ------------------------------------------------------------------------

    def set_tenant_weight(self, tenant: str | None, weight: int) -> None:
        """Give `tenant` (None: the jobs enqueued without one) `weight` shares of each
        dispatch batch, against 1 for every tenant without a weight (1..1000). The timers
        use it from their next pass; jobs already in SQS are not affected."""
        key, weight = validation.new_tenant_key(tenant), validation.tenant_weight(weight)
        self._flow.set_tenant_weight(key, weight)

    def reset_tenant_weight(self, tenant: str | None) -> bool:
        """Back to the default weight of 1; False if `tenant` had no weight set."""
        return self._flow.reset_tenant_weight(validation.tenant_key(tenant))

    def tenant_weights(self) -> dict[str | None, int]:
        """The weights set, by tenant (None: jobs without a tenant)."""
        return {tenant or None: weight for tenant, weight in self._flow.tenant_weights().items()}

    # --- limits ----------------------------------------------------------------------------

    def set_limit(self, scope: str, key: str | None, *, max_running: int | None = None,
                  rate: float | None = None, per: Seconds | None = None,
                  burst: int | None = None) -> LimitInfo:
        """Limit a kind (`scope="kind"`) or a tenant (`"tenant"`; key None: the jobs without
        one) fleet-wide: at most `max_running` jobs dispatched or running at once (0 holds
        them all back), and/or at most `rate` dispatches per `per` seconds (default 1; only
        with a rate), from a bucket
        of `burst` tokens (default: one second's worth). `"kind_key"` limits each
        concurrency key of the kind `key` to `max_running` (jobs without a key are not
        counted). Replaces the limit it had. Jobs over a limit wait in Postgres; the timers
        apply a change from their next pass."""
        spec = LimitSpec.of(scope, key, max_running=max_running, rate=rate, per=per,
                            burst=burst)
        self._flow.set_limit(spec.scope, spec.key, max_running=spec.max_running,
                             rate_per_second=spec.rate_per_second, burst=spec.burst,
                             now=self._now)
        self._jobs.notify_due()  # a raised limit may free due work at once
        return self._flow.limits(spec.scope, spec.key, now=self._now)[0]

    def remove_limit(self, scope: str, key: str | None) -> bool:
        """Drop the limit of a kind or tenant (or a kind's per-key limit); False if it had
        none."""
        scope, name = limit_target(scope, key)
        removed = self._flow.remove_limit(scope, name)
        if removed:
            self._jobs.notify_due()
        return removed

    def limits(self) -> list[LimitInfo]:
        """Every limit with its use now: slots held, tokens, due jobs waiting for it."""
        return self._flow.limits(now=self._now)

    @staticmethod
    def _refused(store: JobStore, job_id: int, verb: str, allowed: str) -> Job:
        """Why a guarded transition matched nothing, as the error to raise."""
        current = store.get_job(job_id)
        if current is None:
            raise JobNotFound(f"no job with id {job_id}")
        raise InvalidTransition(
            f"cannot {verb} job {job_id}: it is {current.state}; only {allowed} jobs can be")


def _canonical(job: NewJob) -> NewJob:
    """`job` with its payload's objects in key order: {"a": 1, "b": 2} and {"b": 2, "a": 1}
    are one payload (as Python and jsonb compare them), so one job for one key."""
    return replace(job, payload=json.dumps(json.loads(job.payload), sort_keys=True,
                                           separators=(",", ":"), ensure_ascii=False))
