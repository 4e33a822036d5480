"""Text that has to fit in a database column: error messages and tracebacks come from
handlers, which may put anything in an exception (NUL bytes, lone surrogates, megabytes)."""

from __future__ import annotations

ELLIPSIS = " [...]"


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
    except Exception as inner:  # a broken __str__ must not break error handling
        message = f"<str() raised {type(inner).__name__}>"
    name = type(exc).__name__
    return f"{name}: {message}" if message else name
