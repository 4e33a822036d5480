"""`tock tenants [list] | weight TENANT N | reset TENANT`: the fair share between tenants.
`list` shows each tenant's weight and unfinished work; `weight` changes its share of every
dispatch batch from the timers' next pass on. `--no-tenant` in place of TENANT addresses the
jobs enqueued without a tenant, which share as one tenant."""

from __future__ import annotations

import argparse

from cli import audit, connect
from cli.arguments import Sub, add_common, plain_integer
from cli.output import age, approx, print_json, print_table
from shared.core.errors import InvalidInput

EXIT_OK, EXIT_REFUSED = 0, 1
NO_TENANT_LABEL = "(no tenant)"


def _tenant(args: argparse.Namespace, *, with_weight: bool) -> tuple[str | None, int]:
    """(tenant, weight) from `TENANT [N]` or `--no-tenant [N]`."""
    values: list[str] = args.values
    expected = int(not args.no_tenant) + int(with_weight)
    if len(values) != expected:
        usage = "--no-tenant" if args.no_tenant else "TENANT"
        missing = ("; the weight N (1..1000) is missing"
                   if with_weight and len(values) == expected - 1 else
                   f"; {len(values) - expected} argument(s) too many"
                   if len(values) > expected and not args.no_tenant else
                   "; give a TENANT or --no-tenant, one of the two")
        raise InvalidInput(f"expected {usage}{' N' if with_weight else ''}, got "
                           f"{' '.join(values) or 'nothing'}{missing}")
    tenant = None if args.no_tenant else values[0]
    return tenant, _weight_of(values[-1]) if with_weight else 0


def _weight_of(text: str) -> int:
    try:
        return plain_integer(text)
    except ValueError:
        raise InvalidInput(f"weight must be an integer 1..1000, got {text!r}") from None


def _list(args: argparse.Namespace) -> int:
    with connect.operator_store(args) as store:
        found = store.tenant_stats()
    if args.json:
        print_json([{**t.__dict__, "tenant": t.tenant or None} for t in found])
        return EXIT_OK
    if not found:
        print("no tenant has unfinished work or a weight set")
        return EXIT_OK
    sampled = any(t.estimated for t in found)
    print_table(["tenant", "weight", "due", "in sqs", "running", "later", "oldest due s"], [
        [t.tenant or NO_TENANT_LABEL, t.weight, approx(t.due, sampled), t.dispatched,
         t.running, approx(t.future, sampled), age(t.oldest_due_age_seconds, t.due)]
        for t in found])
    if sampled:
        print("(~: sampled, since more than 10,000 jobs wait)")
    return EXIT_OK


def _weight(args: argparse.Namespace) -> int:
    tenant, weight = _tenant(args, with_weight=True)
    with connect.client(args) as client:
        client.set_tenant_weight(tenant, weight)
    audit.action("tenant_weight_set", tenant=tenant, weight=weight)
    if args.json:
        print_json({"tenant": tenant, "weight": weight})
        return EXIT_OK
    print(f"{tenant or NO_TENANT_LABEL}: weight {weight}")
    return EXIT_OK


def _reset(args: argparse.Namespace) -> int:
    tenant, _ = _tenant(args, with_weight=False)
    with connect.client(args) as client:
        had = client.reset_tenant_weight(tenant)
    audit.action("tenant_weight_set", tenant=tenant, weight=1)
    if args.json:
        print_json({"tenant": tenant, "weight": 1, "was_set": had})
        return EXIT_OK
    print(f"{tenant or NO_TENANT_LABEL}: weight 1 (the default)" if had else
          f"{tenant or NO_TENANT_LABEL}: had no weight set; it stays at 1")
    return EXIT_OK


def add_parser(sub: Sub) -> None:
    """Register `tock tenants ...`."""
    p = sub.add_parser("tenants", help="fair share: tenants' weights and unfinished work",
                       description="Each tenant with due jobs gets a share of every "
                                   "dispatch batch in proportion to its weight (default 1).")
    add_common(p)
    p.set_defaults(func=_list)
    actions = p.add_subparsers(dest="action", metavar="[ACTION]",
                                title="actions (none: list)")
    a = actions.add_parser("list", help="weight, due, in SQS, running and later per tenant")
    add_common(a, after_action=True)
    a.set_defaults(func=_list)
    for name, text, func, usage in (
            ("weight", "set a tenant's weight (1..1000)", _weight, "TENANT N | --no-tenant N"),
            ("reset", "back to the default weight of 1", _reset, "TENANT | --no-tenant")):
        a = actions.add_parser(name, help=text, usage=f"tock tenants {name} {usage}")
        a.add_argument("values", nargs="*", metavar="TENANT N" if name == "weight" else "TENANT")
        a.add_argument("--no-tenant", action="store_true",
                       help="the jobs enqueued without a tenant")
        add_common(a, after_action=True)
        a.set_defaults(func=func)
