"""The job handle returned by the client, and its attempt history."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.core.states import AttemptOutcome, JobState


@dataclass(frozen=True)
class Attempt:
    """One finished attempt of a job."""

    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: AttemptOutcome
    error: str | None
    traceback: str | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Attempt:
        """Build from a row of (attempt, worker, started_at, finished_at, outcome, error,
        traceback)."""
        values = list(row)
        values[4] = AttemptOutcome(values[4])
        return cls(*values)


@dataclass(frozen=True)
class Job:
    """A job as stored. `created` is False when `schedule(key=...)` found an existing job."""

    id: int
    kind: str
    queue: str
    payload: Any
    priority: int
    state: JobState
    run_at: datetime
    attempt: int
    max_attempts: int | None
    timeout_seconds: float | None
    unique_key: str | None
    tenant: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    dispatch_token: UUID | None
    dispatched_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    dispatch_failures: int = 0
    """Sends SQS refused in a row (the timer retries them with a backoff of their own)."""
    lease_detached: bool = False
    """A running job whose handler got stuck: its lease no longer follows its worker's."""
    concurrency_key: str | None = None
    """What a per-key concurrency limit of its kind counts it under (README, Limits)."""
    created: bool = True
    attempts: tuple[Attempt, ...] = field(default=())

    @property
    def key(self) -> str | None:
        """The idempotency key given as `schedule(key=...)` (stored as `unique_key`), the
        name the API, the CLI and `--json` use."""
        return self.unique_key

    @classmethod
    def from_row(cls, row: tuple[Any, ...], *, created: bool = True) -> Job:
        """Build from a row selected with `jobs_sql.JOB_COLUMNS` (shared.store)."""
        names = [f for f in cls.__dataclass_fields__ if f not in ("created", "attempts")]
        values = dict(zip(names, row, strict=True))
        values["state"] = JobState(values["state"])
        return cls(**values, created=created)
