"""Text that has to fit in a database column: error messages and tracebacks come from
handlers, which may put anything in an exception (NUL bytes, lone surrogates, megabytes).
And values quoted in error messages, in the words a user would write them."""

from __future__ import annotations

import math
from datetime import date, time, timedelta
from decimal import Decimal

ELLIPSIS = " [...]"
SHOWN_TEXT_LIMIT = 60
# Python decodes a byte that is not UTF-8 (in a command-line argument, say) to one of these.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def storable(text: str) -> str:
    """`text` with what Postgres cannot store made visible instead: NUL as `\\x00`, lone
    surrogates as `\\udXXX` escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bounded(text: str, limit: int, suffix: str = "", *, keep: str = "head") -> str:
    """`text` + `suffix`, storable and at most `limit` characters in all: the text is cut
    (marked with an ellipsis) to leave room for the whole suffix. `keep="tail"` keeps the
    end of the text instead (tracebacks: the innermost frames matter)."""
    text, suffix = storable(text), storable(suffix)
    room = limit - len(suffix)
    if room < 0:
        return suffix[:limit]
    if len(text) <= room:
        return text + suffix
    mark = ELLIPSIS if room >= len(ELLIPSIS) else ""
    room -= len(mark)
    cut = text[:room] + mark if keep == "head" else mark + text[len(text) - room:]
    return cut + suffix


def describe(exc: BaseException) -> str:
    """`Type: message`, even for an exception whose `__str__` raises."""
    try:
        message = str(exc)
    except BaseException as inner:
        # A broken __str__ (one raising SystemExit too) must not break error handling: it
        # would escape the loop that records a handler's outcome, on every attempt.
        message = f"<str() raised {type(inner).__name__}>"
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def shown(value: object) -> str:
    """`value` for an error message, as the user would write it: text quoted (cut to
    SHOWN_TEXT_LIMIT characters), numbers as digits, times in ISO 8601, durations in
    seconds, None as null, booleans as True/False (the checks that use this guard Python
    calls: the HTTP API's strict request models refuse a JSON true where these expect
    something else, before them); anything else by its type. Never a Python repr such as
    `datetime.datetime(2027, 1, 1, 0, 0)`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        if value.bit_length() < 200:
            return str(value)
        # str() raises past 4300 digits, and a message has no room for them anyway
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, float):
        return repr(value)  # 0.1, 1e+16, nan, inf: as written
    if isinstance(value, str):
        cut = value if len(value) <= SHOWN_TEXT_LIMIT else value[:SHOWN_TEXT_LIMIT] + "..."
        return repr(cut)  # quoted, with control characters and stray bytes escaped
    if isinstance(value, date | time):  # datetime included
        return value.isoformat()
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} s"
    return f"a value of type {type(value).__name__}"


def utf8_problem(text: str) -> str | None:
    """Why `text` is not valid UTF-8 text, in words, or None if it is. It can hold a byte
    that is not UTF-8 (a command-line argument in another encoding arrives like that) or
    half of a UTF-16 surrogate pair (a JSON escape such as \\ud800 alone)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        where = f"at character {exc.start + 1}"
        if code in _ESCAPED_BYTES:
            return (f"the byte 0x{code - 0xDC00:02X} {where} is not UTF-8 (is the text in "
                    "another encoding?)")
        return f"{where} is an unpaired UTF-16 surrogate (\\u{code:04x})"
    return None


def decimal_integer(text: str) -> int:
    """`text` as an integer if it is one written plainly: ASCII digits with an optional
    sign. Python's int() also takes padding, underscores and non-ASCII digits (" 5",
    "1_000", Arabic-Indic digits), none of which an operator means; ValueError for those."""
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 4300:
        raise ValueError(f"not a plain integer: {text!r}")
    return int(text)


class LostNumber(ValueError):
    """A JSON number that a float would not keep: too small (read as 0), too large (read
    as infinity), or with more digits than a float holds (1.00000000000000000001 would
    be read as 1.0)."""

    def __init__(self, text: str, becomes: str) -> None:
        super().__init__(f"the number {bounded(text, 40)} {self.why(becomes)} (it would be "
                         f"read as {becomes}): send it as a string")
        self.text = text
        self.becomes = becomes

    @staticmethod
    def why(becomes: str) -> str:
        return ("is out of a float's range" if becomes in ("0", "infinity")
                else "has more digits than a float keeps")


def json_float(text: str) -> float:
    """`json.loads(parse_float=json_float)`: a JSON number with a fraction or exponent as
    a float, unless the float would not keep it: 1e-400 becomes 0.0 and 1e400 infinity,
    silently, with `float`. LostNumber for those."""
    value = float(text)
    if math.isinf(value):
        raise LostNumber(text, "infinity")
    if value == 0.0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise LostNumber(text, "0")
    # The float's shortest text is the number the payload will hold: a number it is not
    # (more digits than 17 significant ones keep) would be changed in silence.
    if Decimal(text) != Decimal(repr(value)):
        raise LostNumber(text, repr(value))
    return value
