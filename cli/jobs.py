"""`tock enqueue`, `tock jobs`, `tock show`, `tock retry`, `tock cancel`, `tock stats`,
`tock workers` and `tock dashboard`: the operator commands. They talk to Postgres
directly (TOCK_DATABASE_URL or --database-url), like the services do, so they work when
the dashboard is down."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from cli.output import cell, print_json, print_table
from shared.client import Client
from shared.core.errors import InvalidInput, InvalidTransition, JobNotFound
from shared.core.filters import (
    CANCELLABLE_STATES,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    RETRYABLE_STATES,
    JobFilter,
)
from shared.core.states import JobState
from shared.ops import explain
from shared.ops import jobs as ops_jobs
from shared.runtime.settings import ClientSettings
from shared.store.database import Database
from shared.store.operator_store import OperatorStore

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
WORKER_STALE_SECONDS = 30.0

Sub = Any  # argparse._SubParsersAction is private; its type adds nothing here


def _settings(args: argparse.Namespace) -> ClientSettings:
    return ClientSettings.load(**({"database_url": args.database_url}
                                  if args.database_url else {}))


def _client(args: argparse.Namespace) -> Client:
    return Client(_settings(args))


@contextmanager
def _store(args: argparse.Namespace) -> Iterator[OperatorStore]:
    """The operator statements on a small pool of their own."""
    database = Database(_settings(args).database_url, max_size=2, name="tock-cli")
    try:
        yield OperatorStore(database)
    finally:
        database.close()


def _iso(name: str) -> Callable[[str], datetime]:
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


def _common(p: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    p.add_argument("--database-url", help="default: TOCK_DATABASE_URL")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filter")
    g.add_argument("--state", action="append", default=[], metavar="STATE",
                   help=f"repeatable or comma-separated: {', '.join(s.value for s in JobState)}")
    g.add_argument("--kind")
    g.add_argument("--queue")
    g.add_argument("--tenant")
    g.add_argument("--key", help="idempotency key")
    g.add_argument("--since", type=_iso("--since"), help="created at or after (ISO 8601)")
    g.add_argument("--until", type=_iso("--until"), help="created before (ISO 8601)")


def _filter_of(args: argparse.Namespace) -> JobFilter:
    states = ",".join(args.state)
    return JobFilter.of(states=states, kind=args.kind, queue=args.queue, tenant=args.tenant,
                        key=args.key, created_after=args.since, created_before=args.until)


# --- enqueue ---------------------------------------------------------------------------------


def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("--payload is nested too deeply to be read") from None
    with _client(args) as client:
        job = client.schedule(args.kind, payload, at=args.at, delay=args.delay, key=args.key,
                              priority=args.priority, queue=args.queue,
                              max_attempts=args.max_attempts, timeout=args.timeout,
                              tenant=args.tenant)
    if args.json:
        print_json(job)
    elif job.created:
        print(f"enqueued job {job.id} ({job.kind}) on queue {job.queue}, due "
              f"{job.run_at.isoformat(timespec='seconds')}")
    else:
        print(f"job {job.id} already exists with key {job.unique_key!r} ({job.state}); "
              "nothing enqueued")
    return EXIT_OK


# --- list and show -----------------------------------------------------------------------------


def _jobs(args: argparse.Namespace) -> int:
    where = _filter_of(args)
    with _store(args) as store:
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
    with _client(args) as client, _store(args) as store:
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


# --- retry and cancel ---------------------------------------------------------------------


def _change(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        where = _filter_of(args)
        if args.job_ids and not where.is_empty():
            raise InvalidInput("give job ids or a filter, not both")
        if not args.job_ids and where.is_empty() and not args.all:
            raise InvalidInput(f"say which jobs to {action}: job ids, a filter such as "
                               "--state dead --kind email, or --all")
        if args.job_ids:
            with _client(args) as client:
                return _change_ids(client, action, args)
        return _change_filter(action, where, args)
    return run


def _change_ids(client: Client, action: str, args: argparse.Namespace) -> int:
    status, done = EXIT_OK, []
    for job_id in args.job_ids:
        if args.dry_run:
            job = client.get(job_id)
            allowed = RETRYABLE_STATES if action == "retry" else CANCELLABLE_STATES
            ok = job.state in allowed
            print(f"job {job_id}: would {action}" if ok else
                  f"job {job_id}: cannot {action}, it is {job.state}")
            status = status if ok else EXIT_REFUSED
            continue
        try:
            job = client.retry(job_id) if action == "retry" else client.cancel(job_id)
        except (JobNotFound, InvalidTransition) as exc:
            print(f"tock: {exc}", file=sys.stderr)
            status = EXIT_REFUSED
            continue
        done.append(job)
        if not args.json:
            print(f"job {job.id}: {job.state}")
    if args.json and not args.dry_run:
        print_json(done)
    return status


def _change_filter(action: str, where: JobFilter, args: argparse.Namespace) -> int:
    with _store(args) as store:
        plan = ops_jobs.plan_bulk(store, action, where)
    if args.dry_run:
        if args.json:
            print_json({"dry_run": True, **plan.__dict__})
        else:
            print(f"would {action} {plan.count} job(s) ({plan.description})")
        return EXIT_OK
    if plan.count == 0:
        if args.json:
            print_json({"dry_run": False, "action": action, "count": 0})
        else:
            print(f"no job to {action} ({plan.description})")
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            raise InvalidInput(f"{plan.count} job(s) match; pass --yes to {action} them "
                               "without a prompt (or --dry-run to only count)")
        answer = input(f"{action} {plan.count} job(s) ({plan.description})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return EXIT_REFUSED

    with _store(args) as store:
        count = ops_jobs.run_bulk(store, action, where, up_to_id=plan.up_to_id)
    if args.json:
        print_json({"dry_run": False, "action": action, "count": count,
                    "up_to_id": plan.up_to_id, "description": plan.description})
    else:
        print(f"{'retried' if action == 'retry' else 'cancelled'} {count} job(s)")
    return EXIT_OK


# --- cluster -------------------------------------------------------------------------------------


def _stats(args: argparse.Namespace) -> int:
    with _store(args) as store, store.transaction() as tx:
        now = tx.database_now()
        counts = tx.counts_by_state_kind(tuple(JobState))  # all states: one pass, once
        queues = tx.queue_stats(now)
    totals = {s.value: 0 for s in JobState}
    for (state, _), n in counts.items():
        totals[state] += n
    if args.json:
        print_json({"now": now, "totals": totals,
                    "queues": [{**q.__dict__, "depth": q.depth} for q in queues]})
        return EXIT_OK
    print("  ".join(f"{state} {n}" for state, n in totals.items()))
    print()
    if not queues:
        print("no unfinished work")
        return EXIT_OK
    print_table(["queue", "kind", "due", "in sqs", "running", "later", "oldest due s"], [
        [q.queue, q.kind, q.due, q.dispatched, q.running, q.future,
         round(q.oldest_due_age_seconds, 1)] for q in queues])
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    with _store(args) as store:
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
            *(["--port", str(args.port)] if args.port else [])]
    return dashboard_main(argv)


def _job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"job ids are positive, got {value}")
    return value


def register(sub: Sub) -> None:
    """Add the operator subcommands to the `tock` parser."""
    p = sub.add_parser("enqueue", help="enqueue a job",
                       description="Enqueue one job now, at a time, or after a delay.")
    p.add_argument("kind")
    p.add_argument("--payload", help="JSON, e.g. '{\"to\": \"a@example.com\"}'")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", type=_iso("--at"), help="run at (ISO 8601 with timezone)")
    when.add_argument("--delay", type=float, help="run after this many seconds")
    p.add_argument("--key", help="idempotency key: an existing job with it is returned")
    p.add_argument("--priority", type=int, default=0, help="0..9, higher first (default 0)")
    p.add_argument("--queue")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--timeout", type=float, help="seconds per attempt")
    p.add_argument("--tenant")
    _common(p)
    p.set_defaults(func=_enqueue)

    p = sub.add_parser("jobs", help="list jobs (newest first) with filters",
                       description="List jobs, newest first, a page at a time.")
    _filters(p)
    p.add_argument("--limit", type=int, default=DEFAULT_PAGE_SIZE,
                   help=f"1..{MAX_PAGE_SIZE} (default "
                        f"{DEFAULT_PAGE_SIZE})")
    p.add_argument("--before-id", type=_job_id, help="page cursor printed by the last page")
    _common(p)
    p.set_defaults(func=_jobs)

    p = sub.add_parser("show", help="a job, its attempts and why it is (not) running",
                       description="Show a job with its attempt history and the "
                                   "explanation of its current state.")
    p.add_argument("job_id", type=_job_id, metavar="JOB")
    _common(p)
    p.set_defaults(func=_show)

    for action, helptext in (("retry", "run dead or cancelled jobs again"),
                             ("cancel", "cancel unfinished jobs")):
        p = sub.add_parser(
            action, help=f"{helptext}: by id, or by filter after a count",
            description=f"{helptext[0].upper()}{helptext[1:]}. By id, or every job matching "
                        "a filter: the matching jobs are counted first; --dry-run stops "
                        "there, otherwise you confirm (or pass --yes).")
        p.add_argument("job_ids", nargs="*", type=_job_id, metavar="JOB")
        _filters(p)
        p.add_argument("--all", action="store_true", help="with no filter: every job")
        p.add_argument("--dry-run", action="store_true", help="only count / check")
        p.add_argument("--yes", "-y", action="store_true", help="do not ask to confirm")
        _common(p)
        p.set_defaults(func=_change(action))

    p = sub.add_parser("stats", help="jobs by state; queue depth and oldest due age",
                       description="Jobs by state, and per queue and kind the due, "
                                   "dispatched, running and later jobs with the age of "
                                   "the oldest due one.")
    _common(p)
    p.set_defaults(func=_stats)

    p = sub.add_parser("workers", help="consumers and their last heartbeat")
    p.add_argument("--stale-seconds", type=float, default=WORKER_STALE_SECONDS,
                   help="silent this long counts as stale (default 30)")
    _common(p)
    p.set_defaults(func=_workers)

    p = sub.add_parser("dashboard", help="serve the dashboard and HTTP API "
                                         "(python -m dashboard)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=_dashboard)
