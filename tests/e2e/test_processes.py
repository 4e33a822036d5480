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


def test_a_backlog_waits_in_postgres_while_no_consumer_lives_and_drains_after(
        procs, client, db):
    """The dispatch window against a dead fleet: a consumer is killed -9 mid-backlog; while
    none runs, the timer sends no more than about its window (the rest stays in Postgres,
    nothing piles up in SQS); a new consumer drains everything, each job succeeding once."""
    procs.timer("timer", TOCK_DISPATCH_WINDOW="100")
    procs.consumer("victim", "--concurrency", "4")
    client.schedule_many([{"kind": "record", "payload": {"n": i}} for i in range(1500)])
    procs.wait_for(lambda: len(_runs(db)) >= 50, timeout=60, message="50 jobs ran")
    procs.kill("victim")
    most = [0]

    def victims_rescued() -> bool:  # its leases (3 s) expire and the timer takes the jobs back
        in_sqs, running, waiting = db.execute("""
            SELECT count(*) FILTER (WHERE state = 'dispatched'),
                   count(*) FILTER (WHERE state = 'running'),
                   count(*) FILTER (WHERE state IN ('scheduled', 'retrying'))
            FROM tock_jobs""").fetchone()
        most[0] = max(most[0], in_sqs)
        return running == 0 and waiting > 0
    procs.wait_for(victims_rescued, timeout=60, message="the victim's jobs rescued")
    # Soft: each of the two dispatch threads may send a batch on a count 20 ms old.
    assert most[0] <= 100 + 2 * 100, f"{most[0]} jobs in SQS with no consumer alive"
    procs.consumer("survivor", "--concurrency", "8")
    procs.wait_for(lambda: _states(db).get("succeeded") == 1500, timeout=180,
                   message="1500 jobs succeeded")
    assert _states(db) == {"succeeded": 1500}
    attempts = db.execute("SELECT count(*), count(DISTINCT job_id) FROM tock_attempts_all "
                          "WHERE outcome = 'succeeded'").fetchone()
    assert attempts == (1500, 1500), "each job succeeded exactly once"


def test_a_killed_consumers_lingering_handler_frees_its_slot_once_the_timer_finds_it_dead(
        procs, client, db):
    """A cancelled job whose handler runs on holds its tenant's one slot; kill -9 its
    consumer and the timer frees the slot as it would rescue the consumer's jobs (its lease,
    3 s, expired), so the tenant's next job runs on a new consumer."""
    client.set_limit("tenant", "t", max_running=1)
    procs.timer("timer")
    procs.consumer("victim")
    hung = client.schedule("hang_first", tenant="t", timeout=60)
    procs.wait_for(lambda: _runs(db, hung.id), timeout=60, message="the handler started")
    client.cancel(hung.id)
    waiting = client.schedule("record", tenant="t")
    procs.wait_for(lambda: db.execute("SELECT count(*) FROM tock_lingering").fetchone()[0],
                   timeout=30, message="the cancelled handler's slot held")
    assert client.get(waiting.id).state is JobState.SCHEDULED, "no slot while it runs"
    procs.kill("victim")
    procs.consumer("survivor")
    procs.wait_for(lambda: client.get(waiting.id).state is JobState.SUCCEEDED, timeout=60,
                   message="the slot freed once the victim was found dead")
    assert "lingering_freed" in procs.logs()
    assert [r[1] for r in _runs(db, hung.id)] == [1], "the cancelled job never ran again"
