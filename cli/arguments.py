"""The arguments the operator commands share: argument types (ISO 8601 times, job ids,
numbers, non-empty filter values, database URLs, seconds), the `--database-url`/`--json` pair, and
the job filter flags with the `JobFilter` they make."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar

from shared.core.errors import InvalidInput
from shared.core.filters import JobFilter
from shared.core.iso_time import NoSuchTime, parse_iso_datetime
from shared.core.messages import MAX_JOB_ID
from shared.core.states import JobState
from shared.core.text import decimal_integer, shown
from shared.store.database import check_url, redacted

Sub = Any  # argparse._SubParsersAction is private; its type adds nothing here


# A calendar date alone, maybe followed by a timezone: ISO 8601 puts a timezone only after
# a time, and Python would read 2027-01-01-05:00 as 05:00 on a naive date.
_DATE_ONLY = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2}|\d{8})(?P<zone>[Zz]|[+-]\d{2}(?::?\d{2})?)?")
EXAMPLE_TIME = "2026-12-02T15:04:05+00:00"
_FINER_THAN_MICROSECONDS = re.compile(r"T[\d:]*[.,]\d{7,}")


def parse_time(text: str) -> datetime:
    """An ISO 8601 date and time with a timezone (`2027-01-01T09:00+02:00`, `...Z`), in UTC.
    Raise `argparse.ArgumentTypeError` with examples that this function accepts."""
    date_only = _DATE_ONLY.fullmatch(text)
    if date_only:
        raise argparse.ArgumentTypeError(_date_only(text, date_only))
    try:
        value = parse_iso_datetime(text)
    except NoSuchTime as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        finer = " (seconds take at most 6 decimals)" if _FINER_THAN_MICROSECONDS.search(
            text) else ""
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not an ISO 8601 time such as {EXAMPLE_TIME}{finer}") from None
    if value.tzinfo is None or value.utcoffset() is None:
        given = value.isoformat()
        raise argparse.ArgumentTypeError(
            f"{shown(text)} has no timezone; add one, e.g. {given}+00:00 or {given}Z for UTC")
    try:
        return value.astimezone(UTC)  # Postgres refuses offsets beyond 15:59
    except OverflowError:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is out of range: in UTC it falls outside years 1 to 9999") from None


def _date_only(text: str, match: re.Match[str]) -> str:
    try:
        day = date.fromisoformat(match["date"]).isoformat()
    except ValueError:
        return f"{shown(text)} is not an ISO 8601 time such as {EXAMPLE_TIME}"
    if match["zone"] is None:
        return (f"{shown(text)} is a date without a time of day or timezone; give both, e.g. "
                f"{day}T00:00:00+00:00 or {day}T00:00Z for midnight UTC")
    zone = "Z" if match["zone"] in "Zz" else _offset(match["zone"])
    return (f"{shown(text)} has a timezone but no time of day (ISO 8601 puts the timezone "
            f"after a time); write e.g. {day}T00:00:00{zone} for midnight there")


def _offset(zone: str) -> str:
    """`+05`, `+0530` or `+05:30` as `+05:30`; an impossible offset as `+00:00`."""
    digits = zone[1:].replace(":", "").ljust(4, "0")
    hours, minutes = int(digits[:2]), int(digits[2:])
    return f"{zone[0]}{hours:02d}:{minutes:02d}" if hours < 24 and minutes < 60 else "+00:00"


def nonempty(what: str) -> Callable[[str], str]:
    """An argument type refusing '' (which would otherwise mean "no filter"): `what` names
    the value, e.g. "a tenant"."""
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(
                f"the value is empty; give {what}, or leave the option out")
        return text
    return parse


def states_type(text: str) -> str:
    """One `--state` value: state names, comma-separated; at least one."""
    if not any(part.strip() for part in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"the value is empty; give a state name ({', '.join(s.value for s in JobState)}) "
            "or several, comma-separated, or leave the option out")
    if any(not part.strip() for part in text.split(",")):
        # "dead," is a list cut short (a script's join of an empty name?), as --queues says
        raise argparse.ArgumentTypeError(
            f"{shown(text)} has an empty state name between its commas")
    return text


def plain_integer(text: str) -> int:
    """`text` as an integer if it is written plainly: ASCII digits, maybe after a minus
    sign (a negative value then gets its option's own range message). ValueError for the
    other forms int() reads ("1_000", " 5", "+5", full-width digits): not what an
    operator means to type, and the HTTP API refuses them too."""
    if text.startswith("+"):
        raise ValueError(f"not a plain integer: {text!r}")
    return decimal_integer(text)


def plain_number(text: str) -> float:
    """`text` as a float if it is written plainly: as `plain_integer`, with a fraction or
    an exponent allowed (0.5, 1e-3). nan and inf pass: each option's own check refuses
    them with its range."""
    if not text.isascii() or "_" in text or text != text.strip() or text.startswith("+"):
        raise ValueError(f"not a plain number: {text!r}")
    return float(text)


def integer_type(what: str) -> Callable[[str], int]:
    """An argument type for an integer in plain decimal digits (`plain_integer`); `what`
    names the value in the refusal, e.g. "an integer"."""
    return _plain_type(plain_integer, what)


def number_type(what: str) -> Callable[[str], float]:
    """An argument type for a number in plain decimal digits (`plain_number`); `what` names
    the value in the refusal, e.g. "a number of seconds"."""
    return _plain_type(plain_number, what)


T = TypeVar("T")


def _plain_type(read: Callable[[str], T], what: str) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {what}") from None
    return parse


integer = integer_type("an integer")
seconds = number_type("a number of seconds")
"""The usual argument types of counts and durations."""


def job_id_type(text: str) -> int:
    """A job id: a positive integer within Postgres' bigint, the column's type (past it, no
    job can have that id, and Postgres would compare the number as a numeric instead)."""
    try:
        value = plain_integer(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a job id") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"job ids are positive, got {value}")
    if value > MAX_JOB_ID:
        raise argparse.ArgumentTypeError(
            f"job ids are at most {MAX_JOB_ID} (a Postgres bigint), got {shown(value)}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0. float() also reads nan, which compares false
    with every bound, and inf."""
    value = seconds(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0, got {shown(text)}")
    return value


def database_url_type(text: str) -> str:
    """`--database-url`, checked while parsing so the error names the option: later, ''
    would fall back to TOCK_DATABASE_URL and a bad URL would be blamed on that variable."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the value is empty; give a URL such as postgresql://user@host:port/database, "
            "or leave the option out to use TOCK_DATABASE_URL")
    try:
        return check_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{shown(redacted(text))} {exc}") from None


def add_common(p: argparse.ArgumentParser, *, json_flag: bool = True,
               after_action: bool = False) -> None:
    """`--database-url` and (with `json_flag`) `--json`. `after_action`: on an action's
    parser (`tock limits set ... --json`) whose command's parser has them too; SUPPRESS
    keeps the action from resetting a value given before it (`tock limits --json set`)."""
    p.add_argument("--database-url", type=database_url_type, metavar="URL",
                   default=argparse.SUPPRESS if after_action else None,
                   help="default: TOCK_DATABASE_URL")
    if json_flag:
        p.add_argument("--json", action="store_true",
                       default=argparse.SUPPRESS if after_action else False,
                       help="print JSON for scripts")


def add_filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filter")
    g.add_argument("--state", action="append", default=[], metavar="STATE", type=states_type,
                   help=f"repeatable or comma-separated: {', '.join(s.value for s in JobState)}")
    g.add_argument("--kind", type=nonempty("a kind"))
    g.add_argument("--queue", type=nonempty("a queue name"))
    g.add_argument("--tenant", type=nonempty("a tenant"))
    g.add_argument("--key", type=nonempty("an idempotency key"), help="idempotency key")
    g.add_argument("--since", type=parse_time, metavar="TIME",
                   help="created at or after (ISO 8601 with timezone, e.g. "
                        "2026-12-02T00:00:00Z)")
    g.add_argument("--until", type=parse_time, metavar="TIME",
                   help="created before (ISO 8601 with timezone)")


def filter_of(args: argparse.Namespace) -> JobFilter:
    states = ",".join(args.state)
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise InvalidInput(f"--since {args.since.isoformat()} is not earlier than --until "
                           f"{args.until.isoformat()}: no job could match")
    return JobFilter.of(states=states, kind=args.kind, queue=args.queue, tenant=args.tenant,
                        key=args.key, created_after=args.since, created_before=args.until)
