"""Raw Postgres ceilings: the least work a queue on this table shape can do per job, measured
on the same server in the same run, so tock's figures can be read as ratios to them.

The bare tables are `LIKE tock_jobs INCLUDING ALL` (same columns, defaults and indexes, no
trigger), so the bare loops pay the same index upkeep tock does and nothing more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from bench.profiles import Profile
from bench.progress import Progress
from bench.results import Results
from bench.stats import rate

CREATE_TABLES = """
CREATE TABLE bench_raw_jobs (LIKE tock_jobs INCLUDING ALL);
CREATE TABLE bench_raw_attempts (LIKE tock_attempts INCLUDING ALL);
"""

FILL = """
INSERT INTO bench_raw_jobs (kind, queue, payload, run_at)
SELECT 'bench.noop', 'default', '{}'::jsonb, now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, %(rows)s) AS g
"""

# The bare claim: one priority level, oldest due first, SKIP LOCKED, one statement.
CLAIM = """
WITH due AS (
    SELECT id FROM bench_raw_jobs
    WHERE state IN ('scheduled', 'retrying') AND priority = 0 AND run_at <= now()
    ORDER BY run_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_raw_jobs j
SET state = %(state)s::tock_job_state, dispatch_token = gen_random_uuid(), dispatched_at = now(),
    attempt = j.attempt + 1, lease_owner = %(worker)s,
    lease_expires_at = now() + interval '30 seconds', started_at = now(), updated_at = now()
FROM due WHERE j.id = due.id
RETURNING j.id, j.attempt, j.dispatch_token
"""

# The bare fenced completion of a batch, with its attempt rows: what any queue that keeps
# history and fences stale workers must write.
COMPLETE = """
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(tokens)s::uuid[])
         AS t(id, attempt, token)
), upd AS (
    UPDATE bench_raw_jobs j
    SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
        finished_at = now(), updated_at = now()
    FROM r
    WHERE j.id = r.id AND j.state = 'running' AND j.lease_owner = %(worker)s
      AND j.attempt = r.attempt AND j.dispatch_token = r.token
    RETURNING j.id, j.started_at, r.attempt
)
INSERT INTO bench_raw_attempts (job_id, attempt, worker, started_at, finished_at, outcome)
SELECT id, attempt, %(worker)s, started_at, now(), 'succeeded' FROM upd
"""

INSERT_ONE = """
INSERT INTO bench_raw_jobs (kind, queue, payload, run_at)
VALUES ('bench.noop', 'default', '{"n": 1}'::jsonb, now())
"""

INSERT_MANY = """
INSERT INTO bench_raw_jobs (kind, queue, payload, run_at)
SELECT 'bench.noop', 'default', p::jsonb, now() FROM unnest(%(payloads)s::text[]) AS t(p)
"""


CpuMeter = Callable[[], float | None]
"""CPU seconds the Postgres server has used so far (None: cannot be read here)."""


def measure(database_url: str, profile: Profile, results: Results, progress: Progress,
            postgres_cpu: CpuMeter | None = None) -> None:
    """Record every raw Postgres ceiling in `results` (group `raw-postgres`); with
    `postgres_cpu`, also how many jobs the claim + completion loop gets through per CPU
    second of the server."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(CREATE_TABLES)
        for batch in (1, 10, 100):
            _refill(conn, profile.raw_rows)
            jobs_per_s = _claim_loop(conn, batch, profile.raw_seconds)
            results.raw(f"raw.pg.claim_b{batch}", "raw-postgres",
                        f"bare SKIP LOCKED claim, batch {batch}", jobs_per_s, "jobs/s")
            progress.say(f"  bare claim batch {batch}: {jobs_per_s:,.0f} jobs/s")
        _refill(conn, profile.raw_rows)
        before = postgres_cpu() if postgres_cpu else None
        cycle, jobs = _claim_complete_loop(conn, 100, profile.raw_seconds)
        after = postgres_cpu() if postgres_cpu else None
        results.raw("raw.pg.claim_complete_b100", "raw-postgres",
                    "bare claim + batched fenced completion, batch 100", cycle, "jobs/s",
                    note="two transactions per batch: claim, then complete with attempt rows")
        progress.say(f"  bare claim + fenced completion: {cycle:,.0f} jobs/s")
        if before is not None and after is not None and after > before and jobs:
            per_cpu = jobs / (after - before)
            results.raw("raw.pg.cpu_claim_complete_b100", "raw-postgres",
                        "bare claim + batched fenced completion: jobs per CPU second of "
                        "Postgres", per_cpu, "jobs/cpu-s",
                        note="jobs / the server's CPU seconds over the loop")
        one = _insert_loop(conn, 1, profile.raw_seconds)
        many = _insert_loop(conn, profile.enqueue_batch_size, profile.raw_seconds)
        results.raw("raw.pg.insert_1", "raw-postgres", "bare INSERT, one row per commit",
                    one, "jobs/s")
        results.raw("raw.pg.insert_batch", "raw-postgres",
                    f"bare INSERT, {profile.enqueue_batch_size} rows per commit", many, "jobs/s")
        progress.say(f"  bare insert: {one:,.0f}/s one by one, {many:,.0f}/s batched")
        conn.execute("DROP TABLE bench_raw_jobs, bench_raw_attempts")


def _refill(conn: psycopg.Connection[Any], rows: int) -> None:
    conn.execute("TRUNCATE bench_raw_jobs, bench_raw_attempts")
    conn.execute(FILL, {"rows": rows})
    conn.execute("VACUUM ANALYZE bench_raw_jobs")


def _claim_loop(conn: psycopg.Connection[Any], batch: int, seconds: float) -> float:
    params = {"limit": batch, "state": "dispatched", "worker": None}
    claimed = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        got = len(conn.execute(CLAIM, params).fetchall())
        claimed += got
        if got < batch:
            break
    return rate(claimed, time.perf_counter() - start)


def _claim_complete_loop(conn: psycopg.Connection[Any], batch: int, seconds: float
                         ) -> tuple[float, int]:
    """(jobs/s, jobs) of claim + completion in batches of `batch` for `seconds`."""
    worker = f"raw-{uuid.uuid4().hex[:6]}"
    params = {"limit": batch, "state": "running", "worker": worker}
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        rows = conn.execute(CLAIM, params).fetchall()
        if not rows:
            break
        conn.execute(COMPLETE, {"ids": [r[0] for r in rows], "attempts": [r[1] for r in rows],
                                "tokens": [r[2] for r in rows], "worker": worker})
        done += len(rows)
    return rate(done, time.perf_counter() - start), done


def _insert_loop(conn: psycopg.Connection[Any], batch: int, seconds: float) -> float:
    payloads = [f'{{"n": {i}}}' for i in range(batch)]
    inserted = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if batch == 1:
            conn.execute(INSERT_ONE)
        else:
            conn.execute(INSERT_MANY, {"payloads": payloads})
        inserted += batch
    return rate(inserted, time.perf_counter() - start)
