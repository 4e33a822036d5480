"""Recurring schedules in the API: list, get (with the next fire times, recent runs and
the slots that did not run), preview, pause and resume. Built on shared.schedules."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from dashboard import models
from dashboard.api import ERRORS, Operator, Viewer
from dashboard.bodies import StrictJsonRoute
from shared.client import Client
from shared.core.schedules import Schedule
from shared.runtime.logs import emit
from shared.schedules.spec import NAME

log = logging.getLogger("tock.dashboard")

NOT_FOUND = {**ERRORS, 404: {"model": models.ErrorOut, "description": "No such schedule"}}
router = APIRouter(prefix="/api/schedules", responses=ERRORS, tags=["schedules"],
                   route_class=StrictJsonRoute)
Name = Annotated[str, Path(pattern=NAME.pattern, description="schedule name")]


class ScheduleOut(BaseModel):
    name: str
    kind: str
    queue: str
    payload: Any
    payload_text: str = Field(description="the payload as JSON text, numbers exact")
    priority: int
    timing: str = Field(description="the schedule in words, e.g. cron '0 2 * * *' in UTC")
    cron: str | None
    every_seconds: float | None
    tz: str
    paused: bool
    next_slot: datetime | None
    next_fire_at: datetime | None
    misfire: str
    overlap: str
    updated_at: datetime

    @classmethod
    def of(cls, s: Schedule) -> ScheduleOut:
        return cls(name=s.name, kind=s.kind, queue=s.queue, payload=s.payload,
                   payload_text=models.payload_text(s.payload),
                   priority=s.priority, timing=s.describe(), cron=s.cron,
                   every_seconds=s.every.total_seconds() if s.every else None, tz=s.tz,
                   paused=s.paused, next_slot=s.next_slot, next_fire_at=s.next_fire_at,
                   misfire=s.misfire.value, overlap=s.overlap.value, updated_at=s.updated_at)


class FireTimeOut(BaseModel):
    slot: datetime
    fire_at: datetime
    local: str = Field(description="fire_at in the schedule's zone")
    note: str | None


class RunOut(BaseModel):
    job_id: int
    slot: datetime
    state: str
    run_at: datetime


class EventOut(BaseModel):
    reason: str
    first_slot: datetime
    last_slot: datetime
    slot_count: int | None
    detail: str | None
    recorded_at: datetime


class ScheduleDetail(BaseModel):
    schedule: ScheduleOut
    next_fires: list[FireTimeOut]
    runs: list[RunOut]
    skipped: list[EventOut] = Field(description="slots that did not become jobs, and why")


def _client(request: Request) -> Client:
    c: Client = request.app.state.client
    return c


def _fires(name: str, n: int, client: Client) -> list[FireTimeOut]:
    return [FireTimeOut(slot=f.slot, fire_at=f.fire_at, local=f.local.isoformat(),
                        note=f.note) for f in client.preview_schedule(name, n)]


@router.get("", response_model=list[ScheduleOut], summary="Every schedule, by name")
def list_schedules(who: Viewer, request: Request) -> list[ScheduleOut]:
    return [ScheduleOut.of(s) for s in _client(request).list_schedules()]


@router.get("/{name}", response_model=ScheduleDetail, responses=NOT_FOUND,
            summary="A schedule with its next fire times, recent runs and skipped slots")
def get_schedule(name: Name, who: Viewer, request: Request) -> ScheduleDetail:
    client = _client(request)
    schedule = client.get_schedule(name)
    return ScheduleDetail(
        schedule=ScheduleOut.of(schedule),
        next_fires=[] if schedule.paused else _fires(name, 5, client),
        runs=[RunOut(**r.__dict__) for r in client.schedule_runs(name, 20)],
        skipped=[EventOut(reason=e.reason, first_slot=e.first_slot, last_slot=e.last_slot,
                          slot_count=e.slot_count, detail=e.detail, recorded_at=e.recorded_at)
                 for e in client.schedule_history(name, 20)])


@router.get("/{name}/preview", response_model=list[FireTimeOut], responses=NOT_FOUND,
            summary="The next n fire times, as they will happen")
def preview(name: Name, who: Viewer, request: Request,
            n: Annotated[models.PreviewInUrl, Query()] = 10
            ) -> list[FireTimeOut]:
    return _fires(name, n, _client(request))


@router.post("/{name}/pause", response_model=ScheduleOut, responses=NOT_FOUND,
             summary="Stop firing (jobs already made are left alone)")
def pause(name: Name, who: Operator, request: Request) -> ScheduleOut:
    schedule = _client(request).pause_schedule(name)
    emit(log, "schedule_paused", schedule=name, role=who.role, via="api")
    return ScheduleOut.of(schedule)


@router.post("/{name}/resume", response_model=ScheduleOut, responses=NOT_FOUND,
             summary="Fire again from the first slot after now")
def resume(name: Name, who: Operator, request: Request) -> ScheduleOut:
    schedule = _client(request).resume_schedule(name)
    emit(log, "schedule_resumed", schedule=name, role=who.role, via="api")
    return ScheduleOut.of(schedule)
