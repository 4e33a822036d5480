"""End to end with real processes: `python -m timer_service` and `python -m consumer`
against the session's Postgres and LocalStack, including kill -9 and SIGTERM."""

from __future__ import annotations

import pytest

from shared.core.states import AttemptOutcome, JobState
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def _states(db) -> dict[str, int]:
    return dict(db.execute("SELECT state::text, count(*) FROM tock_jobs_all GROUP BY 1").fetchall())


def _runs(db, job_id=None) -> list[tuple[int, int]]:
    if job_id is None:
        return db.execute("SELECT job_id, attempt FROM e2e_runs ORDER BY at").fetchall()
    return db.execute("SELECT job_id, attempt FROM e2e_runs WHERE job_id = %s ORDER BY at",
                      (job_id,)).fetchall()


def test_two_timers_three_consumers_run_1000_jobs_exactly_once(procs, client, db):
    for n in range(2):
        procs.timer(f"timer-{n}")
    for n in range(3):
        procs.consumer(f"consumer-{n}", "--concurrency", "8")
    jobs = client.schedule_many([{"kind": "record", "payload": {"n": i}} for i in range(1000)])
    assert len({j.id for j in jobs}) == 1000
    procs.wait_for(lambda: _states(db).get("succeeded") == 1000, timeout=180,
                   message="1000 jobs succeeded")
    runs = db.execute("SELECT count(*), count(DISTINCT job_id) FROM e2e_runs").fetchone()
    assert runs == (1000, 1000), "every job ran exactly once"
    attempts = db.execute("SELECT count(*), count(DISTINCT job_id) FROM tock_attempts_all "
                          "WHERE outcome = 'succeeded'").fetchone()
    assert attempts == (1000, 1000)
    assert _states(db) == {"succeeded": 1000}


def test_consumer_killed_mid_job_loses_nothing(procs, client, db):
    procs.timer("timer")
    procs.consumer("victim")
    job = client.schedule("block_first", max_attempts=3)
    wait_for(lambda: _runs(db, job.id), message="the first attempt started")
    procs.kill("victim")
    procs.consumer("survivor")
    procs.wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=60,
                   message="job recovered after its lease expired")
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.LEASE_EXPIRED,
                                                   AttemptOutcome.SUCCEEDED]
    assert [r[1] for r in _runs(db, job.id)] == [1, 2]


@pytest.mark.parametrize("when", ["before", "after"])
def test_timer_killed_between_claim_and_commit_loses_nothing(procs, client, db, tmp_path,
                                                             when):
    signal_file = tmp_path / "hung"
    jobs = client.schedule_many([{"kind": "record"} for _ in range(5)])
    procs.start("faulty-timer", "-m", "tests.support.fault_timer", when,
                TOCK_FAULT_SIGNAL=str(signal_file))
    wait_for(signal_file.exists, message=f"the timer hung {when} sending")
    assert _states(db) == {"scheduled": 5}, "the claim is not visible before its commit"
    procs.kill("faulty-timer")
    procs.consumer("consumer")
    procs.timer("timer")
    procs.wait_for(lambda: _states(db).get("succeeded") == 5, timeout=60,
                   message="all jobs succeeded after the timer died")
    assert sorted(r[0] for r in _runs(db)) == sorted(j.id for j in jobs), "each ran once"


def test_sigterm_releases_unfinished_jobs_and_exits_zero(procs, client, db):
    procs.timer("timer")
    procs.consumer("consumer", TOCK_SHUTDOWN_GRACE_SECONDS="1")
    job = client.schedule("block_first")
    wait_for(lambda: _runs(db, job.id), message="the job started")
    assert procs.terminate("consumer") == 0
    released = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert released.state in (JobState.SCHEDULED, JobState.DISPATCHED)
    procs.consumer("next")
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=60,
             message="released job ran elsewhere")
    assert [r[1] for r in _runs(db, job.id)] == [1, 1], "the attempt was given back"
