"""Printing for people (aligned tables, short times) and for scripts (`--json`)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from enum import Enum
from typing import Any, Self, TextIO
from uuid import UUID

from shared.core.iso_time import formatted
from shared.core.jobs import Job

MAX_CELL = 60


def plain(value: Any) -> Any:
    """`value` as JSON types: dataclasses as dicts, datetimes as ISO 8601 text, enums as
    their values, UUIDs as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, UUID):
        return str(value)
    return value


def job_json(job: Job) -> dict[str, Any]:
    """A job for `--json`, its fields named as the HTTP API names them (`key`, not the
    column's `unique_key`); `created` is added by enqueue alone, the one read it means
    something to, and the attempts by `show`, beside the job as the API gives them."""
    fields = plain(job)
    fields.pop("created")
    fields.pop("attempts")
    return {("key" if name == "unique_key" else name): value
            for name, value in fields.items()}


def print_json(value: Any, out: TextIO | None = None) -> None:
    """One JSON document: dataclasses, datetimes (ISO 8601), enums and UUIDs included."""
    print(json.dumps(plain(value), indent=2, sort_keys=False), file=out or sys.stdout)


class Count(int):
    """A count whose text qualifies it ("~37" estimated, "more than 10,000"): a table
    right-aligns it as the number it is, where a string would be left-aligned."""

    text: str

    def __new__(cls, n: int, text: str) -> Self:
        count = super().__new__(cls, n)
        count.text = text
        return count

    def __str__(self) -> str:
        return self.text


def approx(n: int, estimated: bool) -> int:
    """`n` as a table cell: ~N if `estimated`."""
    return Count(n, f"~{n}") if estimated else n


def bounded(n: int, estimated: bool, bound: int) -> int:
    """A count of a (queue, kind) row whose ranges are counted up to `bound` and estimated
    past it: exact at or under the bound (no mark), ">bound" where the estimate says no
    more than the count found (statistics older than the backlog), else ~N."""
    if not estimated or n <= bound:
        return n
    return Count(n, f">{bound:,}") if n == bound + 1 else Count(n, f"~{n}")


def age(seconds: float, due: int) -> float:
    """An oldest-due age as a table cell: "-" when nothing is due (not 0.0, an age)."""
    return round(seconds, 1) if due else Count(0, "-")


# Control characters (ESC starts a terminal's escape sequences: move the cursor, clear a
# line, retitle the window) and the bidirectional-text controls (U+202E and its kin),
# which a job's key, tenant or error may hold: shown as escapes, as the dashboard shows
# them, so that no value can rewrite the screen or make itself read as another.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                          "\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with control and bidirectional-text characters as escapes (`\\x1b`,
    `\\u202e`); line breaks and tabs are kept."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return formatted(value, "%Y-%m-%d %H:%M:%S %Z").strip()
    if isinstance(value, Enum):
        return str(value.value)
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                out: TextIO | None = None) -> None:
    """Columns aligned to their widest cell; numbers right-aligned."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) and not isinstance(row[i], bool)
                   for row in rows) and bool(rows) for i in range(len(headers))]
    stream = out or sys.stdout

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    print(line([h.upper() for h in headers]), file=stream)
    for row in cells:
        print(line(row), file=stream)
