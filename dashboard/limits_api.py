"""Limits in the API: every concurrency and rate limit (per kind, per tenant, per
concurrency key of a kind) with its use (any role); setting and removing one (operator
role). A change applies from the timers' next pass."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field, field_validator

from dashboard import models
from dashboard.api import ERRORS, Operator, Viewer
from dashboard.bodies import StrictJsonRoute
from shared.client import Client
from shared.runtime.logs import emit

log = logging.getLogger("tock.dashboard")

router = APIRouter(prefix="/api/limits", responses=ERRORS, tags=["limits"],
                   route_class=StrictJsonRoute)
SCOPE_PATTERN = "^(kind|tenant|kind_key)$"
Scope = Annotated[str, Field(pattern=SCOPE_PATTERN,
                             description="kind, tenant, or kind_key (each concurrency key "
                                         "of the kind `key`: max_running only)")]


class LimitIn(models.StrictIn):
    scope: Scope
    key: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        description="the kind or tenant (required); null only with scope tenant: the jobs "
                    "without a tenant")
    max_running: models.WholeNumber | None = Field(
        default=None, description="0..1,000,000 jobs dispatched or running at once")
    rate: models.PositiveNumber | None = Field(default=None,
                                               description="dispatches per `per` seconds")
    per: models.PositiveNumber | None = Field(
        default=None, description="the rate's period, s (only with a rate; default 1)")
    burst: models.WholeNumber | None = Field(
        default=None, description="tokens the bucket holds (only with a rate; default: a "
                                  "second's worth)")


    @field_validator("key", mode="before")
    @classmethod
    def _not_empty(cls, key: object) -> object:
        # "" is not the jobs without a tenant (an unset variable in a script would pause
        # or free them all): that takes saying null, as the CLI takes --no-tenant. Before
        # the length check, whose "at least 1 character" said nothing of null.
        if key == "":
            raise ValueError("the key is empty: name the kind or tenant, or for the jobs "
                             "without a tenant send null")
        return key


def _client(request: Request) -> Client:
    c: Client = request.app.state.client
    return c


@router.get("", response_model=list[models.LimitOut], summary="Every limit with its use")
def list_limits(who: Viewer, request: Request) -> list[models.LimitOut]:
    return [models.LimitOut.of(limit) for limit in _client(request).limits()]


class LimitSetOut(models.LimitOut):
    dropped: list[str] = Field(description="what the limit this one replaced had and this "
                                           "one has not: a set replaces the whole limit")
    unknown_kind: bool = Field(default=False,
                               description="no consumer has announced a handler for this "
                                           "kind in the last 24 hours (a typo?); the limit "
                                           "is set all the same")


@router.put("", response_model=LimitSetOut, summary="Create or replace a limit")
def set_limit(body: LimitIn, who: Operator, request: Request) -> LimitSetOut:
    client = _client(request)
    before = next((x for x in client.limits()
                   if x.scope == body.scope and x.key == (body.key or "")), None)
    limit = client.set_limit(body.scope, body.key, max_running=body.max_running,
                             rate=body.rate, per=body.per, burst=body.burst)
    emit(log, "limit_set", scope=limit.scope, key=limit.key, max_running=limit.max_running,
         rate_per_second=limit.rate_per_second, burst=limit.burst, role=who.role)
    unknown = limit.scope != "tenant" and not client.known_kinds.knows(limit.key)
    return LimitSetOut(**models.LimitOut.of(limit).model_dump(),
                       dropped=limit.no_longer_has(before), unknown_kind=unknown)


class RemovedOut(BaseModel):
    removed: bool


@router.delete("", response_model=RemovedOut, summary="Remove a limit",
               responses={404: {"model": models.ErrorOut, "description": "No such limit"}})
def remove_limit(who: Operator, request: Request,
                 scope: Annotated[str, Query(pattern=SCOPE_PATTERN)],
                 key: Annotated[str | None, Query(min_length=1, max_length=128,
                                                  description="required; omit only with "
                                                              "scope tenant: the jobs "
                                                              "without one")] = None
                 ) -> RemovedOut:
    removed = _client(request).remove_limit(scope, key)
    emit(log, "limit_removed", scope=scope, key=key, removed=removed, role=who.role)
    if not removed:  # as a schedule or job that does not exist is: a typo must not pass
        raise HTTPException(404, f"{scope} {key if key is not None else '(no tenant)'} has "
                                 "no limit; nothing removed")
    return RemovedOut(removed=True)
