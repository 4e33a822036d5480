"""The typed rows the stores take and return, beside `Job` and `Attempt` (shared.core.jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from shared.core.schedules import Schedule
from shared.core.states import AttemptOutcome, JobState


@dataclass(frozen=True)
class NewJob:
    """A validated job to insert (shared.producer builds these)."""

    kind: str
    queue: str
    payload: str
    """JSON text."""
    priority: int = 0
    at: datetime | None = None
    delay_seconds: float = 0.0
    max_attempts: int | None = None
    timeout_seconds: float | None = None
    unique_key: str | None = None
    tenant: str | None = None
    concurrency_key: str | None = None


@dataclass(frozen=True)
class LimitRoom:
    """What a limit leaves for one claim: the timer holds its lock (`mine`) or another
    timer is claiming for it and it has no room this pass."""

    scope: str
    key: str
    max_running: int | None
    in_flight: int | None
    tokens: float | None
    rate: float | None
    mine: bool

    @property
    def room(self) -> int | None:
        """Jobs that may be dispatched now; None: no bound."""
        if not self.mine:
            return 0
        bounds = []
        if self.max_running is not None:
            bounds.append(max(self.max_running - (self.in_flight or 0), 0))
        if self.tokens is not None:
            bounds.append(max(int(self.tokens), 0))
        return min(bounds) if bounds else None


@dataclass(frozen=True)
class DueJob:
    """A job the timer claimed for dispatch (now `dispatched` with a fresh token)."""

    id: int
    kind: str
    queue: str
    token: UUID
    prev_state: JobState
    lag_seconds: float
    """How late the dispatch is: now - when it became due (`columns.due_since`)."""
    tenant_key: str = ""
    """Its tenant, '' for none (fair share accounting)."""
    run_at: datetime | None = None
    """When it was due: with `id`, its place in its pair's claim order."""
    priority: int = 0
    """Its priority level (the message carries it for the consumer's local order)."""


@dataclass(frozen=True)
class Refused:
    """A dispatched job SQS did not take: back to `prev_state`, with the reason."""

    id: int
    prev_state: JobState
    error: str


@dataclass(frozen=True)
class Claim:
    """A received message to claim, with the task defaults for fields the job left NULL."""

    job_id: int
    token: UUID
    default_max_attempts: int
    default_timeout_seconds: float
    kind: str | None = None
    """The kind the message names, whose defaults these are: the claim matches only a job
    of that kind (None: any), so a message cannot lend a job another kind's limits."""
    queue: str | None = None
    """The queue the message came from: the claim matches only a job of that queue (None:
    any), so a message copied or moved to another queue is not run by that queue's
    consumers."""


@dataclass(frozen=True)
class ClaimedJob:
    """A job a consumer now runs under its lease."""

    id: int
    kind: str
    payload: Any
    attempt: int
    max_attempts: int
    timeout_seconds: float
    run_at: datetime
    token: UUID
    queue: str
    tenant: str | None
    key: str | None
    claimed_at: datetime
    """The database's now at the claim: the handler's deadline runs from it."""
    lag_seconds: float
    """How late the claim is, from when the job became due (`columns.due_since`): the
    due-to-start latency."""


@dataclass(frozen=True)
class Lease:
    """What fences a worker's writes to one job."""

    job_id: int
    attempt: int
    token: UUID


@dataclass(frozen=True)
class AttemptResult:
    """The outcome of one attempt, written fenced on the lease."""

    lease: Lease
    state: JobState
    outcome: AttemptOutcome
    delay_seconds: float = 0.0
    error: str | None = None
    traceback: str | None = None
    refund: bool = False
    """Give the attempt back (a release at shutdown is not a failure)."""


@dataclass(frozen=True)
class ExpiredLease:
    """A running job whose lease ran out (by the database clock), locked for rescue."""

    job_id: int
    attempt: int
    max_attempts: int
    owner: str | None
    started_at: datetime | None
    expired_at: datetime
    detached: bool = False
    """Its worker let it go (a stuck or given-up handler) and lived on: its own lease ran
    out, not the worker's."""


@dataclass(frozen=True)
class Rescue:
    """What the rescuer decided for one expired lease."""

    job_id: int
    attempt: int
    state: JobState
    delay_seconds: float
    error: str
    worker: str | None


class DueSchedule(NamedTuple):
    """A schedule a timer has locked to plan, with what the overlap policy needs."""

    schedule: Schedule
    active: bool
    """A run of it is scheduled, retrying, dispatched or running."""
    released_at: datetime | None
    """With a buffered slot: when its newest run finished (None: no finished run)."""


@dataclass(frozen=True)
class SlotJob:
    """A recurring slot to turn into a job, under its run key."""

    schedule: str
    run_at: datetime
    key: str


@dataclass(frozen=True)
class AuditRecord:
    """Slots of a schedule that did not become jobs, and why."""

    schedule: str
    reason: str
    first_slot: datetime
    last_slot: datetime
    slot_count: int | None
    detail: str | None


@dataclass(frozen=True)
class Cursor:
    """Where a schedule stands: every slot up to `cursor_at` is handled."""

    cursor_at: datetime
    next_slot: datetime | None
    next_fire_at: datetime | None
    buffered_slot: datetime | None = None


@dataclass(frozen=True)
class WorkerHolder:
    """The live process holding a worker id another process wants (JobStore.take_worker_id)."""

    host: str
    pid: int
    last_heartbeat: datetime | None
    expires_in: float
    """Seconds until its lease runs out, if it beats no more."""
