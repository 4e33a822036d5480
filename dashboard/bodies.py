"""JSON request bodies of the API parsed strictly: an object that repeats a key is refused
(400, naming the key) instead of keeping its last value, which is what `json.loads` does
silently (`{"kind": "email", "kind": "sms"}` would enqueue an sms). The API's routers use
`StrictJsonRoute`, whose requests parse their body once, here, in place of FastAPI's
own `json.loads`."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from shared.core.text import LostNumber, bounded, json_float, shown


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return found


class _Lost:
    """Where the body held a number a float would not keep (found after parsing, so that
    the error can say which field it was in)."""

    def __init__(self, error: LostNumber) -> None:
        self.error = error


def _lost_number(value: Any, path: str = "") -> tuple[str, LostNumber] | None:
    """The first `_Lost` in the parsed body, with its path (`payload.n`, `items[2]`)."""
    if isinstance(value, _Lost):
        return path, value.error
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        found = _lost_number(child, where)
        if found is not None:
            return found
    return None


def _parse(body: bytes) -> Any:
    lost: list[_Lost] = []

    def number(text: str) -> Any:
        try:
            return json_float(text)
        except LostNumber as exc:
            lost.append(_Lost(exc))
            return lost[-1]

    value = json.loads(body, object_pairs_hook=_unique, parse_float=number)
    if lost:
        path, exc = _lost_number(value) or ("", lost[0].error)
        # Only a payload can keep such a number, as text; every other field refuses it.
        advice = ("send it as a string: a payload keeps such a number only as text"
                  if "payload" in re.split(r"[.\[]", path)
                  else "no field takes a number that large or that small"
                  if exc.becomes in ("0", "infinity") else "send fewer digits")
        raise HTTPException(400, f"request body: {shown(path) if path else 'the body'}: "
                                 f"the number {bounded(exc.text, 40)} {exc.why(exc.becomes)} "
                                 f"(it would be read as {exc.becomes}): {advice}")
    return value


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = _parse(body)
            except DuplicateKey as exc:
                # FastAPI passes an HTTPException from here on as it is.
                raise HTTPException(400, f"request body has the key {shown(exc.key)} twice "
                                         "in one JSON object: send each key once") from None
            except json.JSONDecodeError:
                raise  # FastAPI's 422, which says where the text stops being JSON
            except ValueError as exc:
                # Python refuses to read an integer of more than 4300 digits (a guard
                # against slow conversions); FastAPI would say only "There was an error
                # parsing the body".
                if "integer string conversion" not in str(exc):
                    raise
                raise HTTPException(400, f"request body has an integer of more than "
                                         f"{sys.get_int_max_str_digits()} digits, which is "
                                         "not read: no field takes one (send such a "
                                         "number in a payload as a string)") from None
        return self._json


NO_BODY = (b"", b"{}", b"null")
"""What a route that takes no body accepts as one: nothing, or JSON saying nothing."""


class StrictJsonRoute(APIRoute):
    """An APIRoute whose handler sees a `StrictJsonRequest`. A route that takes no body
    (cancel, retry, pause, ...) refuses one that says something: the caller meant it to
    count (`{"reason": ...}`, a query parameter sent in the body) and it would not."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if not takes_body and request.method != "GET":
                body = (await strict_request.body()).strip()
                if body not in NO_BODY:
                    raise HTTPException(
                        400, f"{request.method} {request.url.path} takes no request body "
                             f"(got {len(body):,} bytes): send none; what it acts on is "
                             "named in the path and the query string")
            return await handler(strict_request)

        return strict
