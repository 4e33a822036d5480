"""`tock schedules list | show NAME | preview NAME [-n N] | pause NAME | resume NAME |
delete NAME`: look after recurring schedules. Tables for people, `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from cli import audit
from cli.arguments import add_common, integer
from shared.core.iso_time import formatted
from shared.runtime.command_line import Parser

EXIT_OK, EXIT_REFUSED = 0, 1


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tock schedules ...`."""
    p = sub.add_parser("schedules", help="list, inspect, preview, pause, resume or delete "
                                         "recurring schedules",
                       description="Recurring schedules (every N seconds or cron), made in "
                                   "code with shared.client.recurring(...) (README, Recurring "
                                   "schedules); "
                                   "the timers turn each fire time into one job.")
    add_common(p)
    # The same options also after the action (`tock schedules list --json`).
    after = Parser(add_help=False)
    add_common(after, after_action=True)
    # No action lists them, as `tock tenants` and `tock limits` do.
    actions = p.add_subparsers(dest="action", metavar="[ACTION]",
                                title="actions (none: list)")
    actions.add_parser("list", help="every schedule, its timing and next fire time",
                       parents=[after])
    for name, text in (("show", "one schedule: definition, recent runs, slots not run"),
                       ("pause", "stop firing (jobs already made are left alone)"),
                       ("resume", "fire again from the next slot; audit the paused slots"),
                       ("delete", "delete the schedule and its audit records")):
        a = actions.add_parser(name, help=text, parents=[after])
        a.add_argument("name")
    a = actions.add_parser("preview", help="the next fire times, after time zone, DST and "
                                           "spreading", parents=[after])
    a.add_argument("name")
    a.add_argument("-n", type=integer, default=10, help="how many (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shared.core.errors import ScheduleNotFound

    try:
        with _client(args) as client:
            if args.action in (None, "list"):
                items = client.list_schedules()
                return _out(args, [_stored(i) for i in items], _table_of_schedules(items))
            if args.action == "show":
                sched = client.get_schedule(args.name)
                runs = client.schedule_runs(args.name)
                events = client.schedule_history(args.name)
                data = {"schedule": _stored(sched), "runs": runs, "not_run": events}
                return _out(args, data, _show(sched, runs, events))
            if args.action == "preview":
                fires = client.preview_schedule(args.name, args.n)
                text = _table_of_fires(fires)
                if client.get_schedule(args.name).paused:
                    text += ("\npaused: the fire times it would have; none fires until "
                             f"`tock schedules resume {args.name}`")
                return _out(args, fires, text)
            if args.action == "pause":
                sched = client.pause_schedule(args.name)
                if not sched.changed:
                    return _out(args, sched, f"{sched.name} was already paused; nothing "
                                             "changed")
                audit.action("schedule_paused", schedule=sched.name)
                return _out(args, sched, f"paused {sched.name}")
            if args.action == "resume":
                sched = client.resume_schedule(args.name)
                if not sched.changed:
                    return _out(args, sched, f"{sched.name} was not paused; nothing changed "
                                             f"(next fire {_time(sched.next_fire_at)})")
                audit.action("schedule_resumed", schedule=sched.name)
                return _out(args, sched, f"resumed {sched.name}; next fire "
                                         f"{_time(sched.next_fire_at)}")
            client.delete_schedule(args.name)
            audit.action("schedule_deleted", schedule=args.name)
            return _out(args, {"deleted": args.name}, f"deleted {args.name}")
    except ScheduleNotFound as exc:
        print(f"tock: {exc}", file=sys.stderr)
        return EXIT_REFUSED


@contextmanager
def _client(args: argparse.Namespace) -> Iterator[Any]:
    """A client once the database has answered and is migrated, as for every other command
    (cli.connect): the same errors, naming the CLI's settings, not the Python client's."""
    from cli.connect import client

    with client(args) as opened:
        yield opened


def _out(args: argparse.Namespace, data: Any, text: str) -> int:
    if args.json:
        print(json.dumps(_plain(data), indent=2))
    else:
        print(text)
    return EXIT_OK


def _stored(sched: Any) -> dict[str, Any]:
    """A schedule as listed: without `changed`, which only says what a pause, a resume or
    `recurring()` did."""
    return {k: v for k, v in _plain(sched).items() if k != "changed"}


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    return value


def _time(value: datetime | None) -> str:
    return formatted(value, "%Y-%m-%d %H:%M:%S%z").replace("+0000", "Z") if value else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    return "\n".join(lines)


def _table_of_schedules(items: list[Any]) -> str:
    if not items:
        return "no schedules"
    rows = [(s.name, s.kind, s.describe(), "paused" if s.paused else "active",
             _next_fire(s), f"misfire={s.misfire.value} overlap={s.overlap.value}")
            for s in items]
    return _table(("NAME", "KIND", "WHEN", "STATE", "NEXT FIRE (UTC)", "POLICIES"), rows)


def _next_fire(sched: Any) -> str:
    """A paused schedule fires nothing: its stored next fire time is not one."""
    return "- (paused)" if sched.paused else _time(sched.next_fire_at)


def _table_of_fires(fires: list[Any]) -> str:
    rows = [(str(i), _time(f.fire_at), formatted(f.local, "%Y-%m-%d %H:%M:%S %Z%z"),
             f.note or "") for i, f in enumerate(fires, 1)]
    return _table(("#", "FIRES AT (UTC)", "LOCAL", "NOTE"), rows)


def _show(sched: Any, runs: list[Any], events: list[Any]) -> str:
    fields = [
        ("name", sched.name), ("kind", sched.kind), ("queue", sched.queue),
        ("payload", json.dumps(sched.payload)), ("when", sched.describe()),
        ("state", "paused" if sched.paused else "active"),
        ("next slot", _time(sched.next_slot)), ("next fire", _next_fire(sched)),
        ("misfire", f"{sched.misfire.value} (grace {sched.misfire_grace_seconds:g} s, "
                    f"backfill max {sched.backfill_max}, gap {sched.backfill_gap_seconds:g} s)"),
        ("overlap", sched.overlap.value),
        ("dst", f"gap={sched.dst_gap.value} fold={sched.dst_fold.value}"),
        ("spread", f"{sched.spread_seconds:g} s, jitter {sched.jitter_seconds:g} s"),
        ("buffered slot", _time(sched.buffered_slot)),
    ]
    out = [f"{k + ':':<15}{v}" for k, v in fields]
    out += ["", "recent runs:"]
    out.append(_table(("JOB", "SLOT (UTC)", "STATE"),
                      [(str(r.job_id), _time(r.slot), r.state) for r in runs])
               if runs else "  none")
    out += ["", "slots not run:"]
    out.append(_table(
        ("RECORDED", "REASON", "FIRST SLOT", "LAST SLOT", "SLOTS", "DETAIL"),
        [(_time(e.recorded_at), e.reason, _time(e.first_slot), _time(e.last_slot),
          "?" if e.slot_count is None else str(e.slot_count), e.detail or "")
         for e in events]) if events else "  none")
    return "\n".join(out)
