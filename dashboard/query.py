"""Unknown query parameters are refused (400) instead of ignored: `/api/jobs?stat=dead`
(a typo of `state`) would otherwise list every job as if it had been filtered."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from shared.core.errors import InvalidInput


def known_query_only(request: Request) -> None:
    """An app-wide dependency: every query parameter must be one the route declares, and
    its name and value UTF-8 once %-decoded (Starlette would put U+FFFD in place of a byte
    that is not, so `?tenant=%FF` would filter on a tenant nobody named)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    _utf8_query(request.scope.get("query_string", b""))
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


def _utf8_query(raw: bytes) -> None:
    for pair in raw.split(b"&"):
        for part in pair.split(b"=", 1):
            data = unquote_to_bytes(part.replace(b"+", b" "))
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                name = pair.split(b"=", 1)[0].decode("latin-1")
                raise InvalidInput(
                    f"query parameter {name!r} is not UTF-8 text once %-decoded (byte "
                    f"0x{data[exc.start]:02x} at offset {exc.start}): percent-encode the "
                    "UTF-8 bytes of the text") from None
