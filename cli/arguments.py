"""The arguments the operator commands share: argument types (ISO 8601 times, job ids), the
`--database-url`/`--json` pair, and the job filter flags with the `JobFilter` they make."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shared.core.filters import JobFilter
from shared.core.states import JobState

Sub = Any  # argparse._SubParsersAction is private; its type adds nothing here


def iso_time_type(name: str) -> Callable[[str], datetime]:
    def parse(text: str) -> datetime:
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name}: {text!r} is not an ISO 8601 time such as "
                "2026-12-02T15:04:05+00:00") from None
        if value.tzinfo is None:
            raise argparse.ArgumentTypeError(
                f"{name}: {text!r} has no timezone; add one, e.g. {text}+00:00 or {text}Z")
        return value.astimezone(UTC)  # Postgres refuses offsets beyond 15:59
    return parse


def job_id_type(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"job ids are positive, got {value}")
    return value


def add_common(p: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    p.add_argument("--database-url", help="default: TOCK_DATABASE_URL")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filter")
    g.add_argument("--state", action="append", default=[], metavar="STATE",
                   help=f"repeatable or comma-separated: {', '.join(s.value for s in JobState)}")
    g.add_argument("--kind")
    g.add_argument("--queue")
    g.add_argument("--tenant")
    g.add_argument("--key", help="idempotency key")
    g.add_argument("--since", type=iso_time_type("--since"),
                   help="created at or after (ISO 8601)")
    g.add_argument("--until", type=iso_time_type("--until"), help="created before (ISO 8601)")


def filter_of(args: argparse.Namespace) -> JobFilter:
    states = ",".join(args.state)
    return JobFilter.of(states=states, kind=args.kind, queue=args.queue, tenant=args.tenant,
                        key=args.key, created_after=args.since, created_before=args.until)
