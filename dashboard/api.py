"""The HTTP API under /api: jobs (enqueue, list, get, explain, cancel, retry, bulk by
filter with a dry run), statistics and workers. Reads need any role; changes need the
operator role (and, from a browser session, the CSRF token)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request

from dashboard import models
from dashboard.auth import Principal, current_principal, operator
from dashboard.bodies import StrictJsonRoute
from dashboard.stats import StatsCache, state_totals
from shared.client import Client
from shared.core.errors import DatabaseError, InvalidInput
from shared.core.filters import DEFAULT_PAGE_SIZE, JobFilter
from shared.core.states import JobState
from shared.ops import explain
from shared.ops import jobs as ops_jobs
from shared.runtime.logs import emit
from shared.store.operator_store import OperatorStore

log = logging.getLogger("tock.dashboard")

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": models.ErrorOut, "description": "Invalid input"},
    401: {"model": models.ErrorOut, "description": "Not authenticated"},
    403: {"model": models.ErrorOut, "description": "Forbidden (role or CSRF)"},
    413: {"model": models.ErrorOut,
          "description": "Request body over TOCK_DASHBOARD_MAX_BODY_BYTES"},
    415: {"model": models.ErrorOut,
          "description": "Request body not sent as Content-Type: application/json"},
    503: {"model": models.ErrorOut, "description": "Postgres unavailable"},
}
JOB_ERRORS = {**ERRORS, 404: {"model": models.ErrorOut, "description": "No such job"}}
CHANGE_ERRORS = {**JOB_ERRORS,
                 409: {"model": models.ErrorOut, "description": "Not allowed in this state"}}

router = APIRouter(prefix="/api", responses=ERRORS,
                   route_class=StrictJsonRoute)
Viewer = Annotated[Principal, Depends(current_principal)]
Operator = Annotated[Principal, Depends(operator)]
JobId = Annotated[models.JobIdInUrl, Path(description="job id")]


def _client(request: Request) -> Client:
    c: Client = request.app.state.client
    return c


def _store(request: Request) -> OperatorStore:
    s: OperatorStore = request.app.state.operator_store
    return s


def _stats(request: Request) -> StatsCache:
    s: StatsCache = request.app.state.stats
    return s


def _read(request: Request) -> Iterator[OperatorStore]:
    with _store(request).transaction() as tx:
        yield tx


Read = Annotated[OperatorStore, Depends(_read)]


@router.get("/me", response_model=models.MeOut, summary="Who am I (role, CSRF token)")
def me(who: Viewer) -> models.MeOut:
    return models.MeOut(role=who.role, csrf_token=who.csrf_token)


@router.post("/jobs", status_code=201, response_model=models.EnqueuedOut, summary="Enqueue a job",
             responses=ERRORS)
def enqueue(body: models.EnqueueIn, who: Operator, request: Request) -> models.EnqueuedOut:
    job = _client(request).schedule(
        body.kind, body.payload, at=body.at, delay=body.delay, key=body.key,
        priority=body.priority, queue=body.queue, max_attempts=body.max_attempts,
        timeout=body.timeout, tenant=body.tenant, concurrency_key=body.concurrency_key)
    emit(log, "job_enqueued", job_id=job.id, kind=job.kind, created=job.created,
         via="api", role=who.role)
    return models.EnqueuedOut.of(job)


def _filter(*, state: list[JobState] | None, kind: str | None, queue: str | None,
            tenant: str | None, key: str | None, created_after: datetime | None,
            created_before: datetime | None) -> JobFilter:
    return JobFilter.of(states=state or [], kind=kind, queue=queue, tenant=tenant,
                                    key=key, created_after=created_after,
                                    created_before=created_before)


@router.get("/jobs", response_model=models.JobPage, summary="List jobs, newest first")
def list_jobs(
    *, who: Viewer, store: Read,
    state: Annotated[list[JobState] | None, Query(description="repeatable")] = None,
    kind: Annotated[models.Kind | None, Query()] = None,
    queue: Annotated[models.Queue | None, Query()] = None,
    tenant: Annotated[models.Tenant | None, Query()] = None,
    key: Annotated[models.Key | None, Query()] = None,
    created_after: models.IsoDateTime | None = None,
    created_before: models.IsoDateTime | None = None,
    limit: Annotated[models.PageSizeInUrl, Query()] = DEFAULT_PAGE_SIZE,
    before_id: Annotated[models.JobIdInUrl | None,
                         Query(description="cursor from the last page")] = None,
) -> models.JobPage:
    where = _filter(state=state, kind=kind, queue=queue, tenant=tenant, key=key,
                    created_after=created_after, created_before=created_before)
    page = ops_jobs.list_jobs(store, where, limit=limit, before_id=before_id)
    return models.JobPage(jobs=[models.JobSummary.of(j) for j in page.jobs],
                          next_cursor=page.next_cursor)


def _bulk(action: str, body: models.BulkIn, who: Principal,
          request: Request) -> models.BulkOut:
    where = body.filter.to_filter()
    if where.is_empty() and not body.all:
        raise InvalidInput("the filter is empty: it would touch every job; narrow it, or "
                           "send \"all\": true to mean it")
    if body.dry_run and body.up_to_id is not None:
        # Ignored, it would count jobs the caller meant to leave out.
        raise InvalidInput("up_to_id bounds the action (dry_run false); a dry run counts "
                           "every matching job and returns its own up_to_id")
    if body.dry_run:
        plan = ops_jobs.plan_bulk(_store(request), action, where)
        return models.BulkOut(action=action, dry_run=True, count=plan.count, more=plan.more,
                              up_to_id=plan.up_to_id, description=plan.description)
    progress = [0]
    try:
        done = ops_jobs.run_bulk(_store(request), action, where, up_to_id=body.up_to_id,
                                 committed=lambda total: progress.__setitem__(0, total))
    except DatabaseError:
        if progress[0]:  # committed batches are changes too: logged as such
            emit(log, f"bulk_{action}", logging.WARNING, jobs=progress[0],
                 filter=where.describe(), up_to_id=body.up_to_id, role=who.role,
                 interrupted=True)
        raise
    emit(log, f"bulk_{action}", jobs=done, filter=where.describe(), up_to_id=body.up_to_id,
         role=who.role)
    return models.BulkOut(action=action, dry_run=False, count=done, up_to_id=body.up_to_id,
                          description=where.describe())


@router.post("/jobs/bulk/retry", response_model=models.BulkOut,
             summary="Retry dead/cancelled jobs matching a filter (dry run by default)")
def bulk_retry(body: models.BulkIn, who: Operator, request: Request) -> models.BulkOut:
    return _bulk("retry", body, who, request)


@router.post("/jobs/bulk/cancel", response_model=models.BulkOut,
             summary="Cancel unfinished jobs matching a filter (dry run by default)")
def bulk_cancel(body: models.BulkIn, who: Operator, request: Request) -> models.BulkOut:
    return _bulk("cancel", body, who, request)


def _detail(client: Client, store: OperatorStore, job_id: int,
            stale_after_seconds: float) -> models.JobDetail:
    job = client.get(job_id, with_attempts=True)
    with store.transaction() as tx:
        context = explain.gather(tx, job, stale_after_seconds=stale_after_seconds)
    return models.JobDetail(
        job=models.JobOut.of(job), attempts=[models.AttemptOut.of(a) for a in job.attempts],
        explanation=models.ExplanationOut.of(explain.explain(job, context)))


@router.get("/jobs/{job_id}", response_model=models.JobDetail, responses=JOB_ERRORS,
            summary="A job with its attempts and the explanation of its state")
def get_job(job_id: JobId, who: Viewer, request: Request) -> models.JobDetail:
    return _detail(_client(request), _store(request), job_id,
                   request.app.state.settings.dashboard_worker_stale_seconds)


@router.get("/jobs/{job_id}/explain", response_model=models.ExplanationOut,
            responses=JOB_ERRORS, summary="Why this job is or is not running right now")
def explain_job(job_id: JobId, who: Viewer, request: Request) -> models.ExplanationOut:
    detail = _detail(_client(request), _store(request), job_id,
                     request.app.state.settings.dashboard_worker_stale_seconds)
    return detail.explanation


@router.post("/jobs/{job_id}/cancel", response_model=models.JobOut, responses=CHANGE_ERRORS,
             summary="Cancel an unfinished job")
def cancel_job(job_id: JobId, who: Operator, request: Request) -> models.JobOut:
    job = _client(request).cancel(job_id)
    emit(log, "job_cancelled", job_id=job_id, role=who.role, via="api")
    return models.JobOut.of(job)


@router.post("/jobs/{job_id}/retry", response_model=models.JobOut, responses=CHANGE_ERRORS,
             summary="Run a dead or cancelled job again")
def retry_job(job_id: JobId, who: Operator, request: Request) -> models.JobOut:
    job = _client(request).retry(job_id)
    emit(log, "job_retried", job_id=job_id, role=who.role, via="api")
    return models.JobOut.of(job)


@router.get("/stats/queues", response_model=list[models.QueueStatsOut],
            summary="Unfinished work per queue and kind, with the oldest due age")
def queue_stats(who: Viewer, request: Request) -> list[models.QueueStatsOut]:
    return [models.QueueStatsOut.of(q) for q in _stats(request).get().queues]


@router.get("/stats/overview", response_model=models.OverviewOut,
            summary="Everything the live page shows, in one call")
def overview(who: Viewer, request: Request) -> models.OverviewOut:
    snap = _stats(request).get()
    by_kind: dict[str, dict[str, int]] = {}
    for (state, kind), n in snap.counts.items():
        by_kind.setdefault(kind, {})[state] = n
    return models.OverviewOut(
        now=snap.now, totals=state_totals(snap.counts), by_kind=by_kind,
        estimated=sorted(snap.estimated),
        queues=[models.QueueStatsOut.of(q) for q in snap.queues],
        tenants=[models.TenantOut.of(t) for t in snap.tenants],
        limits=[models.LimitOut.of(limit) for limit in snap.limits],
        workers=[models.WorkerOut.of(w) for w in snap.workers],
        timeline=[models.BucketOut(**b.__dict__) for b in snap.timeline])


@router.get("/workers", response_model=list[models.WorkerOut],
            summary="Consumers with their last heartbeat")
def list_workers(who: Viewer, store: Read, request: Request) -> list[models.WorkerOut]:
    stale = request.app.state.settings.dashboard_worker_stale_seconds
    return [models.WorkerOut.of(w) for w in store.workers(stale_after_seconds=stale)]
