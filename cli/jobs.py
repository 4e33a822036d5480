"""`tock enqueue`, `tock jobs` and `tock show`: put a job in, list jobs a page at a time, and
show one job with its attempts and why it is (not) running."""

from __future__ import annotations

import argparse
import json

from cli import connect
from cli.arguments import Sub, add_common, add_filters, filter_of, iso_time_type, job_id_type
from cli.output import cell, print_json, print_table
from shared.core.errors import InvalidInput
from shared.core.filters import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from shared.ops import explain
from shared.ops import jobs as ops_jobs

EXIT_OK = 0


def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("--payload is nested too deeply to be read") from None
    with connect.client(args) as client:
        job = client.schedule(args.kind, payload, at=args.at, delay=args.delay, key=args.key,
                              priority=args.priority, queue=args.queue,
                              max_attempts=args.max_attempts, timeout=args.timeout,
                              tenant=args.tenant, concurrency_key=args.concurrency_key)
    if args.json:
        print_json(job)
    elif job.created:
        print(f"enqueued job {job.id} ({job.kind}) on queue {job.queue}, due "
              f"{job.run_at.isoformat(timespec='seconds')}")
    else:
        print(f"job {job.id} already exists with key {job.unique_key!r} ({job.state}); "
              "nothing enqueued")
    return EXIT_OK


def _jobs(args: argparse.Namespace) -> int:
    where = filter_of(args)
    with connect.operator_store(args) as store:
        page = ops_jobs.list_jobs(store, where, limit=args.limit, before_id=args.before_id)
    if args.json:
        print_json({"jobs": page.jobs, "next_cursor": page.next_cursor})
        return EXIT_OK
    print_table(["id", "kind", "queue", "state", "attempt", "run at", "last error"], [
        [j.id, j.kind, j.queue, j.state,
         f"{j.attempt}/{j.max_attempts}" if j.max_attempts else str(j.attempt), j.run_at,
         j.last_error] for j in page.jobs])
    if not page.jobs:
        print(f"no jobs match ({where.describe()})")
    if page.next_cursor:
        print(f"more: add --before-id {page.next_cursor}")
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with connect.client(args) as client, connect.operator_store(args) as store:
        job = client.get(args.job_id, with_attempts=True)
        with store.transaction() as tx:
            why = explain.explain(job, explain.gather(tx, job))
    if args.json:
        print_json({"job": job, "explanation": why})
        return EXIT_OK
    print(f"job {job.id}  {job.kind}  [{job.state}]")
    print()
    print(why.text())
    print()
    rows = [("queue", job.queue), ("priority", job.priority),
            ("attempt", f"{job.attempt} of {job.max_attempts or '(task default)'}"),
            ("run at", job.run_at), ("key", job.unique_key), ("tenant", job.tenant),
            ("concurrency key", job.concurrency_key),
            ("lease", f"{job.lease_owner} until {cell(job.lease_expires_at)}"
             if job.lease_owner else None),
            ("created", job.created_at), ("finished", job.finished_at),
            ("payload", json.dumps(job.payload))]
    for name, value in rows:
        if value is not None:
            print(f"  {name:<9} {value if name == 'payload' else cell(value)}")
    if job.attempts:
        print()
        print_table(["attempt", "outcome", "worker", "started", "finished", "error"], [
            [a.attempt, a.outcome, a.worker, a.started_at, a.finished_at, a.error]
            for a in job.attempts])
    return EXIT_OK


def add_parser(sub: Sub) -> None:
    """Register `tock enqueue`, `tock jobs` and `tock show`."""
    p = sub.add_parser("enqueue", help="enqueue a job",
                       description="Enqueue one job now, at a time, or after a delay.")
    p.add_argument("kind")
    p.add_argument("--payload", help="JSON, e.g. '{\"to\": \"a@example.com\"}'")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", type=iso_time_type("--at"),
                      help="run at (ISO 8601 with timezone)")
    when.add_argument("--delay", type=float, help="run after this many seconds")
    p.add_argument("--key", help="idempotency key: an existing job with it is returned")
    p.add_argument("--priority", type=int, default=0, help="0..9, higher first (default 0)")
    p.add_argument("--queue")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--timeout", type=float, help="seconds per attempt")
    p.add_argument("--tenant")
    p.add_argument("--concurrency-key", metavar="KEY",
                   help="what a per-key limit of the kind counts the job under")
    add_common(p)
    p.set_defaults(func=_enqueue)

    p = sub.add_parser("jobs", help="list jobs (newest first) with filters",
                       description="List jobs, newest first, a page at a time.")
    add_filters(p)
    p.add_argument("--limit", type=int, default=DEFAULT_PAGE_SIZE,
                   help=f"1..{MAX_PAGE_SIZE} (default "
                        f"{DEFAULT_PAGE_SIZE})")
    p.add_argument("--before-id", type=job_id_type,
                   help="page cursor printed by the last page")
    add_common(p)
    p.set_defaults(func=_jobs)

    p = sub.add_parser("show", help="a job, its attempts and why it is (not) running",
                       description="Show a job with its attempt history and the "
                                   "explanation of its current state.")
    p.add_argument("job_id", type=job_id_type, metavar="JOB")
    add_common(p)
    p.set_defaults(func=_show)
