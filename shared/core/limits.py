"""Concurrency and rate limits on a kind or a tenant, as given by a caller: validated into
what the store keeps (`LimitSpec`). The timer enforces them at dispatch (README, Limits)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from shared.core import validation
from shared.core.errors import InvalidInput

SCOPES = ("kind", "tenant")
MAX_RUNNING_LIMIT = 1_000_000
MAX_RATE_PER_SECOND = 1_000_000.0
MAX_PER_SECONDS = 86_400.0
MAX_BURST = 1_000_000


@dataclass(frozen=True)
class LimitSpec:
    scope: str
    key: str
    """The kind, or the tenant ('' for the jobs enqueued without one)."""
    max_running: int | None
    rate_per_second: float | None
    burst: int | None

    @classmethod
    def of(cls, scope: object, key: object, *, max_running: object = None,
           rate: object = None, per: object = 1.0, burst: object = None) -> LimitSpec:
        """`max_running` jobs dispatched or running at once; `rate` dispatches per `per`
        seconds from a bucket of `burst` tokens (default: one second's worth, at least 1).
        At least one of the two."""
        if scope not in SCOPES:
            raise InvalidInput(f"scope must be 'kind' or 'tenant', got {scope!r}")
        name = validation.kind(key) if scope == "kind" else validation.tenant_key(key)
        running = _count("max_running", max_running, 0, MAX_RUNNING_LIMIT)
        per_second = None
        if rate is not None:
            amount = validation.finite_number("rate", rate)
            seconds = (per.total_seconds() if isinstance(per, timedelta)
                       else validation.finite_number("per", per))
            if not 0 < seconds <= MAX_PER_SECONDS:
                raise InvalidInput(f"per must be > 0 s and at most a day, got {per!r}")
            if amount <= 0:
                raise InvalidInput(f"rate must be > 0, got {rate!r}")
            per_second = amount / seconds
            if per_second > MAX_RATE_PER_SECOND:
                raise InvalidInput(f"rate must be at most {MAX_RATE_PER_SECOND:,.0f} per "
                                   f"second, got {per_second:g}")
        elif burst is not None:
            raise InvalidInput("burst needs a rate")
        if running is None and per_second is None:
            raise InvalidInput("give max_running, a rate, or both")
        bucket = _count("burst", burst, 1, MAX_BURST)
        if per_second is not None and bucket is None:
            bucket = max(1, math.ceil(per_second))
        return cls(str(scope), name, running, per_second, bucket)


def _count(name: str, value: object, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high:,}, got {value}")
    return value
