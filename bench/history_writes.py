"""Writes per job, counted in the WAL (pg_walinspect's `pg_get_wal_stats`), for three ways of
keeping finished jobs: in tock_jobs (the 0006 schema), moved to the history in the outcome
statement (0007, what tock does), and finished in place then moved by a loop (the
alternative 0007 rejected). Each job goes through the real statements: enqueue, dispatch
claim, consumer claim, outcome (and the mover).

    .venv/bin/python -m bench.history_writes [--jobs 2000] [--keyed]

Record counts, not bytes, are the comparison: a full-page image depends on when the last
checkpoint was, a record does not (each phase starts after a CHECKPOINT all the same).
"""

from __future__ import annotations

import argparse
import uuid
from collections import Counter
from typing import Any

import psycopg

from devstack.postgres import start_postgres
from shared.store import flow_sql, jobs_sql, producer_sql, retention_sql
from shared.store.columns import NOW
from shared.store.migrate import migrate

IN_PLACE_FINISH = f"""
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(tokens)s::uuid[],
                         %(states)s::tock_job_state[], %(outcomes)s::tock_attempt_outcome[])
         AS t(id, attempt, token, state, outcome)
), upd AS (
    UPDATE tock_jobs j
    SET state = r.state, lease_owner = NULL, lease_expires_at = NULL, lease_detached = false,
        finished_at = {NOW}, updated_at = {NOW}
    FROM r
    WHERE j.id = r.id AND j.id = ANY(%(ids)s::bigint[]) AND j.state = 'running'
      AND j.lease_owner = %(worker)s AND j.attempt = r.attempt AND j.dispatch_token = r.token
    RETURNING j.id, j.started_at
)
INSERT INTO tock_attempts (job_id, attempt, worker, started_at, finished_at, outcome)
SELECT upd.id, r.attempt, %(worker)s, upd.started_at, {NOW}, r.outcome
FROM upd JOIN r ON r.id = upd.id
"""  # noqa: S608 (composed from constant fragments; values are bound)
"""The outcome statement of the 0006 schema (a success updates the row in place)."""

SCENARIOS = {
    "0006: finished jobs stay in tock_jobs": ("0006_worker_leases.sql", "in_place", False),
    "0007: moved in the outcome statement": (None, "move", False),
    "0007 alternative: in place, then moved by a loop": (None, "in_place", True),
}
KINDS = ("Heap", "Heap2", "Btree", "BRIN")


def _finish_params(rows: list[tuple[Any, ...]], statement: str) -> dict[str, Any]:
    n = len(rows)
    base: dict[str, Any] = {
        "ids": [r[0] for r in rows], "attempts": [1] * n, "tokens": [r[7] for r in rows],
        "states": ["succeeded"] * n, "outcomes": ["succeeded"] * n, "worker": "w1",
        "now": None}
    if statement == "move":
        base.update(delays=[0.0] * n, errors=[None] * n, tracebacks=[None] * n,
                    refunds=[False] * n)
    return base


def _phases(conn: psycopg.Connection[Any], jobs: int, finish: str, mover: bool,
            keyed: bool) -> dict[str, Counter[str]]:
    """Run each phase: {phase: its WAL records}."""
    marks: dict[str, Counter[str]] = {}

    def phase(name: str, work: Any) -> None:
        conn.execute("CHECKPOINT")
        start = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        work()
        end = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert start and end
        # Flushed (commits are asynchronous here), and read before the next checkpoint
        # may recycle the segment.
        conn.execute("CHECKPOINT")
        marks[name] = _records(conn, start[0], end[0])

    def enqueue() -> None:
        for offset in range(0, jobs, 500):
            n = min(500, jobs - offset)
            conn.execute(producer_sql.INSERT_JOBS, {
                "kind": ["k"] * n, "queue": ["default"] * n, "payload": ["{}"] * n,
                "priority": [0] * n, "at": [None] * n, "delay": [0.0] * n,
                "max_attempts": [None] * n, "timeout_seconds": [None] * n,
                "unique_key": [f"key-{offset + i}" if keyed else None for i in range(n)],
                "tenant": [None] * n, "now": None})

    def dispatch() -> None:
        # The timer's claim: one (kind, tenant) pair here, so its per-pair statement.
        while conn.execute(flow_sql.CLAIM_PAIRS, {
                "level": 0, "kinds": ["k"], "tenants": [""], "quotas": [100],
                "now": None}).fetchall():
            pass

    claimed: list[tuple[Any, ...]] = []

    def claim() -> None:
        ids = [r[0] for r in conn.execute("SELECT id, dispatch_token FROM tock_jobs")]
        tokens = dict(conn.execute("SELECT id, dispatch_token FROM tock_jobs").fetchall())
        for offset in range(0, len(ids), 50):
            batch = ids[offset:offset + 50]
            claimed.extend(conn.execute(jobs_sql.CLAIM_MESSAGES, {
                "ids": batch, "tokens": [tokens[i] for i in batch],
                "default_max_attempts": [5] * len(batch),
                "default_timeout_seconds": [30.0] * len(batch), "worker": "w1",
                "lease_seconds": 30, "now": None}).fetchall())

    def outcome() -> None:
        statement = jobs_sql.FINISH_ATTEMPTS if finish == "move" else IN_PLACE_FINISH
        for offset in range(0, len(claimed), 100):
            conn.execute(statement, _finish_params(claimed[offset:offset + 100], finish))

    def move() -> None:
        keep = {"keep_succeeded": "-infinity", "keep_dead": "-infinity",
                "keep_cancelled": "-infinity"}
        while True:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(retention_sql.PICK_FINISHED, {
                    "state": "succeeded", "limit": 1000})]
                if not ids:
                    return
                conn.execute(retention_sql.MOVE_FINISHED, {"ids": ids, **keep})

    for name, work in (("enqueue", enqueue), ("dispatch", dispatch), ("claim", claim),
                       ("outcome", outcome)):
        phase(name, work)
    if mover:
        phase("mover", move)
    return marks


def _records(conn: psycopg.Connection[Any], start: str, end: str) -> Counter[str]:
    """WAL records of the heap and index resource managers between two LSNs, by type."""
    found: Counter[str] = Counter()
    for kind, n in conn.execute(
            'SELECT "resource_manager/record_type", count '
            "FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true)", (start, end)):
        if kind.split("/")[0] in KINDS and n:
            found[kind] += n
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--keyed", action="store_true", help="every job has a key")
    args = parser.parse_args(argv)
    server = start_postgres()
    with psycopg.connect(server.url(), autocommit=True) as admin:
        # Keep the segments a phase wrote until pg_waldump has read them.
        admin.execute("ALTER SYSTEM SET wal_keep_size = '1GB'")
        admin.execute("SELECT pg_reload_conf()")
    try:
        for label, (up_to, finish, mover) in SCENARIOS.items():
            url = server.create_database(f"writes_{uuid.uuid4().hex[:8]}")
            migrate(url, up_to=up_to)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_walinspect")
                marks = _phases(conn, args.jobs, finish, mover, args.keyed)
            print(f"\n{label} ({args.jobs} jobs{', keyed' if args.keyed else ''}): "
                  "WAL records per job")
            total: Counter[str] = Counter()
            for name, records in marks.items():
                total.update(records)
                print(f"  {name:<9} " + ", ".join(
                    f"{k} {v / args.jobs:.2f}" for k, v in sorted(records.items())))
            heap = sum(v for k, v in total.items() if k.startswith("Heap"))
            index = sum(v for k, v in total.items() if k.startswith(("Btree", "BRIN")))
            print(f"  total     heap {heap / args.jobs:.2f}, index {index / args.jobs:.2f}")
    finally:
        server.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
