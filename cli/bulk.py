"""`tock retry` and `tock cancel`: by job id, or every job matching a filter after counting
them (`--dry-run` stops at the count; otherwise confirm, or pass `--yes`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from cli import audit, connect
from cli.arguments import Sub, add_common, add_filters, filter_of, job_id_type
from cli.output import job_json, print_json
from shared.client import Client
from shared.core.errors import DatabaseError, InvalidInput, InvalidTransition, JobNotFound
from shared.core.filters import CANCELLABLE_STATES, RETRYABLE_STATES, JobFilter
from shared.ops import jobs as ops_jobs

EXIT_OK, EXIT_REFUSED = 0, 1


def _change(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        where = filter_of(args)
        if args.job_ids and not where.is_empty():
            raise InvalidInput("give job ids or a filter, not both")
        if not args.job_ids and where.is_empty() and not args.all:
            example = ("--state dead --kind email" if action == "retry"
                       else "--state scheduled --kind email")
            raise InvalidInput(f"say which jobs to {action}: job ids, a filter such as "
                               f"{example}, or --all")
        if args.job_ids:
            with connect.client(args) as client:
                return _change_ids(client, action, args)
        return _change_filter(action, where, args)
    return run


def _change_ids(client: Client, action: str, args: argparse.Namespace) -> int:
    status, done = EXIT_OK, []
    # A job named twice (`tock cancel 5 5`) is acted on once: the second would be refused,
    # the job being cancelled (or retried) by the first, and fail the command.
    for job_id in dict.fromkeys(args.job_ids):
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
        audit.action("job_retried" if action == "retry" else "job_cancelled", job_id=job.id)
        if not args.json:
            print(f"job {job.id}: {job.state}")
    if args.json and not args.dry_run:
        print_json([job_json(job) for job in done])
    return status


def _change_filter(action: str, where: JobFilter, args: argparse.Namespace) -> int:
    with connect.operator_store(args) as store:
        plan = ops_jobs.plan_bulk(store, action, where)
    if args.dry_run:
        if args.json:
            print_json({"dry_run": True, **plan.__dict__})
        else:
            print(f"would {action} {plan.shown} job(s) ({plan.description})")
        return EXIT_OK
    if plan.count == 0:
        if args.json:
            print_json({"dry_run": False, "action": action, "count": 0})
        else:
            print(f"no job to {action} ({plan.description})")
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            raise InvalidInput(f"{plan.shown} job(s) match; pass --yes to {action} them "
                               "without a prompt (or --dry-run to only count)")
        if not _confirmed(f"{action} {plan.shown} job(s) ({plan.description})? [y/N] "):
            print("nothing changed")
            return EXIT_REFUSED

    done = [0]
    try:
        with connect.operator_store(args) as store:
            count = ops_jobs.run_bulk(store, action, where, up_to_id=plan.up_to_id,
                                      committed=lambda total: done.__setitem__(0, total))
    except DatabaseError:
        if done[0]:  # committed batches are changes too: audited as such
            audit.action(f"bulk_{action}", jobs=done[0], filter=plan.description,
                         up_to_id=plan.up_to_id, interrupted=True)
        raise
    audit.action(f"bulk_{action}", jobs=count, filter=plan.description, up_to_id=plan.up_to_id)
    if args.json:
        print_json({"dry_run": False, "action": action, "count": count,
                    "up_to_id": plan.up_to_id, "description": plan.description})
    else:
        print(f"{'retried' if action == 'retry' else 'cancelled'} {count} job(s)")
    return EXIT_OK


def _confirmed(question: str) -> bool:
    """Whether the operator answered yes. Ctrl-D (EOF) and Ctrl-C are a no, not a
    traceback: the prompt is where one backs out."""
    try:
        answer = input(question)
    except (EOFError, KeyboardInterrupt):
        print()  # end the prompt's line, which the key left open
        return False
    return answer.strip().lower() in ("y", "yes")


def add_parser(sub: Sub) -> None:
    """Register `tock retry` and `tock cancel`."""
    for action, helptext in (("retry", "run dead or cancelled jobs again"),
                             ("cancel", "cancel unfinished jobs")):
        p = sub.add_parser(
            action, help=f"{helptext}: by id, or by filter after a count",
            description=f"{helptext[0].upper()}{helptext[1:]}. By id, or every job matching "
                        "a filter: the matching jobs are counted first; --dry-run stops "
                        "there, otherwise you confirm (or pass --yes).")
        p.add_argument("job_ids", nargs="*", type=job_id_type, metavar="JOB")
        add_filters(p)
        p.add_argument("--all", action="store_true", help="with no filter: every job")
        p.add_argument("--dry-run", action="store_true", help="only count / check")
        p.add_argument("--yes", "-y", action="store_true", help="do not ask to confirm")
        add_common(p)
        p.set_defaults(func=_change(action))
