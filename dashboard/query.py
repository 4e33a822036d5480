"""Unknown query parameters are refused (400) instead of ignored: `/api/jobs?stat=dead`
(a typo of `state`) would otherwise list every job as if it had been filtered. So is a
parameter given twice that takes one value: `?kind=a&kind=b` would filter on `b` alone."""

from __future__ import annotations

import types
import typing
from collections import Counter
from urllib.parse import unquote_to_bytes

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from shared.core.errors import InvalidInput
from shared.core.text import shown

SHOWN_UNKNOWN = 5
"""Unknown parameters an error names before it counts the rest."""


def known_query_only(request: Request) -> None:
    """An app-wide dependency: every query parameter must be one the route declares, and
    its name and value UTF-8 once %-decoded (Starlette would put U+FFFD in place of a byte
    that is not, so `?tenant=%FF` would filter on a tenant nobody named)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    _utf8_query(request.scope.get("query_string", b""))
    params = _walk(route.dependant)  # a handful: cheaper than any cache key
    unknown = sorted(set(request.query_params.keys()) - params.keys())
    if unknown:
        takes = ", ".join(sorted(params)) or "none"
        # Named, but not all of thousands: the answer stays the size of the mistake's kind.
        named = ", ".join(shown(name) for name in unknown[:SHOWN_UNKNOWN])
        more = f" and {len(unknown) - SHOWN_UNKNOWN} more" if len(unknown) > SHOWN_UNKNOWN else ""
        raise InvalidInput(f"unknown query parameter {named}{more}; "
                           f"{request.method} {route.path} takes: {takes}")
    given = Counter(name for name, _ in request.query_params.multi_items())
    twice = sorted(name for name, n in given.items() if n > 1 and not params[name])
    if twice:
        raise InvalidInput("; ".join(
            f"query parameter {name!r} was given {given[name]} times, but it takes one value"
            for name in twice))


def _walk(dependant: Dependant) -> dict[str, bool]:
    """Every query parameter of the route: name -> whether it may be repeated (a list)."""
    names = {param.alias: _repeatable(param.field_info.annotation)
             for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _walk(sub)
    return names


def _repeatable(annotation: object) -> bool:
    """Whether a parameter of this type takes several values (`list[X] | None`)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_repeatable(arg) for arg in typing.get_args(annotation))
    return origin in (list, tuple, set, frozenset)


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
