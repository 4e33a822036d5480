"""`tock stats`, `tock workers` and `tock dashboard`: the state of the whole system (jobs by
state, queue depth, consumers and their heartbeats) and the dashboard that shows it."""

from __future__ import annotations

import argparse

from cli import connect
from cli.arguments import Sub, add_common, integer_type, positive_seconds
from cli.output import age, bounded, print_json, print_table
from shared.core.filters import FINISHED_STATES
from shared.core.states import JobState
from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO

EXIT_OK = 0
WORKER_STALE_SECONDS = 30.0


def _stats(args: argparse.Namespace) -> int:
    with connect.operator_store(args) as store, store.transaction() as tx:
        now = tx.database_now()
        unfinished = tx.unfinished(now)
        counts = dict(unfinished.counts)
        finished, estimated = tx.finished_counts(FINISHED_STATES)
        counts.update(finished)
        estimated |= unfinished.estimated
        queues = unfinished.queues
    totals = {s.value: 0 for s in JobState}
    for (state, _), n in counts.items():
        totals[state] += n
    if args.json:
        print_json({"now": now, "totals": totals, "estimated": sorted(estimated),
                    "queues": [{**q.__dict__, "depth": q.depth} for q in queues]})
        return EXIT_OK
    print("  ".join(f"{state} {'~' if state in estimated else ''}{n}"
                    for state, n in totals.items()))
    if estimated:
        print("(~: estimated past a bound: history partitions past 20,000 jobs, unfinished "
              "(queue, kind, state) ranges past 10,000)")
    print()
    if not queues:
        print("no unfinished work")
        return EXIT_OK
    print_table(["queue", "kind", "due", "in sqs", "running", "later", "oldest due s"], [
        [q.queue, q.kind, *(bounded(n, q.estimated, UNFINISHED_EXACT_UP_TO)
                            for n in (q.due, q.dispatched, q.running, q.future)),
         # The age counts the jobs waiting in SQS too (dispatched, unclaimed), as the
         # API's and the gauge's do: a queue no consumer takes shows its age.
         age(q.oldest_due_age_seconds, q.due + q.dispatched)] for q in queues])
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    with connect.operator_store(args) as store:
        found = store.workers(stale_after_seconds=args.stale_seconds)
    if args.json:
        print_json(found)
        return EXIT_OK
    if not found:
        print("no consumer has reported in the last hour")
        return EXIT_OK
    print_table(["worker", "status", "queues", "busy", "heartbeat age s", "started"], [
        [w.id, w.status, ",".join(w.queues), f"{w.in_flight}/{w.concurrency}",
         round(w.heartbeat_age_seconds, 1), w.started_at] for w in found])
    return EXIT_OK


def _dashboard(args: argparse.Namespace) -> int:
    from dashboard.__main__ import main as dashboard_main

    argv = [*(["--host", args.host] if args.host else []),
            *(["--port", str(args.port)] if args.port is not None else [])]
    return dashboard_main(argv, prog="tock dashboard")


def add_parser(sub: Sub) -> None:
    """Register `tock stats`, `tock workers` and `tock dashboard`."""
    p = sub.add_parser("stats", help="jobs by state; queue depth and oldest due age",
                       description="Jobs by state, and per queue and kind the due, "
                                   "dispatched, running and later jobs with the age of "
                                   "the oldest due one.")
    add_common(p)
    p.set_defaults(func=_stats)

    p = sub.add_parser("workers", help="consumers and their last heartbeat",
                       description="The consumers running or stopped in the last hour, "
                                   "live ones first, with their queues, busy handler slots "
                                   "(a stale or stopped one's: the jobs it still holds) and "
                                   "the age of their last heartbeat.")
    p.add_argument("--stale-seconds", type=positive_seconds, default=WORKER_STALE_SECONDS,
                   metavar="SECONDS",
                   help="a worker is stale once its lease has expired, or at the latest "
                        "once silent this long (default 30)")
    add_common(p)
    p.set_defaults(func=_workers)

    p = sub.add_parser("dashboard", help="serve the dashboard and HTTP API "
                                         "(python -m dashboard)",
                       description="Serve the dashboard, its HTTP API, /metrics, /healthz "
                                   "and /readyz, as python -m dashboard does; settings come "
                                   "from TOCK_DASHBOARD_* environment variables.")
    p.add_argument("--host", help="default TOCK_DASHBOARD_HOST or 127.0.0.1")
    p.add_argument("--port", type=integer_type("a port number"),
                   help="default TOCK_DASHBOARD_PORT or 8080")
    # The dashboard logs unknown TOCK_* variables itself, as every tock process does.
    p.set_defaults(func=_dashboard, warns_of_settings=True)
