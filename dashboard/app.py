"""The dashboard's FastAPI application: `create_app(settings)`.

    /                 the live page (login required)      /login, /logout
    /api/...          the HTTP API (see /openapi.json)     /static/...  assets, no CDN
    /healthz          liveness: the process answers        /readyz  Postgres answers
    /metrics          cluster-wide gauges (Prometheus), computed once per TTL; needs a
                      bearer token unless TOCK_DASHBOARD_METRICS_PUBLIC=1

Every request first passes `RequestGuard` (dashboard.guard): allowed Host, credentials
for /api and /metrics, body size and JSON depth, before anything reads the body.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Scope

from dashboard import api, limits_api, pages, schedules_api, tenants_api
from dashboard.auth import Authenticator
from dashboard.guard import RequestGuard
from dashboard.head_requests import HeadAsGet
from dashboard.query import known_query_only
from dashboard.settings import DashboardSettings
from dashboard.stats import ClusterCollector, StatsCache
from shared.client import Client
from shared.core import validation
from shared.core.errors import (
    DataRejected,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    Retryable,
    ScheduleNotFound,
    TransportError,
)
from shared.runtime.logs import emit
from shared.runtime.settings import ClientSettings
from shared.schedules import spec
from shared.store.database import Database, probe
from shared.store.operator_store import OperatorStore

log = logging.getLogger("tock.dashboard")

# The page runs only our own script and styles; nothing may frame it.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


class ErrorResponse(JSONResponse):
    """An error body, which may quote the input back: characters UTF-8 cannot carry (lone
    surrogates) are escaped, and numbers JSON has no literal for (NaN, infinities) are
    quoted as text, so the refusal itself can always be sent."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_json_safe(content), ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


# A value of these shapes is refused in the words the Python client and the CLI use, not
# by quoting a regular expression at the caller.
_PATTERN_CHECKS = {validation.KIND.pattern: validation.kind,
                   validation.QUEUE_NAME.pattern: validation.queue,
                   spec.NAME.pattern: spec.schedule_name}


def _worded(error: dict[str, Any]) -> dict[str, Any]:
    loc, given = tuple(error.get("loc") or ()), error.get("input")
    if error.get("type") == "enum" and loc[:1] == ("query",) and isinstance(given, str) \
            and "," in given:
        # The CLI takes --state dead,retrying; the API takes the parameter repeated.
        name = loc[1] if len(loc) > 1 else "state"
        first, second = (part.strip() for part in given.split(",", 1))
        return {**error, "msg": f"{error.get('msg')}; for several, repeat the parameter "
                                f"({name}={first}&{name}={second}), not commas"}
    check = _PATTERN_CHECKS.get((error.get("ctx") or {}).get("pattern", ""))
    if error.get("type") != "string_pattern_mismatch" or check is None:
        return error
    try:
        check(error.get("input"))
    except InvalidInput as refused:
        return {**error, "msg": str(refused)}
    return error


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [_worded(e) for e in exc.errors()]
    return ErrorResponse({"detail": jsonable_encoder(errors)}, status_code=422)


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods some route answers at the request's path, for a 405's Allow (Starlette
    names only the first route matching the path). Each method is tried as routing would
    try it: included routers nest their routes, so the top level cannot list them.
    Mounts (/static) match every method and answer 405 themselves: left out."""
    found = []
    for method in METHODS:
        probe = {"type": "http", "path": scope["path"], "root_path": scope.get("root_path", ""),
                 "method": method}
        if any(not isinstance(route, Mount) and route.matches(probe)[0] is Match.FULL
               for route in routes):
            found.append(method)
    return found


NOT_READY_LOG_SECONDS = 30.0
"""While /readyz fails for one reason, how often it says so in the log."""
POOL_TIMEOUT_SECONDS = 3.0
"""Longest a request waits for a database connection before answering 503."""
ANSWER_TIMEOUT_SECONDS = 15.0
"""Longest a statement of a request may run; a server that says nothing at all is given
a few seconds more, then the request's connection is cut (shared.store.watchdog) and it
answers 503."""


def create_app(settings: DashboardSettings) -> FastAPI:
    """A ready-to-serve app; the database pool opens with the app's lifespan."""
    # A page or scrape that cannot get a connection soon answers 503 rather than hanging:
    # both pools (the client's serves a job's page, enqueue, retry, cancel, schedules and
    # limits) wait at most POOL_TIMEOUT_SECONDS, not the client's default 30 s.
    database = Database(settings.database_url, max_size=settings.pool_max_size,
                        name="tock-dashboard", timeout=POOL_TIMEOUT_SECONDS,
                        answer_timeout=ANSWER_TIMEOUT_SECONDS,
                        # Its errors say why and name the setting, as the client pool's
                        # do; it still starts (and answers /readyz) with the database down.
                        setting="the dashboard's TOCK_DATABASE_URL", connect_at_open=False)
    store = OperatorStore(database)
    client = Client(ClientSettings(database_url=settings.database_url,
                                   queue_prefix=settings.queue_prefix,
                                   call_timeout_seconds=ANSWER_TIMEOUT_SECONDS),
                    pool_timeout=POOL_TIMEOUT_SECONDS,
                    # Named in its errors: the dashboard's own setting (its statement
                    # timeout is no setting: nothing to name).
                    database_setting="the dashboard's TOCK_DATABASE_URL",
                    call_timeout_setting=None)
    stats = StatsCache(store, ttl_seconds=settings.dashboard_stats_ttl_seconds,
                       stale_after_seconds=settings.dashboard_worker_stale_seconds,
                       finished_ttl_seconds=settings.dashboard_finished_ttl_seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(stats))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database.open()
        try:
            yield
        finally:
            client.close()
            database.close()

    app = FastAPI(
        title="tock", version="0.1.0", lifespan=lifespan,
        description="Operate tock: enqueue, inspect, explain, retry and cancel jobs; "
                    "queue statistics and workers. Authenticate with "
                    "`Authorization: Bearer <token>` (operator or viewer role).",
        docs_url=None, redoc_url=None,  # their UIs load scripts from a CDN
        dependencies=[Depends(known_query_only)],
    )
    app.state.settings = settings
    app.state.operator_store = store
    app.state.client = client
    app.state.stats = stats
    app.state.auth = auth = Authenticator(settings)
    app.include_router(api.router)
    app.include_router(schedules_api.router)
    app.include_router(tenants_api.router)
    app.include_router(limits_api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(packages=[("dashboard", "static")]), name="static")

    def _error(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def handler(request: Request, exc: Exception) -> Response:
            return ErrorResponse({"detail": str(exc)}, status_code=status)
        return handler

    app.add_exception_handler(RequestValidationError, _invalid_request)

    app.add_exception_handler(InvalidInput, _error(400))
    app.add_exception_handler(JobNotFound, _error(404))
    app.add_exception_handler(ScheduleNotFound, _error(404))
    app.add_exception_handler(InvalidTransition, _error(409))
    app.add_exception_handler(Retryable, _error(503))
    app.add_exception_handler(DataRejected, _error(400))
    app.add_exception_handler(TransportError, _error(503))

    # Added first, so it runs inside security_headers (its answers get the headers too)
    # and before everything else: no route, dependency or body parser runs before it.
    app.add_middleware(RequestGuard, settings=settings, auth=auth)

    @app.middleware("http")
    async def security_headers(request: Request,
                               call_next: Callable[[Request], Awaitable[Response]]
                               ) -> Response:
        try:
            response = await call_next(request)
        except RuntimeError as exc:
            # Starlette's way of saying the client hung up before an answer (mid-body,
            # say): nobody to answer, and nothing wrong here; a traceback per aborted
            # request would let any caller flood the log.
            if str(exc) != "No response returned." or not await request.is_disconnected():
                raise
            return Response(status_code=400)
        if response.status_code == 405:
            allowed = allowed_methods(app.routes, request.scope)
            if allowed:
                response.headers["Allow"] = ", ".join(sorted(allowed))
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    app.add_middleware(HeadAsGet)  # added last: the outermost

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    said: dict[str, Any] = {"reason": None, "at": 0.0, "quiet": 0}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> PlainTextResponse:
        reason = probe(settings.database_url)
        if reason is not None:
            # Probed every second or so: said when the reason changes, else every
            # NOT_READY_LOG_SECONDS with how many probes failed since.
            clock = time.monotonic()
            if reason != said["reason"] or clock - said["at"] >= NOT_READY_LOG_SECONDS:
                emit(log, "not_ready", logging.WARNING, error=reason,
                     probes_since=said["quiet"])
                said.update(reason=reason, at=clock, quiet=0)
            else:
                said["quiet"] += 1
            return PlainTextResponse(f"not ready: postgres: {reason}\n", status_code=503)
        said.update(reason=None, quiet=0)
        return PlainTextResponse("ready\n")

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        # RequestGuard has checked the token (or TOCK_DASHBOARD_METRICS_PUBLIC).
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return app
