"""Request and response bodies of the HTTP API (they are the OpenAPI schema)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from shared.core import validation
from shared.core.filters import MAX_PAGE_SIZE, JobFilter
from shared.core.iso_time import iso_mistake, parse_iso_datetime
from shared.core.jobs import Attempt, Job
from shared.core.reports import LimitInfo, QueueKindStats, TenantStats, WorkerInfo
from shared.core.states import AttemptOutcome, JobState
from shared.core.text import shown
from shared.core.validation import QUEUE_NAME
from shared.ops.explain import Explanation
from shared.schedules.api import MAX_PREVIEW

MAX_ID = 9 * 10**18
"""Below Postgres' bigint limit (2**63 - 1) and exact as a JSON-schema float, so clients
and validators agree on it; larger ids cannot exist and are refused before the database."""


def _iso(value: object) -> object:
    """ISO 8601 text only: lax parsing would take `0.5` for a Unix time."""
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string")
    try:
        parsed = parse_iso_datetime(value)
    except ValueError:
        raise ValueError(iso_mistake(value) or f"{value!r} is not an ISO 8601 date-time "
                                               "such as 2026-12-02T15:04:05Z") from None
    # Python takes offsets up to 24 h, Postgres up to 15:59: the same instant in UTC
    # suits both. Naive values pass through for shared.validation to refuse by name.
    if parsed.tzinfo is None:
        return parsed
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-05:00, 0001-01-01T00:00+05:00
        raise ValueError(f"{shown(value)} is out of range: in UTC it falls outside years 1 "
                         "to 9999") from None


IsoDateTime = Annotated[datetime, BeforeValidator(_iso)]


def _json_int(value: object) -> object:
    """JSON integers as JSON Schema sees them: 5 and 5.0, not "5" nor true."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_URL_INTEGER = re.compile(r"[0-9]+(?:\.0+)?")
"""Decimal digits, with a zero fraction as JSON Schema's integers may have (5.0)."""


def _decimal_digits(value: object) -> object:
    """A number in a path or a query string: decimal digits only. int() would also read
    "1_0" as 10, "+1", " 1" and full-width digits as 1: a mistyped id acting on another
    job."""
    if isinstance(value, str) and not _URL_INTEGER.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a whole number in decimal digits")
    return value


# Integers read from a URL's path or query string. The bounds are the type's own (with
# the schema written out, as below): FastAPI's Path/Query bounds would go into the schema
# as "ge"/"le" next to a validator.
JobIdInUrl = Annotated[int, BeforeValidator(_decimal_digits), Field(ge=1, le=MAX_ID),
                       WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_ID})]
PageSizeInUrl = Annotated[int, BeforeValidator(_decimal_digits),
                          Field(ge=1, le=MAX_PAGE_SIZE),
                          WithJsonSchema({"type": "integer", "minimum": 1,
                                          "maximum": MAX_PAGE_SIZE})]
PreviewInUrl = Annotated[int, BeforeValidator(_decimal_digits), Field(ge=1, le=MAX_PREVIEW),
                         WithJsonSchema({"type": "integer", "minimum": 1,
                                         "maximum": MAX_PREVIEW})]


# WithJsonSchema: pydantic would otherwise print the bounds of a validated int as
# "ge"/"le", which JSON Schema does not know.
Priority = Annotated[int, BeforeValidator(_json_int), Field(ge=0, le=9),
                     WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 9})]
MaxAttempts = Annotated[int, BeforeValidator(_json_int),
                        Field(ge=1, le=validation.MAX_ATTEMPTS_LIMIT),
                        WithJsonSchema({"type": "integer", "minimum": 1,
                                        "maximum": validation.MAX_ATTEMPTS_LIMIT})]
TenantWeight = Annotated[int, BeforeValidator(_json_int),
                         Field(ge=validation.MIN_TENANT_WEIGHT,
                               le=validation.MAX_TENANT_WEIGHT),
                         WithJsonSchema({"type": "integer",
                                         "minimum": validation.MIN_TENANT_WEIGHT,
                                         "maximum": validation.MAX_TENANT_WEIGHT})]
WholeNumber = Annotated[int, BeforeValidator(_json_int), WithJsonSchema({"type": "integer"})]
"""Bounds checked by the domain (shared.core.limits), which names them in a 400."""
PositiveNumber = Annotated[float, Field(gt=0, allow_inf_nan=False)]
JobIdIn = Annotated[int, BeforeValidator(_json_int), Field(ge=1, le=MAX_ID),
                    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_ID})]


# The same rules as shared.validation, so the schema tells clients what is accepted.
Kind = Annotated[str, Field(pattern=validation.KIND.pattern)]
Queue = Annotated[str, Field(pattern=QUEUE_NAME.pattern)]
Key = Annotated[str, Field(min_length=1, max_length=validation.MAX_KEY_LENGTH)]
Tenant = Annotated[str, Field(min_length=1, max_length=validation.MAX_TENANT_LENGTH)]
ConcurrencyKey = Annotated[str, Field(min_length=1,
                                      max_length=validation.MAX_CONCURRENCY_KEY_LENGTH)]


class StrictIn(BaseModel):
    """Request bodies take JSON types as they are: "3" is not a number, 0 is not false."""

    model_config = ConfigDict(strict=True, extra="forbid")


class ErrorOut(BaseModel):
    detail: str = Field(description="What is wrong, in words.")


class EnqueueIn(StrictIn):
    """A job to enqueue. Give `at` (timezone-aware) or `delay`, or neither for now."""

    kind: str = Field(pattern=validation.KIND.pattern, examples=["email"])
    payload: Any = Field(default=None, examples=[{"to": "a@example.com"}])
    at: IsoDateTime | None = None
    delay: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                description="seconds from now")
    key: Key | None = Field(default=None, description="idempotency key")
    priority: Priority = 0
    queue: Queue | None = None
    max_attempts: MaxAttempts | None = None
    timeout: float | None = Field(default=None, ge=validation.MIN_TIMEOUT_SECONDS,
                                  le=validation.MAX_TIMEOUT_SECONDS,
                                  allow_inf_nan=False,
                                  description="seconds")
    tenant: Tenant | None = None
    concurrency_key: ConcurrencyKey | None = Field(
        default=None, description="what a per-key limit of the kind counts the job under")


class AttemptOut(BaseModel):
    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: AttemptOutcome
    error: str | None
    traceback: str | None

    @classmethod
    def of(cls, a: Attempt) -> AttemptOut:
        return cls(attempt=a.attempt, worker=a.worker, started_at=a.started_at,
                   finished_at=a.finished_at, outcome=a.outcome, error=a.error,
                   traceback=a.traceback)


class JobSummary(BaseModel):
    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int | None
    key: str | None
    tenant: str | None
    concurrency_key: str | None
    lease_owner: str | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, j: Job) -> JobSummary:
        return cls(id=j.id, kind=j.kind, queue=j.queue, state=j.state, priority=j.priority,
                   run_at=j.run_at, attempt=j.attempt, max_attempts=j.max_attempts,
                   key=j.unique_key, tenant=j.tenant, concurrency_key=j.concurrency_key,
                   lease_owner=j.lease_owner,
                   last_error=j.last_error, created_at=j.created_at,
                   finished_at=j.finished_at)


def payload_text(payload: Any) -> str:
    """The payload as indented JSON text, every number exactly as stored: a browser's
    JSON.parse rounds integers past 2**53, so the dashboard shows this instead."""
    return json.dumps(payload, indent=2, ensure_ascii=False)


class JobOut(JobSummary):
    payload: Any
    payload_text: str = Field(description="the payload as indented JSON text, numbers exact "
                                          "(JavaScript's JSON.parse rounds past 2**53)")
    timeout_seconds: float | None
    lease_expires_at: datetime | None
    dispatched_at: datetime | None
    updated_at: datetime
    started_at: datetime | None

    @classmethod
    def of(cls, j: Job) -> JobOut:
        return cls(**JobSummary.of(j).model_dump(), payload=j.payload,
                   payload_text=payload_text(j.payload),
                   timeout_seconds=j.timeout_seconds, lease_expires_at=j.lease_expires_at,
                   dispatched_at=j.dispatched_at, updated_at=j.updated_at,
                   started_at=j.started_at)


class EnqueuedOut(JobOut):
    """The answer to an enqueue: the job, and whether this request made it."""

    created: bool = Field(description="False when an existing job with the key was returned")

    @classmethod
    def of(cls, j: Job) -> EnqueuedOut:
        return cls(**JobOut.of(j).model_dump(), created=j.created)


class ExplanationOut(BaseModel):
    job_id: int
    state: JobState
    summary: str
    details: list[str]
    next_step: str
    can_retry: bool
    can_cancel: bool
    text: str

    @classmethod
    def of(cls, e: Explanation) -> ExplanationOut:
        return cls(job_id=e.job_id, state=e.state, summary=e.summary, details=e.details,
                   next_step=e.next_step, can_retry=e.can_retry, can_cancel=e.can_cancel,
                   text=e.text())


class JobDetail(BaseModel):
    job: JobOut
    attempts: list[AttemptOut]
    explanation: ExplanationOut


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next_cursor: int | None = Field(description="pass as before_id for the next page")


class FilterIn(StrictIn):
    """Which jobs a bulk action applies to; empty fields do not filter."""

    # Enum values arrive as JSON strings, which strict mode would refuse.
    state: list[Annotated[JobState, Field(strict=False)]] = Field(default_factory=list)
    kind: Kind | None = None
    queue: Queue | None = None
    tenant: Tenant | None = None
    key: Key | None = None
    created_after: IsoDateTime | None = None
    created_before: IsoDateTime | None = None

    def to_filter(self) -> JobFilter:
        return JobFilter.of(
            states=list(self.state), kind=self.kind, queue=self.queue, tenant=self.tenant,
            key=self.key, created_after=self.created_after, created_before=self.created_before)


class BulkIn(StrictIn):
    filter: FilterIn = Field(default_factory=FilterIn)
    dry_run: bool = Field(default=True, description="only count; the default, for safety")
    up_to_id: JobIdIn | None = Field(
        default=None, description="from the dry run: leave out jobs created after it")
    all: bool = Field(default=False,
                      description="required to act on every job when the filter is empty")


class BulkOut(BaseModel):
    action: str
    dry_run: bool
    count: int = Field(description="jobs that would change (dry run) or changed")
    more: bool = Field(default=False, description="dry run: more than `count` jobs match "
                                                  "(counting stops at 100,000)")
    up_to_id: int | None
    description: str


class QueueStatsOut(BaseModel):
    queue: str
    kind: str
    due: int
    dispatched: int
    running: int
    future: int
    depth: int
    oldest_due_age_seconds: float = Field(description="always exact")
    estimated: bool = Field(description="some counts are estimates: a state's range past "
                                        "10,000 jobs is estimated from statistics")

    @classmethod
    def of(cls, q: QueueKindStats) -> QueueStatsOut:
        return cls(queue=q.queue, kind=q.kind, due=q.due, dispatched=q.dispatched,
                   running=q.running, future=q.future, depth=q.depth,
                   oldest_due_age_seconds=q.oldest_due_age_seconds, estimated=q.estimated)


class WorkerOut(BaseModel):
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    heartbeat_age_seconds: float
    status: str

    @classmethod
    def of(cls, w: WorkerInfo) -> WorkerOut:
        return cls(**w.__dict__)


class BucketOut(BaseModel):
    start: datetime
    outcomes: dict[str, int]
    succeeded: int
    start_lag_p50: float | None
    start_lag_p95: float | None
    run_p50: float | None
    run_p95: float | None


class TenantOut(BaseModel):
    tenant: str | None = Field(description="null: the jobs enqueued without a tenant")
    weight: int = Field(description="share of each dispatch batch against the others' (1)")
    due: int = Field(description="due, waiting for their turn at a timer")
    dispatched: int
    running: int
    future: int
    oldest_due_age_seconds: float
    estimated: bool = Field(description="due, future and the oldest age come from a sample "
                                        "(more than 10,000 jobs wait in all)")

    @classmethod
    def of(cls, t: TenantStats) -> TenantOut:
        return cls(tenant=t.tenant or None, weight=t.weight, due=t.due,
                   dispatched=t.dispatched, running=t.running, future=t.future,
                   oldest_due_age_seconds=t.oldest_due_age_seconds, estimated=t.estimated)


class LimitOut(BaseModel):
    scope: str = Field(description="kind, tenant, or kind_key (each concurrency key of a "
                                   "kind)")
    key: str | None = Field(description="the kind or tenant; null: jobs without a tenant")
    max_running: int | None = Field(description="jobs dispatched or running at once "
                                                "(kind_key: per key)")
    in_flight: int | None = Field(description="slots held now: jobs dispatched or running, "
                                              "and lingering handlers (kind_key: of all "
                                              "its keys)")
    keys_at_limit: int | None = Field(default=None,
                                      description="kind_key: keys with max_running in flight")
    lingering: int = Field(default=0, description="of in_flight, handlers still running for "
                                                  "jobs that left their worker (cancelled, "
                                                  "or stuck past their deadline)")
    rate_per_second: float | None
    burst: int | None
    tokens: float | None
    seconds_to_next_token: float | None
    waiting: int = Field(description="due jobs waiting in Postgres")
    waiting_more: bool = Field(description="more than `waiting` wait: the count stops at "
                                           "10,000")

    @classmethod
    def of(cls, limit: LimitInfo) -> LimitOut:
        key = None if limit.scope == "tenant" and not limit.key else limit.key
        return cls(scope=limit.scope, key=key, max_running=limit.max_running,
                   in_flight=limit.in_flight, rate_per_second=limit.rate_per_second,
                   burst=limit.burst, tokens=limit.tokens,
                   seconds_to_next_token=limit.seconds_to_next_token, waiting=limit.waiting,
                   waiting_more=limit.waiting_more, keys_at_limit=limit.keys_at_limit,
                   lingering=limit.lingering)


class OverviewOut(BaseModel):
    now: datetime
    totals: dict[str, int] = Field(description="jobs per state")
    by_kind: dict[str, dict[str, int]] = Field(description="kind -> state -> jobs")
    estimated: list[str] = Field(description="states whose counts include estimates "
                                             "(history partitions past 20,000 rows, and "
                                             "unfinished (queue, kind, state) ranges past "
                                             "10,000, are estimated from statistics)")
    queues: list[QueueStatsOut]
    tenants: list[TenantOut] = Field(description="busiest first; tenant null: no tenant")
    limits: list[LimitOut]
    workers: list[WorkerOut]
    timeline: list[BucketOut] = Field(description="last 10 minutes in 10 s buckets")


class MeOut(BaseModel):
    role: str
    csrf_token: str | None = Field(description="send as X-CSRF-Token on state changes "
                                   "made with the session cookie")
