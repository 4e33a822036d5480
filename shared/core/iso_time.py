"""ISO 8601 date-times as people write them, for the CLI and the HTTP API.

Python's `datetime.fromisoformat` takes more than ISO 8601: any character between the date
and the time (`2027-01-01x05:00`), a stray one before the offset (`05:00:00xZ`, `05:00 +09:00`),
a NUL, a second offset read as a time of day (`2027-01-01+05:00+01:00` is 04:00 UTC), and
nanoseconds, cut to microseconds. Each would store another instant than the one written,
so the text must have the standard's shape first."""

from __future__ import annotations

import re
from datetime import datetime

ISO_DATETIME = re.compile(
    r"(?:\d{4}-\d{2}-\d{2}|\d{8})"  # a calendar date, extended or basic
    r"[Tt ]"  # then the time of day: hours, maybe minutes and seconds
    r"\d{2}(?::\d{2}(?::\d{2})?|\d{2}(?:\d{2})?)?"
    r"(?:[.,]\d{1,6})?"  # a fraction, to the microsecond (what is stored)
    r"(?:Z|[+-]\d{2}(?::?\d{2})?)?",  # and the timezone, if any
    re.ASCII)


_SPACE_FOR_PLUS = re.compile(r".*\d \d{2}(?::?\d{2})?", re.ASCII)
"""`...T00:00:00 01:00`: a `+` offset that a URL query string turned into a space."""


class NoSuchTime(ValueError):
    """Text in the shape of an ISO 8601 date-time that names no real one (`2027-02-29`,
    `24:00`, a leap second `23:59:60`); its message says which part is out of range."""


def parse_iso_datetime(text: str) -> datetime:
    """`text` read as an ISO 8601 date and time of day (with or without a timezone);
    `ValueError` unless it has exactly that shape and is a real date and time
    (`NoSuchTime` when the shape is right)."""
    if not ISO_DATETIME.fullmatch(text):
        raise ValueError(f"not an ISO 8601 date-time: {text!r}")
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        # Python's own words: "day is out of range for month", "hour must be in 0..23"
        reason = str(exc).split(": '")[0]
        if reason.startswith("offset must be a timedelta"):  # Python's, in its own terms
            reason = "its UTC offset is out of range (offsets run from -23:59 to +23:59)"
        leap = " (leap seconds are not kept: write :59)" if "second must be" in reason else ""
        raise NoSuchTime(f"{text!r} is not a real date and time: {reason}{leap}") from None


def iso_mistake(text: str) -> str:
    """What is wrong with `text`, which `parse_iso_datetime` refused, beyond its shape: a
    date or time out of range, or a `+` lost in a URL; "" when nothing more can be said."""
    try:
        parse_iso_datetime(text)
    except NoSuchTime as exc:
        return str(exc)
    except ValueError:
        if _SPACE_FOR_PLUS.fullmatch(text) and ISO_DATETIME.fullmatch(
                re.sub(r" (\d{2}(?::?\d{2})?)$", r"+\1", text)):
            return (f"{text!r} has a space where its offset's + would be: in a URL query "
                    "string + stands for a space, so write it as %2B (or give the time in "
                    "UTC, with Z)")
    return ""


def formatted(value: datetime, fmt: str) -> str:
    """`value.strftime(fmt)` with `%Y` always four digits: the C library writes year 1 as
    "1", so 0001-01-01 would read as "1-01-01"."""
    return value.strftime(fmt.replace("%Y", f"{value.year:04d}"))
