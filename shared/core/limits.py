"""Concurrency and rate limits on a kind or a tenant, as given by a caller: validated into
what the store keeps (`LimitSpec`). The timer enforces them at dispatch (README, Limits)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from shared.core import validation
from shared.core.errors import InvalidInput
from shared.core.text import shown

SCOPES = ("kind", "tenant", "kind_key")
"""kind_key: the limit's key is a kind, and max_running bounds each concurrency key of it."""
MAX_RUNNING_LIMIT = 1_000_000
MAX_RATE_PER_SECOND = 1_000_000.0
MAX_PER_SECONDS = 86_400.0
MIN_RATE_PER_SECOND = 1 / MAX_PER_SECONDS
"""One a day: the slowest rate `per` can express with a rate of 1. Slower ones (1e-300/s)
are refused: they only pause the kind, which max_running=0 says plainly, and `explain`
would count the wait to their next token in hundreds of digits of days."""
MAX_BURST = 1_000_000
_SHAPES = {"per": "the rate's period", "burst": "the size of the rate's bucket of tokens"}


@dataclass(frozen=True)
class LimitSpec:
    scope: str
    key: str
    """The kind (scopes kind and kind_key), or the tenant ('' for the jobs enqueued without
    one)."""
    max_running: int | None
    rate_per_second: float | None
    burst: int | None

    @classmethod
    def of(cls, scope: object, key: object, *, max_running: object = None,
           rate: object = None, per: object = None, burst: object = None) -> LimitSpec:
        """`max_running` jobs dispatched or running at once; `rate` dispatches per `per`
        seconds (default 1) from a bucket of `burst` tokens (default: one second's worth,
        at least 1).
        At least one of the two; a kind_key limit takes `max_running` only."""
        scope, name = limit_target(scope, key)
        if scope == "tenant" and name:  # a new setting; removing one takes any stored tenant
            validation.new_tenant(name)
        running = _count("max_running", max_running, 0, MAX_RUNNING_LIMIT)
        shaped = [n for n, given in (("per", per is not None),
                                     ("burst", burst is not None)) if given]
        if scope == "kind_key" and (running is None or rate is not None or shaped):
            raise InvalidInput("a kind_key limit takes max_running only (running jobs per "
                               "concurrency key); rate limits are per kind or per tenant")
        if rate is None and shaped:
            # Without a rate there is nothing to store them in: refuse, never drop them.
            names = " and ".join(shaped)
            what = "; ".join(f"{n} is {_SHAPES[n]}" for n in shaped)
            raise InvalidInput(f"{names} {'need' if len(shaped) > 1 else 'needs'} a rate "
                               f"({what}): give a rate too, or leave {names} out")
        per_second = None
        if rate is not None:
            amount = validation.finite_number("rate", rate)
            seconds = (1.0 if per is None else per.total_seconds()
                       if isinstance(per, timedelta) else validation.finite_number("per", per))
            if not 0 < seconds <= MAX_PER_SECONDS:
                raise InvalidInput(f"per must be > 0 s and at most a day, got {shown(per)}")
            if amount <= 0:
                raise InvalidInput(f"rate must be > 0, got {shown(rate)}")
            per_second = amount / seconds
            if per_second < MIN_RATE_PER_SECOND:
                raise InvalidInput(f"rate must be at least 1 per day (1 per 86400 s), got "
                                   f"{per_second:g} per second; to hold the jobs back "
                                   "altogether, set max_running 0")
            if per_second > MAX_RATE_PER_SECOND:
                raise InvalidInput(f"rate must be at most {MAX_RATE_PER_SECOND:,.0f} per "
                                   f"second, got {per_second:,.10g}")
        if running is None and per_second is None:
            raise InvalidInput("give max_running, a rate, or both")
        bucket = _count("burst", burst, 1, MAX_BURST)
        if per_second is not None and bucket is None:
            bucket = max(1, math.ceil(per_second))
        return cls(scope, name, running, per_second, bucket)


def limit_target(scope: object, key: object) -> tuple[str, str]:
    """(scope, key) of a limit, validated: the key names a kind, or a tenant (None, or ''
    as `limits()` reports it: the jobs without a tenant)."""
    if scope not in SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(SCOPES)}, got {shown(scope)}")
    if key is None and scope != "tenant":
        raise InvalidInput(f"key is required: a {scope} limit needs the name of the kind it "
                           "limits (only a tenant limit may leave it out, for the jobs "
                           "without a tenant)")
    if scope == "tenant" and key == "":
        return "tenant", ""  # what limits() says of the jobs without a tenant, given back
    name = validation.tenant_key(key) if scope == "tenant" else validation.kind(key)
    return str(scope), name


def _count(name: str, value: object, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high:,}, got {shown(value)}")
    return value


def rate_text(per_second: float) -> str:
    """A rate as people set it: '5/s', '30/min', '1/h' (3 significant digits), not
    '0.000277778/s'."""
    for unit, seconds in (("s", 1), ("min", 60), ("h", 3600)):
        if per_second * seconds >= 1 or unit == "h":
            return f"{per_second * seconds:.3g}/{unit}"
    raise AssertionError("unreachable")
