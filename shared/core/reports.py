"""What operators read: pages of jobs, bulk-action plans, queue statistics, workers and
the throughput timeline. Plain data, built by `shared.store.OperatorStore`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from shared.core.jobs import Job
from shared.core.limits import rate_text


@dataclass(frozen=True)
class Page:
    """One page of jobs, newest first. `next_cursor` is passed back as `before_id` for the
    next page; None on the last page."""

    jobs: list[Job]
    next_cursor: int | None


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch now: `count` jobs, none newer than `up_to_id`.
    Passing `up_to_id` back to the action keeps jobs created after the dry run out."""

    action: str
    count: int
    up_to_id: int | None
    description: str
    more: bool = False
    """More than `count` jobs match: the dry run stopped counting there."""

    @property
    def shown(self) -> str:
        """The count for people: "37", or "more than 100,000"."""
        return f"more than {self.count:,}" if self.more else str(self.count)


@dataclass(frozen=True)
class QueueKindStats:
    """Unfinished work of one kind on one queue, as of `now`."""

    queue: str
    kind: str
    due: int
    """scheduled/retrying with run_at passed: waiting for a timer."""
    dispatched: int
    """in SQS, waiting for a consumer."""
    running: int
    future: int
    """scheduled/retrying, not yet due."""
    oldest_due_age_seconds: float
    """How long the oldest due-but-not-started job (due or dispatched) has waited; 0 if none.
    Always exact."""
    estimated: bool = False
    """Some of the counts are estimates: past a bound, a state's range is not counted."""

    @property
    def depth(self) -> int:
        """Jobs that are due and not yet running: the backlog consumers should drain."""
        return self.due + self.dispatched


@dataclass(frozen=True)
class TenantStats:
    """Unfinished work of one tenant ('' for jobs without one) and its fair-share weight."""

    tenant: str
    weight: int
    due: int
    """scheduled/retrying with run_at passed: waiting for its turn at a timer."""
    dispatched: int
    running: int
    future: int
    oldest_due_age_seconds: float
    """How long its oldest due job (not yet dispatched) has waited; 0 if none."""
    estimated: bool = False
    """due, future and the oldest age come from a sample of a big backlog (scaled), not a
    count; dispatched and running are always counted."""


@dataclass(frozen=True)
class Unfinished:
    """Unfinished work as of one instant: per queue and kind, and per (state, kind)."""

    queues: list[QueueKindStats]
    counts: dict[tuple[str, str], int]
    """(state, kind) -> jobs, every unfinished state with jobs."""
    estimated: set[str]
    """States whose counts include an estimate."""


@dataclass(frozen=True)
class LimitInfo:
    """A concurrency and/or rate limit on a kind or a tenant, with its current use."""

    scope: str
    """'kind', 'tenant', or 'kind_key' (a limit on each concurrency key of a kind)."""
    key: str
    """The kind's name, or the tenant ('' for jobs without one)."""
    max_running: int | None
    """Jobs dispatched or running at once, fleet-wide (kind_key: per key); None: no
    concurrency limit."""
    rate_per_second: float | None
    """Dispatches per second (token bucket); None: no rate limit."""
    burst: int | None
    """Tokens the bucket holds at most."""
    in_flight: int | None
    """Slots held now: jobs dispatched or running, and lingering handlers."""
    tokens: float | None
    """Tokens in the bucket now."""
    waiting: int
    """Due jobs waiting in Postgres."""
    keys_at_limit: int | None = None
    """A kind_key limit: concurrency keys with max_running jobs in flight now."""
    concurrency_key: str | None = None
    """A kind_key limit as one key sees it (`explain`): in_flight and waiting are its own."""
    waiting_more: bool = False
    """More than `waiting` jobs wait: the count stops at a bound (UNFINISHED_EXACT_UP_TO)."""
    lingering: int = 0
    """Of `in_flight`, handlers still running for jobs that left their worker (cancelled,
    or stuck past their deadline and recovered elsewhere): their slots are held until
    they return."""

    def no_longer_has(self, before: LimitInfo | None) -> list[str]:
        """What the limit `before`, which this one replaced, had and this one has not: a
        set replaces the whole limit, so a part left out is gone ("max running 5")."""
        if before is None:
            return []
        gone = []
        if before.max_running is not None and self.max_running is None:
            gone.append(f"max running {before.max_running}")
        if before.rate_per_second is not None and self.rate_per_second is None:
            gone.append(f"a rate of {rate_text(before.rate_per_second)}")
        return gone

    @property
    def waiting_shown(self) -> str:
        """The waiting count for people: "37", or "more than 10,000"."""
        return f"more than {self.waiting:,}" if self.waiting_more else str(self.waiting)

    @property
    def seconds_to_next_token(self) -> float | None:
        if self.rate_per_second is None or self.tokens is None:
            return None
        return max(0.0, (1.0 - self.tokens) / self.rate_per_second)


@dataclass(frozen=True)
class Worker:
    """A consumer process as it reports itself at start and on every heartbeat."""

    id: str
    host: str
    pid: int
    queues: list[str]
    kinds: list[str]
    """The kinds it has handlers for."""
    concurrency: int
    in_flight: int
    """Handler slots busy with claimed jobs (at most `concurrency`)."""


@dataclass(frozen=True)
class WorkerInfo(Worker):
    """A consumer process as it last reported itself, with when."""

    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    heartbeat_age_seconds: float
    lease_expires_at: datetime | None = None
    """The lease every job it holds hangs off."""
    status: str = field(default="alive")
    """alive, stale (its lease expired, or no heartbeat for `stale_after_seconds`) or
    stopped."""


@dataclass(frozen=True)
class Bucket:
    """One time bucket of finished work."""

    start: datetime
    outcomes: dict[str, int]
    """Finished attempts by outcome."""
    succeeded: int
    start_lag_p50: float | None
    start_lag_p95: float | None
    """Due-to-start latency (seconds) of jobs that succeeded in the bucket."""
    run_p50: float | None
    run_p95: float | None
