"""`Parser`: the argument parser of every tock command line (`tock ...`, `python -m
consumer`, `python -m timer_service`, `python -m dashboard`).

Two of argparse's defaults let a command act on something other than what was typed:
an abbreviated option (`--stat` for `--state`) is taken for the option it starts, and an
option that takes one value, given twice (`--kind email --kind sync`, `--queues a
--queues b`), keeps the last silently. Both are refused here, as the HTTP API refuses
`?stat=` and a repeated query parameter. Options meant to repeat say so with
`action="append"` or `"extend"`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

_GIVEN = "_tock_options_given"
"""The namespace attribute that records which single-value options were given."""


class _Once(argparse._StoreAction):
    """`store`, refusing a second value for the same destination."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None
                 ) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if option_string is not None and self.dest in given:
            names = "/".join(self.option_strings)
            parser.error(f"{names} was given more than once; it takes one value")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """No abbreviated options, and no single-value option given twice, in this parser and
    in its subcommands' (they are of this class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _Once)
        self.register("action", "store", _Once)
