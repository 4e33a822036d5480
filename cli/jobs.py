"""`tock enqueue`, `tock jobs` and `tock show`: put a job in, list jobs a page at a time, and
show one job with its attempts and why it is (not) running."""

from __future__ import annotations

import argparse
import json
import sys

from cli import audit, connect
from cli.arguments import (
    Sub,
    add_common,
    add_filters,
    filter_of,
    integer,
    job_id_type,
    nonempty,
    parse_time,
    seconds,
)
from cli.output import cell, job_json, plain, print_json, print_table, printable
from shared.core.errors import InvalidInput
from shared.core.filters import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from shared.core.states import FINAL_STATES
from shared.core.text import LostNumber, json_float, shown
from shared.ops import explain
from shared.ops import jobs as ops_jobs

EXIT_OK = 0
# Room for an indented copy of the largest payload TOCK_MAX_PAYLOAD_BYTES allows (64 MiB);
# reading stops there, so a wrong path (a huge log, /dev/zero) cannot take all memory.
MAX_PAYLOAD_FILE_BYTES = 256 * 1024 * 1024


def _payload(args: argparse.Namespace) -> object:
    """The payload from --payload or --payload-file (None without either), parsed."""
    if args.payload_file is not None:
        where = "standard input" if args.payload_file == "-" else args.payload_file
        return _parse_json(f"--payload-file: {where}", _read_payload_file(args.payload_file))
    if args.payload is not None:
        return _parse_json("--payload", args.payload)
    return None


def _read_payload_file(path: str) -> str:
    """The text of `path` ('-': standard input), or `InvalidInput` saying why not."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            data = (stdin.read(MAX_PAYLOAD_FILE_BYTES + 1) if stdin is not None
                    else sys.stdin.read(MAX_PAYLOAD_FILE_BYTES + 1).encode())
        else:
            with open(path, "rb") as file:
                data = file.read(MAX_PAYLOAD_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InvalidInput(f"--payload-file: {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidInput(f"--payload-file: {path} is a directory, not a file") from None
    except OSError as exc:
        raise InvalidInput(f"--payload-file: cannot read {name}: "
                           f"{exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_PAYLOAD_FILE_BYTES:
        raise InvalidInput(f"--payload-file: {name} is over {MAX_PAYLOAD_FILE_BYTES // 2**20} "
                           "MiB, far more than a payload may be (TOCK_MAX_PAYLOAD_BYTES)")
    if not data.strip():
        raise InvalidInput(f"--payload-file: {name} is empty; it should hold the payload as "
                           "JSON")
    try:
        return data.decode("utf-8-sig")  # -sig: a byte order mark is not part of the JSON
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"--payload-file: {name} is not valid UTF-8 text (byte "
                           f"0x{data[exc.start]:02X} at offset {exc.start})") from None


def _parse_json(source: str, text: str) -> object:
    def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
        # json.loads keeps the last of a repeated key: the sender meant one of them, or both
        obj: dict[str, object] = {}
        for key, value in pairs:
            if key in obj:
                raise InvalidInput(f"{source} has the key {shown(key)} twice in one object; "
                                   "give each key once")
            obj[key] = value
        return obj

    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_float=json_float)
    except LostNumber as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{source} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{source} is nested too deeply to be read") from None


def _enqueue(args: argparse.Namespace) -> int:
    payload = _payload(args)
    with connect.client(args) as client:
        job = client.schedule(args.kind, payload, at=args.at, delay=args.delay, key=args.key,
                              priority=args.priority, queue=args.queue,
                              max_attempts=args.max_attempts, timeout=args.timeout,
                              tenant=args.tenant, concurrency_key=args.concurrency_key)
    audit.action("job_enqueued", job_id=job.id, kind=job.kind, created=job.created)
    if args.json:
        print_json({**job_json(job), "created": job.created})
    elif job.created:
        print(f"enqueued job {job.id} ({job.kind}) on queue {job.queue}, due "
              f"{job.run_at.isoformat(timespec='seconds')}")
    else:
        print(f"job {job.id} already exists with key {job.unique_key!r} ({job.kind}, "
              f"{job.state}); "
              "nothing enqueued")
    return EXIT_OK


def _jobs(args: argparse.Namespace) -> int:
    where = filter_of(args)
    with connect.operator_store(args) as store:
        page = ops_jobs.list_jobs(store, where, limit=args.limit, before_id=args.before_id)
    if args.json:
        print_json({"jobs": [job_json(j) for j in page.jobs], "next_cursor": page.next_cursor})
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
        # The shape of GET /api/jobs/{id}: the attempts beside the job, the explanation
        # with its text.
        print_json({"job": job_json(job), "attempts": plain(job.attempts),
                    "explanation": {**plain(why), "text": why.text()}})
        return EXIT_OK
    print(f"job {job.id}  {job.kind}  [{job.state}]")
    print()
    print(printable(why.text()))
    print()
    rows = [("queue", job.queue), ("priority", job.priority),
            ("attempt", f"{job.attempt} of {job.max_attempts or '(task default)'}"),
            ("run at", job.run_at), ("key", job.unique_key), ("tenant", job.tenant),
            ("concurrency key", job.concurrency_key),
            # A finished job holds no lease; a cancel of a running one keeps its worker.
            ("lease", f"{job.lease_owner} until {cell(job.lease_expires_at)}"
             if job.lease_owner and job.state not in FINAL_STATES else None),
            ("last worker", job.lease_owner if job.state in FINAL_STATES else None),
            ("created", job.created_at), ("finished", job.finished_at),
            ("payload", json.dumps(job.payload))]
    width = max(len(name) for name, _ in rows)  # one column for every job
    for name, value in rows:
        if value is not None:
            print(f"  {name:<{width}} {value if name == 'payload' else cell(value)}")
    if job.attempts:
        print()
        # A retried job counts its attempts from 1 again: mark where each retry began.
        print_table(["attempt", "outcome", "worker", "started", "finished", "error"], [
            [f"{a.attempt} (retried)" if i and a.attempt <= job.attempts[i - 1].attempt
             else a.attempt, a.outcome, a.worker, a.started_at, a.finished_at, a.error]
            for i, a in enumerate(job.attempts)])
    return EXIT_OK


def add_parser(sub: Sub) -> None:
    """Register `tock enqueue`, `tock jobs` and `tock show`."""
    p = sub.add_parser("enqueue", help="enqueue a job",
                       description="Enqueue one job now, at a time, or after a delay.")
    p.add_argument("kind")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--payload", help="JSON, e.g. '{\"to\": \"a@example.com\"}'")
    data.add_argument("--payload-file", metavar="PATH",
                      type=nonempty("a file path, or - for standard input"),
                      help="read the payload JSON from a file; - for standard input (for "
                           "payloads too large for the command line)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", type=parse_time,
                      help="run at (ISO 8601 with timezone)")
    when.add_argument("--delay", type=seconds, help="run after this many seconds")
    p.add_argument("--key", help="idempotency key: an existing job with it is returned")
    p.add_argument("--priority", type=integer, default=0, help="0..9, higher first (default 0)")
    p.add_argument("--queue")
    p.add_argument("--max-attempts", type=integer)
    p.add_argument("--timeout", type=seconds, help="seconds per attempt")
    p.add_argument("--tenant")
    p.add_argument("--concurrency-key", metavar="KEY",
                   help="what a per-key limit of the kind counts the job under")
    add_common(p)
    p.set_defaults(func=_enqueue)

    p = sub.add_parser("jobs", help="list jobs (newest first) with filters",
                       description="List jobs, newest first, a page at a time.")
    add_filters(p)
    p.add_argument("--limit", type=integer, default=DEFAULT_PAGE_SIZE,
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
