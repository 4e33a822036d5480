"""What the invariant checker reads: the fault windows the scenario recorded, the
independent handler-run log written by `tests.faults.tasks` (paired into `Run`s), and tock's
own record of the suite's jobs (tock_jobs_all, tock_attempts_all: the hot table and the
history) as `Tables`."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass(frozen=True)
class FaultWindow:
    name: str
    start: float
    end: float
    explains_overlap: bool
    """Whether a run overlapping this window may legitimately run again (its worker was cut
    off from Postgres, or Postgres lost its state). A kill -9 window explains only the runs
    of the processes killed; an SQS outage or poison messages explain nothing."""


@dataclass
class Run:
    job: int
    attempt: int
    pid: int
    proc: str | None
    start: float
    end: float | None = None



def read_runs(path: Path) -> tuple[list[Run], int]:
    """Pair each start with its end (same job, attempt and pid); returns the runs, in start
    order, and how many lines could not be read."""
    runs: list[Run] = []
    open_runs: dict[tuple[int, int, int], list[Run]] = defaultdict(list)
    bad = 0
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            key = (int(rec["job"]), int(rec["attempt"]), int(rec["pid"]))
            event, t = rec["event"], float(rec["t"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if event == "start":
            run = Run(*key, proc=rec.get("proc"), start=t)
            runs.append(run)
            open_runs[key].append(run)
        elif event == "end" and open_runs[key]:
            open_runs[key].pop(0).end = t
        else:
            bad += 1
    runs.sort(key=lambda r: r.start)
    return runs, bad


@dataclass(frozen=True)
class JobRow:
    id: int
    state: str
    attempt: int
    finished_at: float | None
    last_error: str | None
    lease_owner: str | None


@dataclass(frozen=True)
class AttemptRow:
    job_id: int
    id: int
    attempt: int
    worker: str | None
    outcome: str
    finished_at: float | None


@dataclass
class Tables:
    """What tock's tables say about the suite's jobs."""

    jobs: dict[int, JobRow]
    attempts: dict[int, list[AttemptRow]]
    """Per job, in insertion order."""


def load_tables(database_url: str, job_ids: list[int]) -> Tables:
    jobs: dict[int, JobRow] = {}
    attempts: dict[int, list[AttemptRow]] = defaultdict(list)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for row in conn.execute(
                "SELECT id, state::text, attempt, extract(epoch FROM finished_at)::float8, "
                "last_error, lease_owner FROM tock_jobs_all WHERE id = ANY(%s)", (job_ids,)):
            jobs[row[0]] = JobRow(*row)
        for row in conn.execute(
                "SELECT job_id, id, attempt, worker, outcome::text, "
                "extract(epoch FROM finished_at)::float8 FROM tock_attempts_all "
                "WHERE job_id = ANY(%s) ORDER BY job_id, id", (job_ids,)):
            attempts[row[0]].append(AttemptRow(*row))
    return Tables(jobs, dict(attempts))
