"""Array parameters of the per-job batch statements, as Postgres array literals. psycopg
dumps a Python list element by element in Python, about 0.8 us an element; numbers, UUIDs
and enum labels need no quoting, so one join builds the same array's text. Values that can
hold any text (errors, tracebacks) stay lists, which psycopg quotes."""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID


def numbers(values: Iterable[int | float]) -> str:
    """`{1,2.5,3}`: ints and floats (finite: `repr` of a float reads back exactly)."""
    return "{" + ",".join(map(repr, values)) + "}"


def uuids(values: Iterable[UUID]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def labels(values: Iterable[str]) -> str:
    """Enum labels: lower-case words, which an array literal takes unquoted."""
    return "{" + ",".join(values) + "}"


def booleans(values: Iterable[bool]) -> str:
    return "{" + ",".join("t" if v else "f" for v in values) + "}"
