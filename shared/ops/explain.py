"""Why is this job (not) running right now? One answer in plain words, for the API, the
dashboard's job page and `tock show`.

`explain()` is a pure function of the job, the time and what is known about the workers,
so every case is testable with a pinned `now`; `gather()` loads that context from
Postgres in one short transaction.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from shared.core.iso_time import formatted
from shared.core.jobs import Attempt, Job
from shared.core.limits import rate_text
from shared.core.reports import LimitInfo, WorkerInfo
from shared.core.schedules import slot_of
from shared.core.states import AttemptOutcome, JobState
from shared.store.flow_store import FlowStore
from shared.store.operator_store import DUE_AHEAD_CAP, OperatorStore

DEFAULT_STALE_AFTER_SECONDS = 30.0
"""A worker silent this long counts as stale whatever its lease; it is stale sooner, as
soon as its own lease has expired (`OperatorStore.workers`)."""


@dataclass(frozen=True)
class Explanation:
    """`summary` is one sentence; `details` add facts; `next_step` says what happens next
    or what an operator can do."""

    job_id: int
    state: JobState
    summary: str
    details: list[str] = field(default_factory=list)
    next_step: str = ""
    can_retry: bool = False
    can_cancel: bool = False

    def text(self) -> str:
        lines = [self.summary, *(f"- {d}" for d in self.details)]
        if self.next_step:
            lines.append(f"Next: {self.next_step}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Context:
    """What the explanation needs beyond the job row."""

    now: datetime
    lease_worker: WorkerInfo | None = None
    queue_workers: int = 0
    """Live (heartbeating) consumers that receive from the job's queue."""
    queue_slots: tuple[int, int] = (0, 0)
    """Their handler slots: (busy, all), as their last heartbeats reported them."""
    due_ahead: int | None = None
    schedule: tuple[str, bool, bool] | None = None
    """The recurring schedule that made this job: (name, paused now, deleted since)."""
    held_by: LimitInfo | None = None
    """The limit (of its kind, its tenant or its concurrency key) that has no room for it
    now, if it is due."""
    in_sqs: dict[str, int] = field(default_factory=dict)
    """Jobs of its kind sent to SQS and not yet claimed, by queue, if it is due (up to
    IN_SQS_CAP in all)."""
    attempt_worker: WorkerInfo | None = None
    """The worker of the job's last finished attempt, if it reported in the last hour:
    whether its lease outlasted that attempt tells a stuck or abandoned handler from a
    worker that stopped heartbeating."""


IN_SQS_CAP = 100_000
"""Jobs in SQS counted for an explanation, at most."""


def _in_sqs_detail(job: Job, ctx: Context) -> list[str]:
    """Why a due job may wait although no limit holds it: its kind's dispatch window on
    its queue."""
    here = ctx.in_sqs.get(job.queue, 0)
    if not here:
        return []
    more = "+" if sum(ctx.in_sqs.values()) >= IN_SQS_CAP else ""
    return [f"{here}{more} job(s) of kind {job.kind} are in SQS on queue {job.queue!r} "
            "waiting for a consumer. A timer keeps at most its dispatch window "
            "(TOCK_DISPATCH_WINDOW) of a kind on each queue, and of each tenant about what "
            "consumers claim in TOCK_DISPATCH_WINDOW_SECONDS, and sends more as consumers "
            "claim them, so a backlog waits here, in priority and fair-share order."]


def duration(seconds: float) -> str:
    """'120 ms', '3 s', '4 min 5 s', '2 h 1 min', '3 d 4 h': short and exact enough for
    people."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def when(at: datetime, now: datetime) -> str:
    """'15:04:05 UTC on 2026-12-02 (in 3 min)' / '(2 s ago)'."""
    stamp = formatted(at.astimezone(now.tzinfo), "%Y-%m-%d %H:%M:%S %Z").strip()
    delta = (at - now).total_seconds()
    rel = f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"
    return f"{stamp} ({rel})"


def _last(attempts: tuple[Attempt, ...]) -> Attempt | None:
    return attempts[-1] if attempts else None


def _attempts_of(job: Job) -> str:
    return f"{job.attempt} of {job.max_attempts}" if job.max_attempts else f"{job.attempt}"


def explain(job: Job, ctx: Context) -> Explanation:
    """The plain-words story of where `job` is now and why."""
    refused = job.dispatch_failures and job.state in (JobState.SCHEDULED, JobState.RETRYING)
    found = _refused(job, ctx) if refused else _BY_STATE[job.state](job, ctx)
    if ctx.schedule is not None:
        name, paused, deleted = ctx.schedule
        slot = slot_of(job.unique_key)
        made = f"It was made by recurring schedule {name!r}" + (
            f" for its slot {when(slot, ctx.now)}" if slot else "")
        if paused:
            made += ", which is paused: the schedule makes no further jobs until it is resumed"
        elif deleted:
            made += ", since deleted"
        found = replace(found, details=[*found.details, made + "."])
    return found


def _refused(job: Job, ctx: Context) -> Explanation:
    """SQS would not take the job's message (its queue missing, throttled, unreachable)."""
    now = ctx.now
    again = (f"The timer tries again at {when(job.run_at, now)}" if job.run_at > now
             else "The timer tries again on its next pass")
    return Explanation(
        job.id, job.state,
        f"SQS refused to take it {job.dispatch_failures} time(s) in a row: "
        f"{job.last_error or 'no error recorded'}.",
        [f"Priority {job.priority} on queue {job.queue}.",
         "Check that the SQS queue exists (TOCK_CREATE_QUEUES=1 recreates a missing one) and "
         "that the timer may send to it."],
        f"{again}, with a backoff of its own (other jobs are not held up).", can_cancel=True)


def _scheduled(job: Job, ctx: Context) -> Explanation:
    now = ctx.now
    details = [f"Priority {job.priority} on queue {job.queue}."]
    if job.run_at > now:
        return Explanation(
            job.id, job.state, f"Not due until {when(job.run_at, now)}.", details,
            "A timer dispatches it to SQS once it is due.", can_cancel=True)
    if ctx.held_by is not None:
        return _held(job, ctx, ctx.held_by, details)
    ahead = ""
    if ctx.due_ahead:
        more = "+" if ctx.due_ahead >= DUE_AHEAD_CAP else ""
        ahead = f" {ctx.due_ahead}{more} due job(s) go before it (higher priority or older)."
    details += _in_sqs_detail(job, ctx)
    waiting_here = ctx.in_sqs.get(job.queue, 0)
    if waiting_here and not ctx.queue_workers:
        # The window holds the kind because nothing takes its jobs from SQS: the timer
        # is not the one to check.
        return Explanation(
            job.id, job.state,
            f"Due since {when(job.run_at, now)} and held in Postgres: {waiting_here} job(s) "
            f"of kind {job.kind} already wait in SQS on queue {job.queue!r}, and no live "
            "consumer receives from it, so the timers send no more of them until one "
            f"does.{ahead}",
            details, f"Start a consumer for queue {job.queue!r} (tock consumer --tasks ... "
            f"--queues {job.queue}); the timers send the rest as it claims them.",
            can_cancel=True)
    details.append("If this lasts, check that a timer is running (GET /healthz on its "
                   "health port) and that it can reach Postgres and SQS.")
    return Explanation(
        job.id, job.state,
        f"Due since {when(job.run_at, now)} and waiting for a timer to dispatch it.{ahead}",
        details, "A timer sends it to SQS on its next pass.", can_cancel=True)


def limit_name(limit: LimitInfo) -> str:
    """'kind email', 'tenant acme', 'jobs without a tenant', "kind sync key 'acct-7'"."""
    if limit.scope == "tenant" and not limit.key:
        return "jobs without a tenant"
    if limit.scope == "kind_key":
        return (f"kind {limit.key} key {limit.concurrency_key!r}"
                if limit.concurrency_key is not None else f"each key of kind {limit.key}")
    return f"{limit.scope} {limit.key}"


def has_no_room(limit: LimitInfo) -> bool:
    """Whether the limit lets nothing more be dispatched now."""
    slots = limit.max_running is not None and (limit.in_flight or 0) >= limit.max_running
    return slots or (limit.tokens is not None and limit.tokens < 1)


def is_paused(limit: LimitInfo) -> bool:
    """max_running 0: nothing is dispatched, whatever finishes, until the limit changes."""
    return limit.max_running == 0


def _limit_args(limit: LimitInfo) -> str:
    """SCOPE KEY as `tock limits set/remove` takes them."""
    if limit.scope == "tenant":
        return f"tenant {shlex.quote(limit.key)}" if limit.key else "tenant --no-tenant"
    return f"{limit.scope} {limit.key}"  # a kind: letters, digits, _ . : - only


def _paused(job: Job, ctx: Context, limit: LimitInfo) -> tuple[str, str]:
    """(summary, next step) for a limit with max_running 0."""
    target = {"kind": f"kind {limit.key} is",
              "kind_key": f"every concurrency key of kind {limit.key} is"}.get(
        limit.scope, "jobs without a tenant are" if not limit.key else f"tenant {limit.key} is")
    summary = (f"Due since {when(job.run_at, ctx.now)}, but {target} paused by its limit "
               "(max_running 0): nothing of it is dispatched until the limit is raised or "
               "removed.")
    args = _limit_args(limit)
    # `limits set` replaces the whole limit: keep its rate, if it has one.
    rate = (f" --rate {limit.rate_per_second!r} --burst {limit.burst}"
            if limit.rate_per_second is not None else "")
    step = (f"Resume it with `tock limits set {args} --max-running N{rate}` (N > 0) or "
            f"`tock limits remove {args}` (or the dashboard's Limits panel); a timer then "
            "dispatches it on its next pass.")
    return summary, step


def _held(job: Job, ctx: Context, limit: LimitInfo, details: list[str]) -> Explanation:
    """Due, but its kind or tenant is at its limit: it waits in Postgres, not in SQS."""
    name = limit_name(limit)
    if is_paused(limit):
        summary, step = _paused(job, ctx, limit)
    elif limit.max_running is not None and (limit.in_flight or 0) >= limit.max_running:
        summary = (f"Due since {when(job.run_at, ctx.now)} and waiting for a concurrency "
                   f"slot of {name} ({limit.in_flight}/{limit.max_running} running).")
        step = ("A timer dispatches it when a job of that limit finishes (an expired lease "
                "frees its slot too); `tock limits` shows the limits.")
        details.append("A job holds its slot from its dispatch to its outcome: the running "
                       "count includes jobs sent to SQS that no consumer has started yet.")
        if limit.lingering:
            details.append(
                f"{limit.lingering} of those slot(s) are held by handlers still running "
                "for jobs that left their worker (cancelled, or stuck past their deadline "
                "and recovered elsewhere): each is freed when its handler returns, or when "
                "its worker stops.")
    else:
        rate = limit.rate_per_second or 0.0
        wait = limit.seconds_to_next_token or 0.0
        summary = (f"Due since {when(job.run_at, ctx.now)} and waiting for a rate token of "
                   f"{name} (limit {rate_text(rate)}; the next token in {duration(wait)}).")
        step = "A timer dispatches it as tokens come, oldest first."
    if limit.waiting > 1:
        details.append(f"{limit.waiting_shown} due job(s) of {name} are waiting for it.")
    return Explanation(job.id, job.state, summary, details, step, can_cancel=True)


def _retrying(job: Job, ctx: Context) -> Explanation:
    now = ctx.now
    last = _last(job.attempts)
    error = (last.error if last and last.error else job.last_error) or "no error recorded"
    failed = f"attempt {_attempts_of(job)} failed: {error}"
    if last and last.outcome is AttemptOutcome.LEASE_EXPIRED:
        failed = f"attempt {_attempts_of(job)} was lost{_lost(job, last, ctx)}"
    details = [f"Priority {job.priority} on queue {job.queue}."]
    if job.run_at > now:
        return Explanation(
            job.id, job.state, f"In backoff until {when(job.run_at, now)} after {failed}.",
            details, f"Attempt {job.attempt + 1} is dispatched once the backoff ends.",
            can_cancel=True)
    if ctx.held_by is not None:
        return _held(job, ctx, ctx.held_by, details)
    details += _in_sqs_detail(job, ctx)
    return Explanation(
        job.id, job.state,
        f"Backoff ended {when(job.run_at, now)}; waiting for a timer to dispatch attempt "
        f"{job.attempt + 1} (after {failed}).",
        details, "A timer sends it to SQS on its next pass.", can_cancel=True)


def _dispatched(job: Job, ctx: Context) -> Explanation:
    now = ctx.now
    at = job.dispatched_at or job.updated_at
    details = [f"Due at {when(job.run_at, now)}."]
    if ctx.queue_workers == 0:
        details.append(f"No live consumer is receiving from queue {job.queue!r}: start one "
                       f"with `python -m consumer --tasks ... --queues {job.queue}`.")
    else:
        busy, slots = ctx.queue_slots
        full = (f", but every one of their handler slots was busy at their last heartbeat "
                f"({busy}/{slots}): it waits for one to free (a handler stuck past its "
                "deadline holds its slot until it returns; `tock workers`)"
                if slots and busy >= slots else "")
        details.append(f"{ctx.queue_workers} live consumer(s) receive from queue "
                       f"{job.queue!r}{full}.")
    return Explanation(
        job.id, job.state,
        f"Dispatched to SQS queue {job.queue!r} at {when(at, now)} and waiting for a "
        "consumer to claim it.",
        details,
        "A consumer claims it; if its message is lost (the queue holds fewer messages than "
        "it should), the timer sends it again after its dispatch timeout.", can_cancel=True)


def _deadline(job: Job) -> datetime | None:
    """When the running attempt's timeout passes (its claim plus the job's timeout)."""
    if job.started_at is None or not job.timeout_seconds:
        return None
    return job.started_at + timedelta(seconds=job.timeout_seconds)


def _stuck(job: Job) -> bool:
    """A detached job was let go because its handler ran past its deadline (by more than
    a lease) and did not return, rather than given up before it (`Abandon`, an outcome
    Postgres refused): its own lease, set one lease after the detachment, then ends past
    the deadline."""
    deadline = _deadline(job)
    return (deadline is not None and job.lease_expires_at is not None
            and job.lease_expires_at > deadline)


def _running(job: Job, ctx: Context) -> Explanation:
    now = ctx.now
    owner = job.lease_owner or "an unknown worker"
    details = []
    if job.started_at:
        details.append(f"Started {when(job.started_at, now)}.")
    if job.timeout_seconds:
        details.append(f"Times out after {duration(job.timeout_seconds)}.")
    w = ctx.lease_worker
    if w is not None and w.status != "alive":
        lapsed = (f", its lease expired {duration((now - w.lease_expires_at).total_seconds())}"
                  " ago" if w.lease_expires_at is not None and w.lease_expires_at < now
                  else "")
        details.append(f"Worker {w.id} is {w.status}: last heartbeat "
                       f"{duration(w.heartbeat_age_seconds)} ago{lapsed}.")
    expires = job.lease_expires_at
    if job.lease_detached:
        return _detached(job, ctx, details)
    if w is not None and w.lease_expires_at is not None:
        expires = max(expires, w.lease_expires_at) if expires else w.lease_expires_at
    if expires is not None and expires < now:
        return Explanation(
            job.id, job.state,
            f"Was leased by worker {owner} (attempt {_attempts_of(job)}), but the lease "
            f"expired {when(expires, now)}: the worker stopped heartbeating.",
            details, "A timer rescues it on its next pass: it retries, or goes dead if no "
            "attempts are left.", can_cancel=True)
    deadline = _deadline(job)
    if deadline is not None and deadline < now:
        details.append(
            f"Its timeout passed {duration((now - deadline).total_seconds())} ago: the "
            "handler has been told to stop (ctx.cancelled). A handler thread that ignores "
            "that for more than a lease is left behind and its job recovered elsewhere.")
    until = f" until {when(expires, now)}" if expires else ""
    return Explanation(
        job.id, job.state,
        f"Running: leased by worker {owner}{until} (attempt {_attempts_of(job)}).",
        details, "The worker renews the lease while the handler runs, then records the "
        "outcome.", can_cancel=True)


def _detached(job: Job, ctx: Context, details: list[str]) -> Explanation:
    """A running job its worker let go: its lease no longer follows the worker's and
    expires on its own, while the worker lives on (and keeps its other jobs)."""
    now = ctx.now
    owner = job.lease_owner or "an unknown worker"
    expires = job.lease_expires_at
    w = ctx.lease_worker
    alive = w is not None and w.status == "alive"
    if w is not None and alive:
        details.append(f"Worker {w.id} is alive (last heartbeat "
                       f"{duration(w.heartbeat_age_seconds)} ago): only this job was let "
                       "go; its other jobs keep their leases.")
    if _stuck(job):
        timeout = duration(job.timeout_seconds or 0.0)
        details.append(
            "Its handler is stuck past its deadline: it ignored the timeout for more than a "
            "lease, so the job no longer follows its worker's lease and is recovered "
            "elsewhere once its own lease expires. On the worker its thread is still busy "
            "and keeps its handler slot until the handler returns (a thread cannot be "
            "killed; see the tock_stuck_handlers gauge). Handlers run in processes "
            "(--isolation process, or a kind's @task(..., isolation=\"process\")) are "
            "killed instead.")
        if expires is not None and expires < now:
            summary = (f"Was leased by worker {owner} (attempt {_attempts_of(job)}), but its "
                       f"handler ran past its {timeout} timeout and did not return, so the "
                       f"worker{' (still alive)' if alive else ''} let the job go; its own "
                       f"lease expired {when(expires, now)}.")
        else:
            until = f" until {when(expires, now)}" if expires else ""
            summary = (f"Stuck: its handler has run past its {timeout} timeout on worker "
                       f"{owner} and not returned (attempt {_attempts_of(job)}), so the "
                       f"worker let the job go: it is leased on its own{until}.")
    else:
        details.append(
            "Its worker gave it up (its handler raised Abandon, or Postgres refused its "
            "outcome), so the job no longer follows the worker's lease and is recovered "
            "elsewhere once its own lease expires.")
        if expires is not None and expires < now:
            summary = (f"Was leased by worker {owner} (attempt {_attempts_of(job)}), but the "
                       f"worker{' (still alive)' if alive else ''} let the job go; its own "
                       f"lease expired {when(expires, now)}.")
        else:
            until = f" until {when(expires, now)}" if expires else ""
            summary = (f"Let go by worker {owner} (attempt {_attempts_of(job)}): the job is "
                       f"leased on its own{until}, no longer by the worker's heartbeat.")
    step = ("A timer rescues it on its next pass: it retries, or goes dead if no attempts "
            "are left." if expires is not None and expires < now else
            "A timer recovers it once its own lease expires: it retries, or goes dead if no "
            "attempts are left.")
    return Explanation(job.id, job.state, summary, details, step, can_cancel=True)


def _succeeded(job: Job, ctx: Context) -> Explanation:
    details = []
    if job.started_at and job.finished_at:
        ran = duration((job.finished_at - job.started_at).total_seconds())
        if job.created_at > job.run_at:  # enqueued with its time already past
            since = f"{duration((job.started_at - job.created_at).total_seconds())} after " \
                    "it was enqueued (its time was already past then)"
        else:
            since = f"{duration((job.started_at - job.run_at).total_seconds())} after it " \
                    "was due"
        details.append(f"Ran for {ran} and started {since}.")
    at = when(job.finished_at, ctx.now) if job.finished_at else "an unknown time"
    return Explanation(job.id, job.state,
                       f"Succeeded at {at} on attempt {_attempts_of(job)}.", details)


def _dead(job: Job, ctx: Context) -> Explanation:
    last = _last(job.attempts)
    error = (last.error if last and last.error else job.last_error) or "no error recorded"
    at = when(job.finished_at, ctx.now) if job.finished_at else "an unknown time"
    if last and last.outcome is AttemptOutcome.PERMANENT:
        why = f"its handler raised a permanent error: {error}"
    elif last and last.outcome is AttemptOutcome.NO_HANDLER:
        why = f"no consumer has a handler for kind {job.kind!r}: {error}"
    elif last and last.outcome is AttemptOutcome.LEASE_EXPIRED:
        why = f"its last attempt ({_attempts_of(job)}) was lost{_lost(job, last, ctx)}"
    else:
        why = f"attempt {_attempts_of(job)} failed and no attempts are left: {error}"
    return Explanation(job.id, job.state, f"Dead since {at} because {why}.",
                       [f"{len(job.attempts)} attempt(s) recorded."],
                       "Retry it to run it again with a fresh attempt count.", can_retry=True)


def _cancelled(job: Job, ctx: Context) -> Explanation:
    at = when(job.finished_at, ctx.now) if job.finished_at else "an unknown time"
    last = _last(job.attempts)
    details = []
    if last and last.outcome is AttemptOutcome.CANCELLED:
        details.append(f"Attempt {last.attempt} was running on {last.worker or 'a worker'}; "
                       "its handler was asked to stop (ctx.cancelled), and whatever it "
                       "returns is discarded.")
    return Explanation(job.id, job.state, f"Cancelled at {at} by an operator or the API.",
                       details, "Retry it to run it again.", can_retry=True)


def _lost(job: Job, last: Attempt, ctx: Context) -> str:
    """How an attempt whose lease expired was lost, to follow "was lost". The timer
    rescues a job that follows its worker's lease only once that lease has expired too: a
    worker whose lease outlasted the rescue did not stop heartbeating, it let the job go
    (a detached job expires on its own): its handler ran past its deadline and did not
    return, or (within it) raised Abandon or had its outcome refused."""
    who = f"worker {last.worker}" if last.worker else "its worker"
    w = ctx.attempt_worker
    if w is not None and w.id != last.worker:
        w = None
    over = (job.timeout_seconds is not None and last.started_at is not None and
            (last.finished_at - last.started_at).total_seconds() > job.timeout_seconds)
    timeout = duration(job.timeout_seconds or 0.0)
    kept_beating = (w is not None and w.lease_expires_at is not None
                    and w.lease_expires_at >= last.finished_at)
    if kept_beating and over:
        return (f": its handler ran past its {timeout} timeout and did not return; {who} "
                "kept heartbeating but let the job go, and the timer recovered it when its "
                "own lease expired")
    if kept_beating:
        return (f": {who} let the job go while it kept heartbeating (its handler raised "
                "Abandon or Postgres refused its outcome, unless the worker was cut off from "
                "Postgres for longer than its lease), and the timer recovered it when its "
                "lease expired")
    if over and w is None:
        return (f" when its lease expired after its handler had run past its {timeout} "
                f"timeout: the handler did not return, or {who} stopped heartbeating")
    return f" when {who} stopped heartbeating"


_BY_STATE: dict[JobState, Callable[[Job, Context], Explanation]] = {
    JobState.SCHEDULED: _scheduled,
    JobState.RETRYING: _retrying,
    JobState.DISPATCHED: _dispatched,
    JobState.RUNNING: _running,
    JobState.SUCCEEDED: _succeeded,
    JobState.DEAD: _dead,
    JobState.CANCELLED: _cancelled,
}

def gather(store: OperatorStore, job: Job, *,
           stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
           now: datetime | None = None) -> Context:
    """Load what `explain` needs, on the database clock unless `now` is given (tests; run
    it in one transaction)."""
    now = now if now is not None else store.database_now()
    live = store.workers(stale_after_seconds=stale_after_seconds, now=now)
    lease_worker = next((w for w in live if w.id == job.lease_owner), None)
    last = _last(job.attempts)
    attempt_worker = next((w for w in live if last is not None and w.id == last.worker), None)
    serving = [w for w in live if w.status == "alive" and job.queue in w.queues]
    queue_workers = len(serving)
    queue_slots = (sum(min(w.in_flight, w.concurrency) for w in serving),
                   sum(w.concurrency for w in serving))
    ahead = None
    held_by = None
    in_sqs: dict[str, int] = {}
    if job.state in (JobState.SCHEDULED, JobState.RETRYING) and job.run_at <= now:
        ahead = store.due_ahead(job, now)
        flow = store.sibling(FlowStore)
        limits = [*flow.limits("kind", job.kind, now=now),
                  *flow.limits("tenant", job.tenant or "", now=now)]
        if job.concurrency_key is not None:
            per_key = flow.key_limit(job.kind, job.concurrency_key, now=now)
            limits += [per_key] if per_key is not None else []
        full = [limit for limit in limits if has_no_room(limit)]
        # A paused limit is named first: the others free up on their own, it does not.
        held_by = next((limit for limit in full if is_paused(limit)), None) or next(
            iter(full), None)
        in_sqs = flow.kind_in_sqs(job.kind, IN_SQS_CAP)
    return Context(now, lease_worker, queue_workers, queue_slots, ahead,
                   store.schedule_of(job.id), held_by, in_sqs, attempt_worker)
