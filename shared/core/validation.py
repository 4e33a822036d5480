"""Checks on producer input, done before anything is written. Each failure is an
`InvalidInput` that names the argument and what is wrong with it, showing the value as
the user would write it (`text.shown`), never as a Python repr."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.text import shown, utf8_problem

# SQS names are at most 80 characters: the longest TOCK_QUEUE_PREFIX (15), the queue, and
# its dead-letter queue's "-dlq" must fit.
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,61}$")
KIND = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
MIN_PRIORITY, MAX_PRIORITY = 0, 9
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_SECONDS = 12 * 3600.0
MIN_TIMEOUT_SECONDS = 0.001
"""Below a millisecond a deadline is noise: whether the handler beat it was chance."""
MAX_KEY_LENGTH = 255
MAX_TENANT_LENGTH = 128
MAX_CONCURRENCY_KEY_LENGTH = 255
MAX_DELAY_SECONDS = 10 * 365 * 86400.0
MAX_PAYLOAD_DEPTH = 64
MAX_PAYLOAD_INT = 10**1000


def wrong(name: str, expected: str, value: object) -> InvalidInput:
    """The error for a `value` of `name` that is not `expected` (e.g. "an integer"): it
    says the value is missing when it is None, and shows it otherwise."""
    if value is None:
        return InvalidInput(f"{name} is missing: it must be {expected}")
    return InvalidInput(f"{name} must be {expected}, got {shown(value)}")


def kind(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise wrong("kind", "a non-empty string", value)
    if not KIND.fullmatch(value):
        raise InvalidInput(
            f"kind {shown(value)} is not a valid kind: use letters, digits and . _ : - "
            "(starting with a letter or _), at most 128 characters"
        )
    return value


def queue(value: object) -> str:
    if not isinstance(value, str):
        raise wrong("queue", "a queue name: 1-61 letters, digits, - or _", value)
    if not QUEUE_NAME.fullmatch(value):
        raise InvalidInput(
            f"queue {shown(value)} is not a valid queue name: 1-61 letters, digits, - or _"
        )
    return value


def payload(value: object, max_bytes: int) -> str:
    """The payload as JSON text, if Postgres will give back exactly this value: JSON types
    only (dicts with string keys, lists, strings, finite numbers, booleans, None), no NUL
    character or lone surrogate in any string, at most MAX_PAYLOAD_DEPTH levels deep, at
    most `max_bytes` encoded. Anything that would come back different is refused."""
    _check_json(value)
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # ValueError: an int of more than 4300 digits
        raise InvalidInput(f"payload is not JSON-serializable: {exc}") from None
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidInput(f"payload is {size} bytes encoded, over the limit of {max_bytes}")
    return text


Where = tuple[Any, str | int] | None
"""Where a value sits in a payload: (where its container sits, its key or index); None for
the payload itself. Made into text (`_path`) only for a message."""


def _check_json(value: object) -> None:
    """Walk the payload without recursion (a deep one must not exhaust the stack)."""
    stack: list[tuple[object, Where, int]] = [(value, None, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(f"payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels "
                               f"(at {_path(where)})")
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, int):
            if abs(item) >= MAX_PAYLOAD_INT:
                raise InvalidInput(f"payload integer at {_path(where)} has more than "
                                   f"{len(str(MAX_PAYLOAD_INT)) - 1} digits")
        elif isinstance(item, float):
            _check_float(item, where)
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise InvalidInput(
                        f"payload key {shown(key)} at {_path(where)} is not a string: JSON "
                        "object keys are strings, and it would come back as one")
                _check_text(key, (where, key))
                stack.append((inner, (where, key), depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, (where, i), depth + 1) for i, inner in enumerate(item))
        elif isinstance(item, tuple):
            raise InvalidInput(f"payload value at {_path(where)} is a tuple: use a list (it "
                               "would come back as one)")
        else:
            raise InvalidInput(f"payload value at {_path(where)} is a {type(item).__name__}, "
                               "which is not JSON (use str, int, float, bool, None, list, "
                               "dict)")


PATH_LIMIT = 80
KEY_LIMIT = 20
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _path(where: Where) -> str:
    """`where` as a JSONPath (`$.items[3].name`) of at most about PATH_LIMIT characters: a
    longer one keeps its first steps and its last, whole, with `[...]` for those between
    (`$[0][0][...][0]`)."""
    steps: list[str] = []
    while where is not None:
        where, step = where
        steps.append(_step(step))
    steps.reverse()
    if len(steps) < 2 or sum(map(len, steps)) < PATH_LIMIT:
        return "$" + "".join(steps)
    room = PATH_LIMIT - len(steps[-1]) - len("$[...]")
    head = ""
    for step in steps[:-1]:
        if len(head) + len(step) > room:
            break
        head += step
    return f"${head}[...]{steps[-1]}"


def _step(step: str | int) -> str:
    """One step of a path: `[3]`, `.name`, or for a key that is not a plain name (or is
    long) `['a key']`, escaped like a Python literal and cut to KEY_LIMIT characters."""
    if isinstance(step, int):
        return f"[{step}]"
    if len(step) <= KEY_LIMIT and _PLAIN_KEY.fullmatch(step):
        return f".{step}"
    shown_key = step if len(step) <= KEY_LIMIT else step[:KEY_LIMIT] + "..."
    return f"[{shown_key!r}]"


def _check_text(text: str, where: Where) -> None:
    if "\x00" in text:
        raise InvalidInput(f"payload text at {_path(where)} contains a NUL character, which "
                           "Postgres cannot store")
    problem = utf8_problem(text)
    if problem:
        raise InvalidInput(f"payload text at {_path(where)} is not valid UTF-8 text: {problem}")


def _check_float(number: float, where: Where) -> None:
    if math.isnan(number):
        raise InvalidInput(f"payload number at {_path(where)} is NaN, which is not JSON")
    if math.isinf(number):  # Python's inf, or JSON text such as 1e400, past a double's range
        raise InvalidInput(f"payload number at {_path(where)} is infinite (or past "
                           "1.8e308, the largest a double holds), which JSON cannot store")
    # jsonb keeps numbers as exact decimals and prints integral ones written with an
    # exponent as integers: 1e16 would come back as the int 10000000000000000, 1e23 as a
    # different value altogether.
    if number.is_integer() and "e" in repr(number):
        raise InvalidInput(f"payload number {shown(number)} at {_path(where)} cannot be "
                           "stored exactly (it would come back as a different integer); send "
                           "it as an int or a string")


def aware(name: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise wrong(name, "a timezone-aware datetime", value)
    try:
        offset = value.utcoffset()
    except (ValueError, TypeError):  # a tzinfo whose offset is 24 h or more, or not a timedelta
        raise InvalidInput(f"{name} has a timezone ({type(value.tzinfo).__name__}) whose UTC "
                           "offset cannot be used: it must be a duration of less than 24 "
                           "hours either way") from None
    if value.tzinfo is None or offset is None:
        text = value.isoformat()
        raise InvalidInput(
            f"{name} must be timezone-aware: {text} has no timezone, so it is ambiguous; "
            f"add one, e.g. {text}+00:00 for UTC"
        )
    # Stored in UTC: Postgres refuses offsets past +-15:59 that Python allows.
    try:
        utc = value.astimezone(UTC)
        back = utc.astimezone(value.tzinfo)
    except OverflowError:
        raise InvalidInput(f"{name} {shown(value)} is out of range: in UTC it falls outside "
                           "years 1 to 9999") from None
    if back.replace(tzinfo=None, fold=0) != value.replace(tzinfo=None, fold=0):
        # A wall time the clocks skip (spring forward): Python gives it an offset anyway,
        # fold=0 and fold=1 two different instants, neither of them the time written.
        wall = value.replace(tzinfo=None, fold=0).isoformat()
        raise InvalidInput(
            f"{name} {wall} does not exist in {value.tzinfo}: the clocks skip it (a DST "
            f"gap); give a time that exists, e.g. {back.isoformat()}")
    return utc


def finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong(name, "a number", value)
    try:
        number = float(value)
    except OverflowError:  # an int past float's range (about 1.8e308)
        raise InvalidInput(f"{name} must be finite, got {shown(value)}") from None
    if not math.isfinite(number):
        raise InvalidInput(f"{name} must be finite, got {shown(value)}")
    return number


def delay_seconds(value: object) -> float:
    seconds = (
        value.total_seconds() if isinstance(value, timedelta) else finite_number("delay", value)
    )
    if seconds < 0:
        raise InvalidInput(f"delay must not be negative, got {shown(value)}")
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidInput(f"delay must be at most 10 years (3,650 days), got {shown(value)}")
    return seconds


def run_time(at: object, delay: object) -> tuple[datetime | None, float]:
    """(at, delay_seconds): exactly one of the two decides run_at; neither means now."""
    if at is not None and delay is not None:
        raise InvalidInput("give either at= or delay=, not both")
    if at is not None:
        when = aware("at", at)
        # As far ahead as delay= reaches: a time centuries out is a typo, not a plan.
        if (when - datetime.now(UTC)).total_seconds() > MAX_DELAY_SECONDS:
            raise InvalidInput(f"at must be at most 10 years (3,650 days) from now, as "
                               f"delay= is, got {shown(when)}")
        return when, 0.0
    if delay is not None:
        return None, delay_seconds(delay)
    return None, 0.0


def priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong("priority", "an integer", value)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidInput(
            f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY} "
            f"(higher is dispatched first), got {value}"
        )
    return value


def max_attempts(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong("max_attempts", "an integer", value)
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidInput(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {value}")
    return value


def timeout_seconds(value: object) -> float | None:
    if value is None:
        return None
    seconds = (
        value.total_seconds() if isinstance(value, timedelta)
        else finite_number("timeout", value)
    )
    if not MIN_TIMEOUT_SECONDS <= seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidInput(f"timeout must be from 1 ms to 12 hours, got {shown(value)}")
    return seconds


def optional_text(name: str, value: object, max_length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise wrong(name, "a non-empty string", value)
    if len(value) > max_length:
        raise InvalidInput(f"{name} must be at most {max_length} characters, got {len(value)}")
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters")
    problem = utf8_problem(value)
    if problem:
        raise InvalidInput(f"{name} is not valid UTF-8 text: {problem}")
    return value


RUN_KEY = re.compile(r".:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z\Z", re.DOTALL)
"""The form of the keys schedules give their runs (shared.schedules.slots.slot_key)."""


def job_key(value: object) -> str | None:
    """A job's `key=`: text, and not of the form schedules key their runs with, which
    would take that slot from a schedule of that name (its run would not be made)."""
    key = optional_text("key", value, MAX_KEY_LENGTH)
    if key is not None and RUN_KEY.search(key):
        raise InvalidInput(
            f"key {shown(key)} has the form of a schedule's run key (<schedule name>:<UTC "
            "time>Z): a job keyed so would take that slot from a schedule of that name, "
            "which would then not run it; write the time another way (+00:00 for Z, say)")
    return key


MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT = 1, 1000


def tenant_weight(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong("weight", "an integer", value)
    if not MIN_TENANT_WEIGHT <= value <= MAX_TENANT_WEIGHT:
        raise InvalidInput(f"weight must be between {MIN_TENANT_WEIGHT} and "
                           f"{MAX_TENANT_WEIGHT}, got {value}")
    return value


def tenant(value: object) -> str | None:
    """A tenant name as it may be stored, or None: what filters and removals take, so that
    a tenant stored before `new_tenant`'s checks can still be found and cleaned up."""
    return optional_text("tenant", value, MAX_TENANT_LENGTH)


def _unblank(text: str) -> str:
    """Blank space at either end is refused: " acme" would show as acme everywhere
    (dashboard, CLI, logs) yet be another tenant, with its own share, weight and limits."""
    if text != text.strip():
        what = "is only blank space" if not text.strip() else "begins or ends with blank space"
        raise InvalidInput(f"tenant {shown(text)} {what}, which would show as another "
                           "tenant; remove it")
    return text


def tenant_key(value: object) -> str:
    """A tenant as the fair share knows it: None (jobs enqueued without one) is ''."""
    return tenant(value) or ""


JOINERS = frozenset("\u200c\u200d")
"""ZERO WIDTH NON-JOINER and JOINER: invisible, but they shape words in Persian and the
Indic scripts (and emoji sequences), so a name may need them."""


def visible(name: str, text: str) -> str:
    """`text`, unless it holds a control character (Unicode category Cc: C0, DEL, C1), a
    format character (Cf: zero-width space, bidi controls, BOM) other than JOINERS, or a
    space or separator other than the plain space (Zs, Zl, Zp): a name with one shows as
    another name everywhere, yet is not it."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf") and char not in JOINERS:
            what = unicodedata.name(char, "a control character")
            raise InvalidInput(f"{name} contains U+{ord(char):04X} ({what}), which does not "
                               "show where the name is shown; remove it")
        if unicodedata.category(char) in ("Zs", "Zl", "Zp") and char != " ":
            # A no-break or thin space shows as a space, a line separator as a line
            # break or a space: "a\u00a0b" would be listed as "a b" yet be another name.
            raise InvalidInput(f"{name} contains U+{ord(char):04X} "
                               f"({unicodedata.name(char, 'a separator')}), which shows as "
                               "a plain space or a line break; write a plain space or none")
    return text


def new_tenant(value: object) -> str | None:
    """A tenant given for new work or a setting (enqueue, schedule, weight, limit): as
    `tenant`, without blank space at either end, and `visible`. Filters and removals take
    `tenant`, so that tenants stored before these checks can still be found and cleaned
    up."""
    text = tenant(value)
    return None if text is None else visible("tenant", _unblank(text))


def new_tenant_key(value: object) -> str:
    """`new_tenant` as the fair share knows it: None (jobs enqueued without one) is ''."""
    return new_tenant(value) or ""


def job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise wrong("job id", "a positive integer", value)
    return value


def spec_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """Used by schedule_many: refuse unknown keys with a hint instead of ignoring them."""
    known = {"kind", "payload", "at", "delay", "key", "priority", "queue", "max_attempts",
             "timeout", "tenant", "concurrency_key"}
    unknown = set(spec) - known
    if unknown:
        raise InvalidInput(f"unknown job field(s) {', '.join(sorted(map(str, unknown)))}; "
                           f"known: {', '.join(sorted(known))}")
    if "kind" not in spec:
        raise InvalidInput("kind is missing: every job needs one")
    return spec


