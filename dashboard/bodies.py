"""JSON request bodies of the API parsed strictly: an object that repeats a key is refused
(400, naming the key) instead of keeping its last value, which is what `json.loads` does
silently (`{"kind": "email", "kind": "sms"}` would enqueue an sms). The API's routers use
`StrictJsonRoute`, whose requests parse their body once, here, in place of FastAPI's
own `json.loads`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from shared.core.text import LostNumber, json_float, shown


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


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, object_pairs_hook=_unique, parse_float=json_float)
            except LostNumber as exc:
                raise HTTPException(400, f"request body: {exc}") from None
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


class StrictJsonRoute(APIRoute):
    """An APIRoute whose handler sees a `StrictJsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
