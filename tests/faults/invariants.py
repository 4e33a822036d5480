"""The invariant checker: tock's own record (tock_jobs_all, tock_attempts_all) against the
independent handler-run log written by `tests.faults.tasks`.

    (a) lost        every enqueued job ends `succeeded` (the jobs always can), within the
                    drain bound after the fault ends
    (b) double      at most one `succeeded` attempt row per job, and the job's state agrees
    (c) stale       a job's attempt rows have increasing attempt numbers (equal only after a
                    `released` row, which gives the attempt back), the `succeeded` row is the
                    last one and is the job's current attempt, and the worker it names really
                    ran that attempt to its end (per the run log)
    (d) duplicates  every handler run followed by another run of the same job is explained
                    by an injected fault: its process was killed by the suite while (or just
                    after) it ran, or it overlapped a fault window that explains overlapping
                    runs (Postgres crash or stop, partition); anything else is a violation
    (e) exits       no process exits unless the suite kills or stops it
    plus: no run of a job nobody enqueued, and every run started has ended.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

from tests.faults.cluster import ProcRecord
from tests.faults.records import (
    AttemptRow,
    FaultWindow,
    JobRow,
    Run,
    Tables,
    load_tables,
    read_runs,
)
from tests.faults.result import Result, Violation

FROZEN_SQS = "LocalStack frozen (SIGSTOP)"
"""How a freeze's fault window is named (tests.faults.scenarios.sqs_freeze)."""

OUTCOME_SLACK_SECONDS = 2.0
"""After a handler returns, its outcome is written within moments (the completer takes
batches every 0.2 s): a fault this soon after a run's end can still have cost its outcome."""
END_TOLERANCE_SECONDS = 0.5
"""Clock tolerance between a run's end in the run log and its attempt row's finished_at."""



def check(*, scenario: str, database_url: str, job_ids: list[int], run_log: Path,
          faults: list[FaultWindow], processes: list[ProcRecord], drain_from: float,
          drain_bound: float, log_dir: Path | str = "") -> Result:
    """Compare the database with the run log; see the module docstring."""
    runs, bad_lines = read_runs(run_log)
    result = evaluate(scenario=scenario, job_ids=job_ids,
                      tables=load_tables(database_url, job_ids), runs=runs, faults=faults,
                      processes=processes, drain_from=drain_from, drain_bound=drain_bound)
    result.run_log_bad_lines = bad_lines
    if bad_lines:
        result.notes.append(f"{bad_lines} unreadable lines in the run log")
    result.log_dir = str(log_dir)
    return result


def evaluate(*, scenario: str, job_ids: list[int], tables: Tables, runs: list[Run],
             faults: list[FaultWindow], processes: list[ProcRecord], drain_from: float,
             drain_bound: float) -> Result:
    """The checks themselves, on data already read (so they can be tested alone)."""
    result = Result(scenario, len(job_ids), drain_bound=drain_bound, fault_end=drain_from)
    jobs, attempt_rows = tables.jobs, tables.attempts
    v = result.violations
    runs_by_job: dict[int, list[Run]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.start):
        runs_by_job[run.job].append(run)
    result.runs = len(runs)
    result.states = dict(Counter(job.state for job in jobs.values()))
    result.attempt_outcomes = dict(Counter(a.outcome for rows in attempt_rows.values()
                                           for a in rows))
    wanted = set(job_ids)

    # (a) lost / slow
    finished: list[float] = []
    for job_id in job_ids:
        job = jobs.get(job_id)
        if job is None:
            result.lost += 1
            v.append(Violation("lost", job_id, "enqueued, but no row in tock_jobs_all"))
            continue
        if job.state != "succeeded":
            result.lost += 1
            v.append(Violation("lost", job_id, f"state {job.state} (attempt {job.attempt}, "
                               f"lease owner {job.lease_owner}, last error "
                               f"{job.last_error!r}) when the wait ended; handler runs: "
                               f"{len(runs_by_job.get(job_id, []))}"))
            continue
        result.succeeded += 1
        if job.finished_at is not None:
            finished.append(job.finished_at)
    if finished and result.succeeded == len(job_ids):
        result.drain_seconds = max(max(finished) - drain_from, 0.0)
        if result.drain_seconds > drain_bound:
            v.append(Violation("slow_drain", None, f"the last job finished "
                               f"{result.drain_seconds:.1f} s after the fault ended "
                               f"(bound {drain_bound:.0f} s)"))

    # (b) double success, (c) stale overwrite
    for job_id in job_ids:
        rows = attempt_rows.get(job_id, [])
        job = jobs.get(job_id)
        state = job.state if job else None
        wins = [a for a in rows if a.outcome == "succeeded"]
        if len(wins) > 1:
            result.double_successes += 1
            v.append(Violation("double_success", job_id, "succeeded attempt rows: "
                               + ", ".join(f"attempt {a.attempt} by {a.worker}" for a in wins)))
        elif state == "succeeded" and not wins:
            result.double_successes += 1
            v.append(Violation("double_success", job_id,
                               "the job is succeeded but has no succeeded attempt row"))
        elif wins and state != "succeeded":
            result.double_successes += 1
            v.append(Violation("double_success", job_id,
                               f"a succeeded attempt row, but the job is {state}"))
        stale = _stale_problems(rows, job, runs_by_job.get(job_id, []))
        if stale:
            result.stale_overwrites += 1
            v.extend(Violation("stale_overwrite", job_id, s) for s in stale)
        lost_claims = [a for a in rows if a.outcome == "lease_expired"
                       and not any(r.attempt == a.attempt for r in runs_by_job.get(job_id, []))]
        if lost_claims:
            result.attempts_without_run += len(lost_claims)

    # (d) duplicates
    procs_by_pid = {p.pid: p for p in processes}
    for job_id, job_runs in runs_by_job.items():
        if job_id not in wanted:
            v.append(Violation("phantom_run", job_id, f"{len(job_runs)} handler run(s) of a "
                               "job the suite never enqueued"))
            continue
        for earlier, later in itertools.pairwise(job_runs):
            result.duplicate_runs += 1
            if _explanation(earlier, faults, procs_by_pid):
                result.duplicates_explained += 1
                continue
            result.duplicates_unexplained += 1
            fate = _fate(procs_by_pid.get(earlier.pid))
            v.append(Violation(
                "unexplained_duplicate", job_id,
                f"attempt {earlier.attempt} ran on {earlier.proc} (pid {earlier.pid}, {fate}) "
                f"{_span(earlier)}, then attempt {later.attempt} ran on {later.proc} "
                f"{_span(later)}; no injected fault explains the first run; attempt rows: "
                + "; ".join(f"{a.attempt} {a.outcome} by {a.worker}"
                            for a in attempt_rows.get(job_id, []))))

    # Every run has ended: a run still going after its job succeeded is a copy nobody
    # needed. A run of a killed or crashed process never ends (the crash is reported).
    for run in runs:
        proc = procs_by_pid.get(run.pid)
        if run.end is None and not (proc and (proc.killed_at is not None
                                              or proc.exited_on_its_own)):
            v.append(Violation("unfinished_run", run.job,
                               f"attempt {run.attempt} on {run.proc} started "
                               f"{_clock(run.start)} and never ended ({_fate(proc)})"))

    # (e) processes
    for proc in processes:
        if proc.killed_at is not None:
            result.kills += 1
        if proc.exited_on_its_own:
            result.self_exits += 1
            extra = (" (exit code 0 without being asked to stop: a restart-on-failure policy "
                     "would not bring it back)" if proc.returncode == 0 else "")
            v.append(Violation("unexpected_exit", None,
                               f"{proc.label} (pid {proc.pid}) exited with code "
                               f"{proc.returncode} at {_clock(proc.ended)}, "
                               f"{(proc.ended or 0) - proc.started:.1f} s after it started"
                               f"{extra}; log {proc.log}"))
    names = Counter(p.name for p in processes)
    result.restarts = sum(n - 1 for n in names.values())

    # (f) the lease rescue asks Postgres alone: a consumer killed while SQS hangs has its
    # jobs rescued before SQS answers again (the lost-message counts once held it up).
    for fault in faults:
        if not fault.name.startswith(FROZEN_SQS):
            continue
        killed = {p.pid for p in processes
                  if p.killed_at is not None and fault.start <= p.killed_at <= fault.end}
        for rows in attempt_rows.values():
            for a in rows:
                if (a.outcome == "lease_expired" and _pid_of(a.worker) in killed
                        and a.finished_at is not None and a.finished_at > fault.end):
                    v.append(Violation("rescue_waited_for_sqs", a.job_id, (
                        f"attempt {a.attempt} of {a.worker}, killed during the freeze, "
                        f"was rescued {a.finished_at - fault.end:.1f} s after SQS answered "
                        "again")))
    if result.attempts_without_run:
        result.notes.append(f"{result.attempts_without_run} lease_expired attempts never "
                            "reached a handler (a claim committed whose answer the consumer "
                            "never got, or a consumer killed right after claiming)")
    return result


def _stale_problems(rows: list[AttemptRow], job: JobRow | None,
                    runs: list[Run]) -> list[str]:
    problems: list[str] = []
    for previous, row in itertools.pairwise(rows):
        gives_back = previous.outcome == "released"
        if row.attempt < previous.attempt or (row.attempt == previous.attempt
                                              and not gives_back):
            problems.append(f"attempt row {row.attempt} ({row.outcome} by {row.worker}) "
                            f"follows attempt row {previous.attempt} ({previous.outcome} by "
                            f"{previous.worker})")
    wins = [a for a in rows if a.outcome == "succeeded"]
    if not wins:
        return problems
    win = wins[-1]
    if win is not rows[-1]:
        problems.append(f"the succeeded row (attempt {win.attempt}) is followed by "
                        + ", ".join(f"{a.attempt} {a.outcome}"
                                    for a in rows[rows.index(win) + 1:]))
    if job is not None and job.attempt != win.attempt:
        problems.append(f"the succeeded row is attempt {win.attempt} but the job is at "
                        f"attempt {job.attempt}")
    pid = _pid_of(win.worker)
    finished_at = win.finished_at or 0.0
    ran = [run for run in runs if run.attempt == win.attempt and run.pid == pid]
    if not ran:
        same = [f"{run.proc} (pid {run.pid})" for run in runs if run.attempt == win.attempt]
        problems.append(f"the succeeded row credits attempt {win.attempt} to worker "
                        f"{win.worker}, but the run log has no run of that attempt by pid "
                        f"{pid} (attempt {win.attempt} ran on: {', '.join(same) or 'nobody'})")
    elif not any(run.end is not None and run.end <= finished_at + END_TOLERANCE_SECONDS
                 for run in ran):
        problems.append(f"the succeeded row (attempt {win.attempt}, worker {win.worker}, "
                        f"finished {_clock(finished_at)}) was written before that run "
                        "ended: " + ", ".join(_span(run) for run in ran))
    return problems


def _explanation(run: Run, faults: list[FaultWindow],
                 procs_by_pid: dict[int, ProcRecord]) -> str | None:
    exposed_until = (run.end if run.end is not None else float("inf")) + OUTCOME_SLACK_SECONDS
    proc = procs_by_pid.get(run.pid)
    if proc is not None and proc.killed_at is not None \
            and run.start <= proc.killed_at <= exposed_until:
        return f"its process {proc.label} was killed"
    for fault in faults:
        if fault.explains_overlap and run.start <= fault.end and exposed_until >= fault.start:
            return f"it overlapped {fault.name}"
    return None


def _fate(proc: ProcRecord | None) -> str:
    if proc is None:
        return "unknown process"
    if proc.killed_at is not None:
        return f"killed by the suite at {_clock(proc.killed_at)}"
    if proc.exited_on_its_own:
        return f"exited on its own with code {proc.returncode} at {_clock(proc.ended)}"
    return "not killed"


def _clock(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def _span(run: Run) -> str:
    end = _clock(run.end) if run.end is not None else "never ended"
    return f"[{_clock(run.start)} - {end}]"


def _pid_of(worker: str | None) -> int | None:
    """Consumer worker ids are `<host>-<pid>-<hex>`."""
    if not worker:
        return None
    parts = worker.rsplit("-", 2)
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None
