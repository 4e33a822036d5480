"""The invariant checker on made-up data: each kind of violation is found, and each kind
of explained duplicate is accepted. No servers needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.cluster import ProcRecord
from tests.faults.invariants import evaluate
from tests.faults.records import AttemptRow, FaultWindow, JobRow, Run, Tables, read_runs

pytestmark = pytest.mark.faults

T0 = 1_000_000.0
A, B = 101, 202  # consumer pids
WORKER = {A: f"host-a-{A}-aaaaaa", B: f"my-host-{B}-bbbbbb"}


def proc(pid: int, name: str, *, killed_at: float | None = None,
         ended: float | None = None, returncode: int | None = None) -> ProcRecord:
    return ProcRecord(name, "consumer", 1, pid, Path(f"/logs/{name}.1.log"), T0 - 10,
                      ended=ended, returncode=returncode, killed_at=killed_at,
                      stopped_at=None if ended else T0 + 100)


PROCS = [proc(A, "consumer-a"), proc(B, "consumer-b")]


def job(job_id: int = 1, state: str = "succeeded", attempt: int = 1,
        finished_at: float | None = T0 + 2) -> JobRow:
    return JobRow(job_id, state, attempt, finished_at, None, None)


def row(attempt: int, outcome: str, pid: int, finished_at: float, n: int = 0,
        job_id: int = 1) -> AttemptRow:
    return AttemptRow(job_id, n, attempt, WORKER[pid], outcome, finished_at)


def run(attempt: int, pid: int, start: float, end: float | None, job_id: int = 1) -> Run:
    return Run(job_id, attempt, pid, f"consumer-{'a' if pid == A else 'b'}.1", start, end)


def check(jobs: list[JobRow], attempts: list[AttemptRow], runs: list[Run], *,
          faults: list[FaultWindow] | None = None, processes: list[ProcRecord] | None = None,
          job_ids: list[int] | None = None, drain_bound: float = 15):
    by_job: dict[int, list[AttemptRow]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    return evaluate(scenario="t", job_ids=job_ids or [j.id for j in jobs],
                    tables=Tables({j.id: j for j in jobs}, by_job), runs=runs,
                    faults=faults or [], processes=PROCS if processes is None else processes,
                    drain_from=T0, drain_bound=drain_bound)


def kinds(result) -> list[str]:
    return sorted({v.invariant for v in result.violations})


def test_a_clean_run_passes():
    result = check([job()], [row(1, "succeeded", A, T0 + 2)], [run(1, A, T0, T0 + 1)])
    assert result.ok, result.summary()
    assert (result.runs, result.duplicate_runs, result.drain_seconds) == (1, 0, 2.0)


def test_a_job_not_succeeded_is_lost_and_a_slow_one_too_slow():
    lost = check([job(state="dispatched", finished_at=None)], [], [])
    assert kinds(lost) == ["lost"] and lost.lost == 1 and lost.drain_seconds is None
    slow = check([job(finished_at=T0 + 20)], [row(1, "succeeded", A, T0 + 20)],
                 [run(1, A, T0 + 18, T0 + 19)])
    assert kinds(slow) == ["slow_drain"] and slow.drain_seconds == 20.0
    missing = check([], [], [], job_ids=[7])
    assert kinds(missing) == ["lost"]


def test_two_successes_of_one_job():
    result = check([job(attempt=2)],
                   [row(1, "succeeded", A, T0 + 1, n=1), row(2, "succeeded", B, T0 + 2, n=2)],
                   [run(1, A, T0, T0 + 0.5), run(2, B, T0 + 1, T0 + 1.5)],
                   faults=[FaultWindow("partition", T0, T0 + 1, True)])
    assert "double_success" in kinds(result) and result.double_successes == 1


def test_state_and_attempt_rows_disagree():
    no_row = check([job()], [], [run(1, A, T0, T0 + 1)])
    assert "double_success" in kinds(no_row)
    no_state = check([job(state="running", finished_at=None)],
                     [row(1, "succeeded", A, T0 + 2)], [run(1, A, T0, T0 + 1)])
    assert "double_success" in kinds(no_state)


def test_success_credited_to_a_worker_that_did_not_run_that_attempt():
    # B ran attempt 2, but the row says A succeeded with attempt 2 (a stale write of A's).
    result = check([job(attempt=2)],
                   [row(1, "lease_expired", A, T0 + 1, n=1), row(2, "succeeded", A, T0 + 3, n=2)],
                   [run(1, A, T0, T0 + 2), run(2, B, T0 + 1.5, T0 + 2.5)],
                   processes=[proc(A, "consumer-a", killed_at=T0 + 0.5), PROCS[1]])
    assert kinds(result) == ["stale_overwrite"]
    assert "no run of that attempt by pid 101" in result.violations[0].detail


def test_success_written_before_its_run_ended():
    result = check([job()], [row(1, "succeeded", A, T0 + 1)], [run(1, A, T0, T0 + 3)])
    assert kinds(result) == ["stale_overwrite"]


def test_attempt_rows_out_of_order():
    result = check([job(attempt=2)],
                   [row(2, "lease_expired", A, T0 + 1, n=1), row(2, "succeeded", B, T0 + 3, n=2)],
                   [run(2, B, T0 + 2, T0 + 2.5)])
    assert kinds(result) == ["stale_overwrite"]
    # ... but a released attempt is given back, so the next row may repeat its number.
    released = check([job()],
                     [row(1, "released", A, T0 + 1, n=1), row(1, "succeeded", B, T0 + 3, n=2)],
                     [run(1, A, T0, None), run(1, B, T0 + 2, T0 + 2.5)],
                     processes=[proc(A, "consumer-a", killed_at=T0 + 1.1), PROCS[1]])
    assert released.ok, released.summary()


def duplicated(**kw):
    """Attempt 1 on A, then attempt 2 on B, which succeeded."""
    return check([job(attempt=2, finished_at=T0 + 6)],
                 [row(1, "lease_expired", A, T0 + 4, n=1), row(2, "succeeded", B, T0 + 6, n=2)],
                 [run(1, A, T0, T0 + 1), run(2, B, T0 + 5, T0 + 5.5)], **kw)


def test_a_duplicate_nothing_explains():
    result = duplicated()
    assert kinds(result) == ["unexplained_duplicate"]
    assert (result.duplicate_runs, result.duplicates_unexplained) == (1, 1)


def test_a_duplicate_of_a_killed_worker_is_explained():
    result = duplicated(processes=[proc(A, "consumer-a", killed_at=T0 + 0.5), PROCS[1]])
    assert result.ok, result.summary()
    assert (result.duplicates_explained, result.kills) == (1, 1)
    # killed long after its run ended (and its outcome should have been written): no
    late = duplicated(processes=[proc(A, "consumer-a", killed_at=T0 + 30), PROCS[1]])
    assert kinds(late) == ["unexplained_duplicate"]


def test_a_duplicate_overlapping_a_window_is_explained_only_if_the_window_allows_it():
    crash = FaultWindow("pg crash", T0 + 0.5, T0 + 0.7, explains_overlap=True)
    assert duplicated(faults=[crash]).ok
    # just after the run's end, its outcome may still have been on its way
    after = FaultWindow("pg crash", T0 + 2, T0 + 2.2, explains_overlap=True)
    assert duplicated(faults=[after]).ok
    sqs = FaultWindow("SQS restart", T0 + 0.5, T0 + 0.7, explains_overlap=False)
    assert kinds(duplicated(faults=[sqs])) == ["unexplained_duplicate"]
    long_before = FaultWindow("pg crash", T0 - 10, T0 - 9, explains_overlap=True)
    assert kinds(duplicated(faults=[long_before])) == ["unexplained_duplicate"]


def test_a_run_after_the_job_succeeded_is_unexplained():
    result = check([job()], [row(1, "succeeded", A, T0 + 2)],
                   [run(1, A, T0, T0 + 1), run(1, B, T0 + 5, T0 + 6)])
    assert kinds(result) == ["unexplained_duplicate"]


def test_runs_never_ended_and_runs_of_unknown_jobs():
    result = check([job()], [row(1, "succeeded", A, T0 + 2)],
                   [run(1, A, T0, T0 + 1), run(1, B, T0 + 0.1, None), run(1, B, T0, T0 + 1, 9)],
                   faults=[FaultWindow("partition", T0, T0 + 1, True)])
    assert kinds(result) == ["phantom_run", "unfinished_run"]


def test_processes_that_exit_on_their_own():
    crashed = proc(B, "consumer-b", ended=T0 + 3, returncode=70)
    crashed.stopped_at = None
    result = check([job()], [row(1, "succeeded", A, T0 + 2)], [run(1, A, T0, T0 + 1)],
                   processes=[PROCS[0], crashed])
    assert kinds(result) == ["unexpected_exit"] and result.self_exits == 1
    assert "code 70" in result.violations[0].detail


def test_the_run_log_pairs_starts_with_ends(tmp_path):
    log = tmp_path / "runs.jsonl"
    log.write_text(
        '{"event":"start","job":1,"attempt":1,"pid":5,"proc":"c.1","t":10.0}\n'
        '{"event":"start","job":2,"attempt":1,"pid":5,"proc":"c.1","t":10.5}\n'
        '{"event":"end","job":1,"attempt":1,"pid":5,"proc":"c.1","t":11.0}\n'
        'garbage\n'
        '{"event":"start","job":1,"attempt":1,"pid":6,"proc":"c.2","t":12.0}\n')
    runs, bad = read_runs(log)
    assert bad == 1
    assert [(r.job, r.pid, r.start, r.end) for r in runs] == [
        (1, 5, 10.0, 11.0), (2, 5, 10.5, None), (1, 6, 12.0, None)]
