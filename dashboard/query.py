"""Unknown query parameters are refused (400) instead of ignored: `/api/jobs?stat=dead`
(a typo of `state`) would otherwise list every job as if it had been filtered."""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from shared.core.errors import InvalidInput


def known_query_only(request: Request) -> None:
    """An app-wide dependency: every query parameter must be one the route declares."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = _names(route)
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise InvalidInput(f"unknown query parameter {', '.join(map(repr, unknown))}; "
                           f"{request.method} {route.path} takes: {takes}")


def _names(route: APIRoute) -> set[str]:
    return _walk(route.dependant)  # a handful of parameters: cheaper than any cache key


def _walk(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _walk(sub)
    return names
