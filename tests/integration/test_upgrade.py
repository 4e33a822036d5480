"""Upgrading a database from the 0006 schema with finished jobs in tock_jobs: migration 0007
moves nothing itself (so it never holds a big table), the jobs stay readable and their
keys keep working meanwhile, and the timer's retention loop then moves them to the
history in bounded batches (deleting those already past retention), after which
everything is read, retried and cancelled as usual."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import psycopg

from shared.client import Client
from shared.core.filters import JobFilter
from shared.core.states import AttemptOutcome, JobState
from shared.ops import explain
from shared.runtime.settings import ClientSettings
from shared.store import Database, JobStore, OperatorStore
from shared.store.migrate import applied, available, migrate
from shared.store.retention_store import RetentionStore
from shared.store.rows import AttemptResult, Lease
from tests.integration.store.helpers import add_job, attempt_sides, insert_row, keys, side_of
from tests.support.drive import db_now
from timer_service.retention import Retention

DAY = timedelta(days=1)
BEFORE = "0006_worker_leases.sql"
BACKLOG = 1200



def _fill(conn, now) -> dict[str, int]:
    """What a 0006 database holds: finished jobs with attempts and keys, unfinished work,
    workers and audit records."""
    jobs = {
        "ok": add_job(conn, run_at=now - DAY, state="succeeded", finished_at=now - DAY,
                      unique_key="ok", started_at=now - DAY, attempt=2, kind="email"),
        "dead": add_job(conn, run_at=now, state="dead", finished_at=now - 10 * DAY,
                        unique_key="dead", attempt=1, last_error="boom"),
        "old": add_job(conn, run_at=now, state="cancelled", finished_at=now - 20 * DAY,
                       unique_key="old"),
        "pending": add_job(conn, run_at=now + DAY, unique_key="pending"),
        "busy": add_job(conn, run_at=now, state="running", unique_key="busy", attempt=1,
                        lease_owner="w1", lease_expires_at=now + DAY,
                        dispatch_token=uuid4(), started_at=now),
    }
    for n, outcome in ((1, "failed"), (2, "succeeded")):
        insert_row(conn, "tock_attempts", job_id=jobs["ok"], attempt=n, worker="w0",
                   finished_at=now - DAY - (2 - n) * timedelta(seconds=5), outcome=outcome)
    insert_row(conn, "tock_attempts", job_id=jobs["dead"], attempt=1,
               finished_at=now - 10 * DAY, outcome="permanent", error="boom")
    insert_row(conn, "tock_attempts", job_id=jobs["old"], attempt=1,
               finished_at=now - 20 * DAY, outcome="failed")
    conn.execute("""INSERT INTO tock_jobs (kind, state, run_at, finished_at, payload)
                    SELECT 'bulk', 'succeeded', %(t)s, %(t)s, '{}'
                    FROM generate_series(1, %(n)s)""", {"t": now - 2 * DAY, "n": BACKLOG})
    insert_row(conn, "tock_workers", id="w-gone", host="h", pid=1, queues=["default"],
               concurrency=1, started_at=now - 9 * DAY, last_heartbeat=now - 8 * DAY,
               stopped_at=now - 8 * DAY)
    insert_row(conn, "tock_workers", id="w1", host="h", pid=2, queues=["default"],
               concurrency=1, started_at=now, last_heartbeat=now, lease_expires_at=now + DAY)
    return jobs


def test_upgrade_from_0006_moves_finished_jobs_afterwards_in_batches(old_url):
    with psycopg.connect(old_url, autocommit=True) as conn:
        now = db_now(conn)
        jobs = _fill(conn, now)
        migrate(old_url)
        assert applied(conn) == [name for name, _ in available()]
        hot = conn.execute("SELECT count(*) FROM tock_jobs").fetchone()[0]
        assert hot == BACKLOG + 5 and keys(conn) == {}, "the migration moved nothing"

        database = Database(old_url, max_size=4, name="tock-upgrade")
        client = Client(ClientSettings(database_url=old_url))
        try:
            # Before the loop ran: the old rows read as before, and their keys hold.
            assert client.get(jobs["ok"], with_attempts=True).state is JobState.SUCCEEDED
            assert client.schedule("email", key="ok").id == jobs["ok"]
            assert client.schedule("email", key="pending").id == jobs["pending"]

            loop = Retention(RetentionStore(database), retention_hours={
                JobState.SUCCEEDED: 168, JobState.DEAD: 720, JobState.CANCELLED: 168},
                workers_hours=24, audit_hours=720, batch_size=100, interval_seconds=60)
            passes = 1
            while loop.run_once(now):
                passes += 1
            assert passes > 1, "a bounded pass at a time"

            left = dict(conn.execute("SELECT id, state::text FROM tock_jobs").fetchall())
            assert left == {jobs["pending"]: "scheduled", jobs["busy"]: "running"}
            for name, state, ago in (("ok", "succeeded", DAY), ("dead", "dead", 10 * DAY)):
                day = (now - ago).astimezone(now.tzinfo)
                assert side_of(conn, jobs[name]) == f"tock_history_jobs_{state}_p{day:%Y%m%d}"
            assert side_of(conn, jobs["old"]) is None, "cancelled 20 days ago: past 168 h"
            assert attempt_sides(conn, jobs["old"]) == []
            assert conn.execute("SELECT count(*) FROM tock_history_jobs WHERE kind = 'bulk'"
                                ).fetchone()[0] == BACKLOG
            assert keys(conn) == {"ok": jobs["ok"], "dead": jobs["dead"]}
            assert [r[0] for r in conn.execute("SELECT id FROM tock_workers")] == ["w1"]
            _read_and_change_after_the_move(client, database, conn, jobs, now, loop)
        finally:
            client.close()
            database.close()


def _read_and_change_after_the_move(client, database, conn, jobs, now, loop) -> None:
    ok = client.get(jobs["ok"], with_attempts=True)
    assert [a.outcome for a in ok.attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED]
    again = client.schedule("email", key="ok")
    assert (again.id, again.created) == (jobs["ok"], False)
    operators = OperatorStore(database)
    listed = operators.list_jobs(JobFilter.of(states=["dead", "succeeded"], kind="email"),
                                 limit=10)
    assert [j.id for j in listed] == [jobs["ok"]]
    with operators.transaction() as tx:
        why = explain.explain(ok, explain.gather(tx, ok))
    assert why.summary.startswith("Succeeded at")

    retried = client.retry(jobs["dead"])
    assert retried.state is JobState.SCHEDULED and side_of(conn, jobs["dead"]) == "hot"
    assert [a.outcome for a in client.get(jobs["dead"], with_attempts=True).attempts] == [
        AttemptOutcome.PERMANENT]

    # The old unfinished jobs have no key row: they finish in place, and the next pass
    # moves them with their keys.
    client.cancel(jobs["pending"])
    token = conn.execute("SELECT dispatch_token FROM tock_jobs WHERE id = %s",
                         (jobs["busy"],)).fetchone()[0]
    JobStore(database).finish_attempts([AttemptResult(
        Lease(jobs["busy"], 1, token), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w1")
    assert {side_of(conn, jobs[n]) for n in ("pending", "busy")} == {"hot"}
    while loop.run_once(now):
        pass
    assert {side_of(conn, jobs[n]) for n in ("pending", "busy")} != {"hot"}
    assert client.schedule("x", key="busy").id == jobs["busy"]
    assert keys(conn)["pending"] == jobs["pending"]
