"""Operator reads and bulk actions over jobs, for the dashboard and the CLI, on the
`OperatorStore`: a page of jobs, a bulk action's dry run and the action itself in
batches, and the throughput/latency timeline of the live page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from shared.core import validation
from shared.core.errors import DatabaseError, InvalidInput
from shared.core.filters import DEFAULT_PAGE_SIZE, JobFilter, action_states, page_size
from shared.core.reports import Bucket, BulkPlan, Page
from shared.core.states import JobState
from shared.store.job_store import JobStore
from shared.store.operator_store import OperatorStore

BULK_BATCH_SIZE = 1000
"""Rows changed per transaction by a bulk action: short locks, steady progress."""
BULK_COUNT_CAP = 100_000
"""A dry run counts this many matching jobs at most, then says "more than"."""


def list_jobs(store: OperatorStore, where: JobFilter, *, limit: int = DEFAULT_PAGE_SIZE,
              before_id: int | None = None) -> Page:
    """Jobs matching the filter, newest first, `limit` at most, older than `before_id`."""
    page_size(limit)
    if before_id is not None:
        validation.job_id(before_id)
    rows = store.list_jobs(where, limit=limit + 1, before_id=before_id)  # +1: is there more?
    jobs = rows[:limit]
    return Page(jobs, jobs[-1].id if len(rows) > limit and jobs else None)


def plan_bulk(store: OperatorStore, action: str, where: JobFilter, *,
              cap: int | None = None) -> BulkPlan:
    """The dry run: how many jobs `action` would change (counted up to `cap`; past it the
    plan says "more than"). Retry applies to dead and cancelled jobs, cancel to unfinished
    ones, whatever else the filter says; a filter naming only states the action cannot
    apply to is refused (`InvalidInput`), rather than counted as 0."""
    states = _applicable(action, where)
    count, more, max_id = store.count_matching(where, states, cap=cap or BULK_COUNT_CAP)
    # Said with the states it applies to: "retry --all" is every dead or cancelled job,
    # not "all jobs".
    acted_on = tuple(s for s in where.states if s in states) or states
    return BulkPlan(action, count, max_id, replace(where, states=acted_on).describe(), more)


def _applicable(action: str, where: JobFilter) -> tuple[JobState, ...]:
    """The states `action` applies to; `InvalidInput` if the filter names only others."""
    allowed = action_states(action)
    if where.states and not set(where.states) & set(allowed):
        names = [s.value for s in allowed]
        raise InvalidInput(
            f"{action} applies to {', '.join(names[:-1])} and {names[-1]} jobs only; "
            f"the filter asks for {', '.join(s.value for s in where.states)}")
    return allowed


def run_bulk(store: OperatorStore, action: str, where: JobFilter, *,
             up_to_id: int | None = None, batch_size: int = BULK_BATCH_SIZE,
             committed: Callable[[int], None] | None = None) -> int:
    """Apply `action` to every matching job, `batch_size` rows per transaction, in id
    order; returns how many changed. Each batch re-checks the state under the row lock, so
    a job that finished or was claimed meanwhile is left alone. `committed(total)` is
    called after each batch commits: a caller that meets an error still knows (and can
    log) what was done; the error's message says it too."""
    states = _applicable(action, where)
    if up_to_id is not None:
        validation.job_id(up_to_id)
    after, total = 0, 0
    while True:
        try:
            with store.transaction() as tx:
                ids = tx.bulk_batch(action, where, states, after=after, up_to_id=up_to_id,
                                    batch_size=batch_size)
                if ids and action == "retry":
                    tx.sibling(JobStore).notify_due()
        except DatabaseError as exc:
            if not total:
                raise
            # The batches before committed: an error that says only "database unavailable"
            # would pass for nothing done. Same type, so callers answer it as before.
            done = "retried" if action == "retry" else "cancelled"
            raise type(exc)(f"{exc}; {total} job(s) were {done} before it (each batch of "
                            f"{batch_size} commits on its own): run the same action again "
                            "to finish", exc.sqlstate) from exc
        if not ids:
            return total
        total += len(ids)
        after = max(ids)
        if committed is not None:
            committed(total)


def timeline(store: OperatorStore, *, now: datetime, window_seconds: int = 600,
             bucket_seconds: int = 10) -> list[Bucket]:
    """Throughput and latency of the last `window_seconds`, in `bucket_seconds` buckets,
    oldest first; empty buckets included so charts keep their time axis."""
    if not 1 <= bucket_seconds <= window_seconds <= 86400:
        raise InvalidInput("need 1 <= bucket_seconds <= window_seconds <= 86400")
    count = window_seconds // bucket_seconds
    since = now - timedelta(seconds=count * bucket_seconds)
    outcomes: dict[int, dict[str, int]] = {}
    for b, outcome, n in store.throughput(since, now, bucket_seconds):
        outcomes.setdefault(b, {})[outcome] = n
    latency = store.latency(since, now, bucket_seconds)
    out = []
    for b in range(count):
        lat = latency.get(b, (0, None, None, None, None))
        out.append(Bucket(since + timedelta(seconds=b * bucket_seconds), outcomes.get(b, {}),
                          int(lat[0]), lat[1], lat[2], lat[3], lat[4]))
    return out
