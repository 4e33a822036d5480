"""`tock limits [list] | set SCOPE KEY [--max-running N] [--rate R[/UNIT] [--per S] [--burst B]]
| remove SCOPE KEY`: fleet-wide concurrency and rate limits on a kind or a tenant, and
concurrency limits on each concurrency key of a kind. SCOPE is `kind`, `tenant` or
`kind_key` (KEY is then the kind); `--no-tenant` in place of KEY addresses the jobs without
a tenant. A change applies from the timers' next pass."""

from __future__ import annotations

import argparse
import sys

from cli import audit, connect
from cli.arguments import Sub, add_common, integer, number_type, seconds
from cli.output import Count, print_json, print_table
from shared.core.errors import InvalidInput
from shared.core.limits import SCOPES, rate_text
from shared.core.reports import LimitInfo

EXIT_OK, EXIT_REFUSED = 0, 1
NO_TENANT_LABEL = "(no tenant)"


def _key(args: argparse.Namespace) -> str | None:
    if args.no_tenant:
        if args.scope != "tenant" or args.key is not None:
            raise InvalidInput("--no-tenant goes with the scope tenant and no KEY")
        return None
    if args.key is None:
        raise InvalidInput(f"say which {args.scope}: give a KEY"
                           + (" or --no-tenant" if args.scope == "tenant" else ""))
    if args.key == "" and args.scope == "tenant":
        # An unset shell variable ("$TENANT") would otherwise pause or free every job
        # without a tenant: that takes saying so.
        raise InvalidInput("the tenant is empty: for the jobs without a tenant, say "
                           "--no-tenant")
    return str(args.key)


RATE_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
"""The periods a rate is shown in (`30/min`), which `--rate` takes back."""


def rate_type(text: str) -> tuple[float, float | None]:
    """`--rate R` or `--rate R/UNIT` (s, min, h: as `tock limits` shows rates): (R, the
    unit's seconds, or None when the period is --per's)."""
    number, slash, unit = text.partition("/")
    if slash and unit not in RATE_UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the period after '/' is one of {', '.join(RATE_UNITS)} "
            "(or give --rate R --per SECONDS)")
    rate = number_type("a number, or a number per s, min or h (30/min)")(number)
    return rate, RATE_UNITS[unit] if slash else None


def _json(limit: LimitInfo) -> dict[str, object]:
    """A limit as GET /api/limits gives it (`key` null: the jobs without a tenant)."""
    return {"scope": limit.scope, "key": None if limit.scope == "tenant" and not limit.key
            else limit.key, "max_running": limit.max_running, "in_flight": limit.in_flight,
            "keys_at_limit": limit.keys_at_limit, "lingering": limit.lingering,
            "rate_per_second": limit.rate_per_second, "burst": limit.burst,
            "tokens": limit.tokens, "seconds_to_next_token": limit.seconds_to_next_token,
            "waiting": limit.waiting, "waiting_more": limit.waiting_more}


def _label(limit: LimitInfo) -> str:
    return NO_TENANT_LABEL if limit.scope == "tenant" and not limit.key else limit.key


def _running(limit: LimitInfo) -> str:
    if limit.max_running is None:
        return "-"
    # Handlers still running for jobs that left their worker hold slots too.
    lingering = f" ({limit.lingering} lingering)" if limit.lingering else ""
    if limit.scope == "kind_key":
        full = f"{limit.keys_at_limit} key{'' if limit.keys_at_limit == 1 else 's'} full"
        return f"{limit.in_flight} ({full})/{limit.max_running} per key{lingering}"
    return f"{limit.in_flight}/{limit.max_running}{lingering}"


def _row(limit: LimitInfo) -> list[object]:
    running = _running(limit)
    rate = "-" if limit.rate_per_second is None else rate_text(limit.rate_per_second)
    tokens = "-" if limit.tokens is None else f"{limit.tokens:.1f}/{limit.burst}"
    waiting = Count(limit.waiting, limit.waiting_shown)
    return [limit.scope, _label(limit), running, rate, tokens, waiting]


def _list(args: argparse.Namespace) -> int:
    with connect.client(args) as client:
        found = client.limits()
    if args.json:
        print_json([_json(limit) for limit in found])
        return EXIT_OK
    if not found:
        print("no limits: every kind and tenant dispatches as fast as the timers go")
        return EXIT_OK
    print_table(["scope", "key", "running/max", "rate", "tokens", "waiting"],
                [_row(limit) for limit in found])
    return EXIT_OK


def _set(args: argparse.Namespace) -> int:
    if all(v is None for v in (args.max_running, args.rate, args.per, args.burst)):
        raise InvalidInput("give --max-running N, --rate R (per --per SECONDS, default 1), "
                           "or both")
    key = _key(args)
    rate, per = (None, None) if args.rate is None else args.rate
    if per is not None and args.per is not None:
        raise InvalidInput("give the rate's period once: --rate 30/min, or --rate 30 "
                           "--per 60")
    per = args.per if per is None else per
    with connect.client(args) as client:
        before = next((x for x in client.limits() if x.scope == args.scope
                       and x.key == (key or "")), None)
        limit = client.set_limit(args.scope, key, max_running=args.max_running,
                                 rate=rate, per=per, burst=args.burst)
        unknown = limit.scope != "tenant" and not client.known_kinds.knows(limit.key)
    dropped = " or ".join(limit.no_longer_has(before))
    if dropped:  # `set` replaces the whole limit: say what the new one no longer has
        print(f"tock: note: this replaced the limit, which no longer has {dropped}; give "
              "every part of a limit in one set", file=sys.stderr)
    audit.action("limit_set", scope=limit.scope, key=limit.key, max_running=limit.max_running,
                 rate_per_second=limit.rate_per_second, burst=limit.burst)
    if unknown:  # set all the same: its consumers may not be deployed yet
        print(f"tock: note: no consumer has announced a handler for kind {limit.key!r} in "
              "the last 24 hours (a typo?); the limit is set and applies to that kind's "
              "jobs", file=sys.stderr)
    if args.json:
        print_json(_json(limit))
        return EXIT_OK
    print_table(["scope", "key", "running/max", "rate", "tokens", "waiting"], [_row(limit)])
    return EXIT_OK


def _remove(args: argparse.Namespace) -> int:
    key = _key(args)
    with connect.client(args) as client:
        removed = client.remove_limit(args.scope, key)
    audit.action("limit_removed", scope=args.scope, key=key, removed=removed)
    name = NO_TENANT_LABEL if key is None else key
    if args.json:  # nothing removed still exits 1 below (DELETE /api/limits: 404)
        print_json({"scope": args.scope, "key": key, "removed": removed})
    if not removed:  # refused, as deleting a schedule that does not exist is
        print(f"tock: {args.scope} {name} has no limit; nothing removed", file=sys.stderr)
        return EXIT_REFUSED
    if not args.json:
        print(f"{args.scope} {name}: limit removed")
    return EXIT_OK


def add_parser(sub: Sub) -> None:
    """Register `tock limits ...`."""
    p = sub.add_parser("limits",
                       help="concurrency and rate limits per kind, tenant or key of a kind",
                       description="At most N jobs of a kind or tenant (or of each "
                                   "concurrency key of a kind: scope kind_key) dispatched or "
                                   "running at once across the fleet, and/or at most R "
                                   "dispatches per S seconds. Jobs over a limit wait in "
                                   "Postgres.")
    add_common(p)
    p.set_defaults(func=_list)
    actions = p.add_subparsers(dest="action", metavar="[ACTION]",
                                title="actions (none: list)")
    a = actions.add_parser("list", help="every limit with its use and the jobs waiting")
    add_common(a, after_action=True)
    a.set_defaults(func=_list)
    for name, text, func in (("set", "create or replace a limit", _set),
                             ("remove", "drop a limit", _remove)):
        a = actions.add_parser(name, help=text)
        a.add_argument("scope", choices=SCOPES)
        a.add_argument("key", nargs="?", metavar="KEY",
                       help="the kind (scopes kind, kind_key) or the tenant")
        a.add_argument("--no-tenant", action="store_true",
                       help="(scope tenant) the jobs enqueued without a tenant")
        if name == "set":
            a.add_argument("--max-running", type=integer, metavar="N",
                           help="jobs dispatched or running at once (kind_key: per "
                                "concurrency key; 0 holds them all)")
            a.add_argument("--rate", type=rate_type, metavar="R",
                           help="dispatches per --per, or per a unit: 30/min, 5/s, 1/h")
            a.add_argument("--per", type=seconds, metavar="SECONDS",
                           help="the rate's period (default 1 s)")
            a.add_argument("--burst", type=integer, metavar="B",
                           help="tokens the bucket holds (default: one second's worth)")
        add_common(a, after_action=True)
        a.set_defaults(func=func)
