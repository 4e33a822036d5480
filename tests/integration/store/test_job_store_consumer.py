"""Conformance of `JobStore` (shared.store.job_store / jobs_sql) against the real Postgres,
the consumer's statements: claim_messages, job_states, heartbeat, detach_lease,
stop_worker and finish_attempts. One test (or a small parametrized group) per method, each
guard of a guarded statement exercised on its own. Rows are arranged and inspected with
plain SQL on `db`; time is pinned through `now=` (the database clock at the start of the
test, plus offsets)."""

from __future__ import annotations

import re
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from consumer.service import CLAIM_PLANNER
from shared.core.errors import LockTimeout
from shared.core.reports import Worker
from shared.core.states import AttemptOutcome, JobState
from shared.store import Database, JobStore, jobs_sql
from shared.store import job_store as job_store_module
from shared.store.rows import AttemptResult, Claim, ClaimedJob, Lease
from tests.integration.store.helpers import (
    add_dispatched,
    add_job,
    add_running,
    attempt_rows,
    claim,
    count,
    job_row,
    run_blocked,
    secs,
)

# --- claim_messages / job_states --------------------------------------------------------------


def test_claim_messages_claims_on_id_and_token_and_fills_task_defaults(job_store, db, now):
    bare, bare_token = add_dispatched(db, now, kind="email", queue="mail", tenant="acme",
                                      unique_key="welcome:1", payload={"n": 1},
                                      run_at=now - secs(3), dispatch_failures=3,
                                      created_at=now - secs(10))
    set_, set_token = add_dispatched(db, now, max_attempts=2, timeout_seconds=10.0,
                                     run_at=now - secs(1))
    claimed = job_store.claim_messages([Claim(bare, bare_token, 5, 30.0),
                                        Claim(set_, set_token, 5, 30.0)],
                                       "w1", 60, now=now)
    by_id = {c.id: c for c in claimed}
    assert by_id[bare] == ClaimedJob(
        id=bare, kind="email", payload={"n": 1}, attempt=1, max_attempts=5,
        timeout_seconds=30.0, run_at=now - secs(3), token=bare_token, queue="mail",
        tenant="acme", key="welcome:1", claimed_at=now, lag_seconds=3.0)
    assert (by_id[set_].max_attempts, by_id[set_].timeout_seconds) == (2, 10.0), \
        "the job's own values win over the task defaults"
    for job_id, (max_attempts, timeout) in ((bare, (5, 30.0)), (set_, (2, 10.0))):
        row = job_row(db, job_id)
        assert (row["state"], row["attempt"], row["lease_owner"], row["lease_expires_at"],
                row["started_at"], row["updated_at"]) == (
            "running", 1, "w1", now + secs(60), now, now)
        assert (row["max_attempts"], row["timeout_seconds"]) == (max_attempts, timeout)
        assert row["dispatch_failures"] == 0, "a claimed send is no longer a refused one"


@pytest.mark.parametrize(("schedule", "late"), [(None, 2.0), ("nightly", 3600.0)])
def test_lateness_runs_from_the_enqueue_unless_the_job_is_a_schedules_run(
        job_store, db, now, schedule, late):
    """An `at` an hour in the past, enqueued 2 s ago, is 2 s late, not an hour: the metrics
    must not carry what the caller asked for. A schedule's run created late (the timer was
    down) is late from its fire time."""
    job_id, token = add_dispatched(db, now, run_at=now - secs(3600), created_at=now - secs(2),
                                   schedule_name=schedule)
    [claimed] = job_store.claim_messages([Claim(job_id, token, 5, 30.0)], "w1", 60, now=now)
    assert (claimed.lag_seconds, claimed.claimed_at) == (late, now)


@pytest.mark.parametrize("case", ["wrong token", "running", "cancelled", "scheduled",
                                  "no such job"])
def test_claim_messages_matches_nothing_without_id_token_and_dispatched(
        job_store, db, now, case):
    job, token = add_dispatched(db, now)
    claim_id, claim_token = job, token
    if case == "wrong token":
        claim_token = uuid4()
    elif case == "no such job":
        claim_id = job + 1000
    else:
        db.execute("UPDATE tock_jobs SET state = %s WHERE id = %s", (case, job))
    before = job_row(db, job)
    assert job_store.claim_messages([Claim(claim_id, claim_token, 3, 30.0)], "w1", 60,
                                    now=now) == []
    assert job_row(db, job) == before


def test_claim_messages_waiting_for_locks_claims_when_nothing_is_locked(job_store, db, now):
    job, token = add_dispatched(db, now)
    claimed = job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60, now=now,
                                       wait_for_locks=True)
    assert [c.id for c in claimed] == [job]
    assert job_row(db, job)["state"] == "running"


def test_claim_messages_waiting_for_a_locked_row_gives_up_with_lock_timeout(
        job_store, db, other, now, monkeypatch):
    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 100)
    job, token = add_dispatched(db, now)
    other.execute("SELECT id FROM tock_jobs WHERE id = %s FOR UPDATE", (job,))
    before = job_row(db, job)
    with pytest.raises(LockTimeout) as caught:
        job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60, now=now,
                                 wait_for_locks=True)
    assert caught.value.sqlstate == "55P03"
    assert not isinstance(caught.value, psycopg.Error)
    other.rollback()
    assert job_row(db, job) == before
    # The lock timeout was local to the claim's transaction: the next claim goes through.
    assert [c.id for c in job_store.claim_messages([Claim(job, token, 3, 30.0)], "w1", 60,
                                                   now=now)] == [job]


def test_claim_messages_waiting_for_locks_sees_the_dispatch_once_it_commits(
        job_store, db, other, now, monkeypatch):
    monkeypatch.setattr(job_store_module, "LOCK_WAIT_MS", 10_000)
    job = add_job(db, run_at=now - secs(1))
    (due,) = claim(JobStore.on(other), 1, now)  # dispatched, not yet committed
    message = Claim(job, due.token, 3, 30.0)
    assert job_store.claim_messages([message], "w1", 60, now=now) == [], \
        "without waiting, the uncommitted dispatch is invisible"
    claimed = run_blocked(db, other, lambda: job_store.claim_messages(
        [message], "w1", 60, now=now, wait_for_locks=True), other.commit)
    assert [c.id for c in claimed] == [job]
    assert job_row(db, job)["state"] == "running"


def _plan_nodes(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(node type, index name) of every node of an EXPLAIN (FORMAT JSON) plan."""
    return [(plan["Node Type"], plan.get("Index Name")),
            *(n for p in plan.get("Plans", []) for n in _plan_nodes(p))]


def test_the_claim_pool_joins_a_batch_by_hash_through_the_primary_key(database_url, db, now):
    """The consumer's claim pool (`CLAIM_PLANNER`): the messages of a batch are joined to
    their rows by hash, not by a nested loop that unnests the batch's arrays again for each
    row (quadratic in the batch), and the rows are found through the primary key, not by a
    scan of the table: on a table of a few rows never analyzed (whose plan, generic, a
    session would keep as the table grows) and on one of thousands, analyzed; in the plan
    of a first execution and in the generic plan every later one reuses. And the claim
    still takes every row."""
    jobs = [add_dispatched(db, now) for _ in range(60)]
    pool = Database.for_service(database_url, name="tock-claim", max_size=1,
                                synchronous_commit=False, planner=CLAIM_PLANNER)
    names = ["ids", "tokens", "default_max_attempts", "default_timeout_seconds", "kinds",
             "queues", "worker", "lease_seconds", "now"]
    types = "bigint[], uuid[], int[], float8[], text[], text[], text, float8, timestamptz"
    numbered = jobs_sql.CLAIM_MESSAGES
    for i, name in enumerate(names, 1):
        numbered = numbered.replace(f"%({name})s", f"${i}")
    batch = jobs[:50]
    routes = [(job_row(db, j)["kind"], job_row(db, j)["queue"]) for j, _ in batch]
    values = [[j for j, _ in batch], [t for _, t in batch], [3] * 50, [30.0] * 50,
              [k for k, _ in routes], [q for _, q in routes], "w1", 60.0, now]

    def plans() -> list[list[tuple[str, str | None]]]:
        found = []
        with pool.connection() as conn:
            conn.execute(f"PREPARE claim_plan ({types}) AS {numbered}")
            try:
                for explain in (f"EXPLAIN (FORMAT JSON) {jobs_sql.CLAIM_MESSAGES}",
                                "EXPLAIN (FORMAT JSON) EXECUTE claim_plan "
                                "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"):
                    args = dict(zip(names, values, strict=True)) if "%(" in explain \
                        else values
                    # Bound by the client: EXPLAIN EXECUTE cannot type its parameters
                    cursor = psycopg.ClientCursor(conn)
                    (plan,), = cursor.execute(explain, args).fetchone()
                    found.append(_plan_nodes(plan["Plan"]))
            finally:
                conn.execute("DEALLOCATE claim_plan")
        return found

    try:
        small = plans()
        # A table of some size, analyzed, where a nested loop looks cheapest to the planner
        db.execute("""
            INSERT INTO tock_jobs (kind, payload, run_at, created_at, updated_at)
            SELECT 'filler', '{}', %(at)s, %(at)s, %(at)s FROM generate_series(1, 5000)""",
                   {"at": now + secs(3600)})
        db.execute("ANALYZE tock_jobs")
        for nodes in small + plans():
            types_seen = [t for t, _ in nodes]
            assert "Hash Join" in types_seen and "Nested Loop" not in types_seen, nodes
            assert "Seq Scan" not in types_seen, nodes
            assert "tock_jobs_pkey" in {i for _, i in nodes}, nodes
        store = JobStore(pool)
        claimed = [c.id for i in range(0, 60, 6)  # past psycopg's prepare threshold
                   for c in store.claim_messages([Claim(j, t, 3, 30.0) for j, t in jobs[i:i + 6]],
                                                 "w1", 60, now=now)]
    finally:
        pool.close()
    assert sorted(claimed) == sorted(j for j, _ in jobs)
    assert {job_row(db, j)["state"] for j, _ in jobs} == {"running"}


def test_job_states_reads_state_and_token_of_existing_jobs(job_store, db, now):
    scheduled = add_job(db, run_at=now)
    dispatched, token = add_dispatched(db, now)
    assert job_store.job_states([scheduled, dispatched, dispatched + 1000]) == {
        scheduled: (JobState.SCHEDULED, None), dispatched: (JobState.DISPATCHED, token)}
    assert job_store.job_states([]) == {}


# --- heartbeat ----------------------------------------------------------------------------------


def _w(worker_id: str = "w1", *, in_flight: int = 0, kinds: list[str] | None = None) -> Worker:
    return Worker(worker_id, "host-a", 101, ["default", "mail"], kinds or ["email"], 8,
                  in_flight)


def test_heartbeat_renews_the_worker_lease_and_writes_no_job_row(job_store, db, now):
    a = add_running(db, now, worker="w1", lease_until=now + secs(10))
    b = add_running(db, now, worker="w1", attempt=2, lease_until=now + secs(3))
    before = {x.job_id: job_row(db, x.job_id) for x in (a, b)}
    assert job_store.heartbeat(_w(), [a, b], 30, now=now + secs(5)) == {a.job_id, b.job_id}
    assert _worker(db, "w1")["lease_expires_at"] == now + secs(35)
    assert {x.job_id: job_row(db, x.job_id) for x in (a, b)} == before, "one row, the worker's"


def test_a_running_job_reads_with_the_lease_its_worker_renewed(job_store, db, now):
    # Its own row keeps the claim's expiry; `get()`, `tock show` and the API showed that,
    # long past, beside an explanation that read the worker's renewed lease.
    a = add_running(db, now, worker="w1", lease_until=now + secs(10))
    job_store.heartbeat(_w(), [a], 30, now=now + secs(5))
    assert job_store.get_job(a.job_id).lease_expires_at == now + secs(35)
    db.execute("UPDATE tock_jobs SET lease_detached = true WHERE id = %s", (a.job_id,))
    assert job_store.get_job(a.job_id).lease_expires_at == now + secs(10), "its own, detached"


@pytest.mark.parametrize("case", ["owner", "attempt", "token", "state", "detached"])
def test_heartbeat_reports_only_the_leases_still_held(job_store, db, now, case):
    good = add_running(db, now, worker="w1")
    lost = add_running(db, now, worker="w1", attempt=2, lease_until=now + secs(10))
    sent = lost
    if case == "owner":
        db.execute("UPDATE tock_jobs SET lease_owner = 'w2' WHERE id = %s", (lost.job_id,))
    elif case == "attempt":
        sent = Lease(lost.job_id, 1, lost.token)
    elif case == "token":
        sent = Lease(lost.job_id, lost.attempt, uuid4())
    elif case == "state":
        db.execute("UPDATE tock_jobs SET state = 'cancelled' WHERE id = %s", (lost.job_id,))
    else:
        assert job_store.detach_lease(lost, "w1", 30, now=now)
    before = job_row(db, lost.job_id)
    assert job_store.heartbeat(_w(), [good, sent], 30, now=now) == {good.job_id}
    assert job_row(db, lost.job_id) == before


def test_detach_lease_is_fenced_and_sets_the_jobs_own_expiry(job_store, db, now):
    lease = add_running(db, now, worker="w1", lease_until=now + secs(1))
    assert not job_store.detach_lease(lease, "w2", 30, now=now), "not w2's"
    assert not job_store.detach_lease(Lease(lease.job_id, 9, lease.token), "w1", 30, now=now)
    assert job_store.detach_lease(lease, "w1", 30, now=now)
    row = job_row(db, lease.job_id)
    assert (row["lease_detached"], row["lease_expires_at"]) == (True, now + secs(30))


# --- the worker row: heartbeat with no leases, stop_worker -------------------------------------


def _worker(db: Any, worker_id: str) -> dict[str, Any]:
    row: dict[str, Any] | None = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM tock_workers WHERE id = %s", (worker_id,)).fetchone()
    assert row is not None
    return row


def test_a_heartbeat_announces_then_refreshes_a_worker(job_store, db, now):
    assert job_store.heartbeat(_w(), [], 30, now=now) == set()
    assert _worker(db, "w1") == {
        "id": "w1", "host": "host-a", "pid": 101, "queues": ["default", "mail"],
        "concurrency": 8, "in_flight": 0, "started_at": now, "last_heartbeat": now,
        "stopped_at": None, "kinds": ["email"], "lease_expires_at": now + secs(30)}
    job_store.heartbeat(_w(in_flight=5, kinds=["email", "sms"]), [], 30, now=now + secs(10))
    row = _worker(db, "w1")
    assert (row["in_flight"], row["last_heartbeat"], row["started_at"], row["kinds"],
            row["lease_expires_at"]) == (5, now + secs(10), now, ["email", "sms"],
                                         now + secs(40))
    assert count(db, "tock_workers") == 1


def test_stop_worker_marks_it_stopped_ends_its_lease_and_a_heartbeat_revives_it(
        job_store, db, now):
    job_store.heartbeat(_w("w1", in_flight=3), [], 30, now=now)
    job_store.heartbeat(_w("w2", in_flight=1), [], 30, now=now)
    job_store.stop_worker("w1", now=now + secs(20))
    row = _worker(db, "w1")
    assert (row["stopped_at"], row["in_flight"], row["lease_expires_at"]) == (
        now + secs(20), 0, now + secs(20))
    assert _worker(db, "w2")["stopped_at"] is None
    job_store.heartbeat(_w("w1", in_flight=2), [], 30, now=now + secs(30))
    row = _worker(db, "w1")
    assert (row["stopped_at"], row["in_flight"]) == (None, 2)
    job_store.stop_worker("nobody", now=now)
    assert count(db, "tock_workers") == 2


# --- finish_attempts --------------------------------------------------------------------------


def _result(lease: Lease, state: JobState, outcome: AttemptOutcome, **kw: Any) -> AttemptResult:
    return AttemptResult(lease, state, outcome, **kw)


def test_finish_attempts_writes_success_with_its_attempt_row(job_store, db, now):
    lease = add_running(db, now, worker="w1", started_at=now - secs(4), run_at=now - secs(9),
                        last_error="earlier failure")
    written = job_store.finish_attempts(
        [_result(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w1", now=now)
    assert written == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"],
            row["updated_at"]) == ("succeeded", 1, now - secs(9), now, now)
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert row["last_error"] == "earlier failure", "no error: the last one is kept"
    assert attempt_rows(db, lease.job_id) == [{
        "job_id": lease.job_id, "attempt": 1, "worker": "w1", "started_at": now - secs(4),
        "finished_at": now, "outcome": "succeeded", "error": None, "traceback": None}]


def test_finish_attempts_retrying_runs_again_after_the_delay(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=2)
    assert job_store.finish_attempts(
        [_result(lease, JobState.RETRYING, AttemptOutcome.FAILED, delay_seconds=7.5,
                 error="boom", traceback="Traceback ...")], "w1", now=now) == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"],
            row["last_error"]) == ("retrying", 2, now + secs(7.5), None, "boom")
    assert [(r["attempt"], r["outcome"], r["error"], r["traceback"])
            for r in attempt_rows(db, lease.job_id)] == [
        (2, "failed", "boom", "Traceback ...")]


def test_finish_attempts_dead_is_finished(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=3)
    job_store.finish_attempts([_result(lease, JobState.DEAD, AttemptOutcome.PERMANENT,
                                       error="bad address")], "w1", now=now)
    row = job_row(db, lease.job_id)
    assert (row["state"], row["finished_at"], row["last_error"]) == ("dead", now, "bad address")
    assert [r["outcome"] for r in attempt_rows(db, lease.job_id)] == ["permanent"]


def test_finish_attempts_refund_gives_the_attempt_back(job_store, db, now):
    lease = add_running(db, now, worker="w1", attempt=2)
    assert job_store.finish_attempts(
        [_result(lease, JobState.SCHEDULED, AttemptOutcome.RELEASED, refund=True,
                 error="worker shutting down")], "w1", now=now) == {lease.job_id}
    row = job_row(db, lease.job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["finished_at"]) == (
        "scheduled", 1, now, None)
    assert [(r["attempt"], r["outcome"]) for r in attempt_rows(db, lease.job_id)] == [
        (2, "released")], "the attempt row still says which attempt was released"


@pytest.mark.parametrize("case", ["worker", "attempt", "token", "state"])
def test_finish_attempts_is_fenced_on_worker_attempt_token_and_state(job_store, db, now, case):
    good = add_running(db, now, worker="w1")
    lost = add_running(db, now, worker="w1", attempt=2)
    sent, worker = lost, "w1"
    if case == "worker":
        db.execute("UPDATE tock_jobs SET lease_owner = 'w2' WHERE id = %s", (lost.job_id,))
    elif case == "attempt":
        sent = Lease(lost.job_id, 3, lost.token)
    elif case == "token":
        sent = Lease(lost.job_id, lost.attempt, uuid4())
    else:
        db.execute("UPDATE tock_jobs SET state = 'cancelled' WHERE id = %s", (lost.job_id,))
    before = job_row(db, lost.job_id)
    written = job_store.finish_attempts(
        [_result(good, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
         _result(sent, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], worker, now=now)
    assert written == {good.job_id}
    assert job_row(db, lost.job_id) == before
    assert attempt_rows(db, lost.job_id) == []
    assert [r["job_id"] for r in attempt_rows(db)] == [good.job_id], \
        "one attempt row per written job"


def test_finish_attempts_of_another_worker_writes_nothing(job_store, db, now):
    lease = add_running(db, now, worker="w1")
    assert job_store.finish_attempts(
        [_result(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], "w2", now=now) == set()
    assert job_row(db, lease.job_id)["state"] == "running"
    assert attempt_rows(db) == []


# --- plans ------------------------------------------------------------------------------------


def _in_flight_after_stale_statistics(db: psycopg.Connection[Any], now: Any,
                                      lease_seconds: float) -> None:
    """4,000 jobs analyzed while all were scheduled, then 2,000 dispatched and 2,000
    running under worker w1 with leases expiring `lease_seconds` from `now`: statistics
    that count nothing in flight."""
    db.execute("""INSERT INTO tock_jobs (kind, state, run_at, payload)
                  SELECT 'k', 'scheduled', %s, '{}' FROM generate_series(1, 4000)""", (now,))
    db.execute("ANALYZE tock_jobs")
    db.execute("""UPDATE tock_jobs SET state = 'dispatched', dispatch_token = gen_random_uuid(),
                  dispatched_at = %s WHERE id <= 2000""", (now,))
    db.execute("""UPDATE tock_jobs SET state = 'running', dispatch_token = gen_random_uuid(),
                  attempt = 1, lease_owner = 'w1',
                  lease_expires_at = %s + make_interval(secs => %s), started_at = %s
                  WHERE id > 2000""", (now, lease_seconds, now))


def test_the_consumers_statements_go_through_the_primary_key_whatever_the_statistics(
        job_store, db, now, monkeypatch):
    """Statistics taken when nothing was in flight (an ANALYZE, as between two autovacuums)
    made the planner count the partial indexes of in-flight rows as empty and read every
    dispatched or running row through them on each claim and each outcome (480 rows read
    per 10-row claim in the in-memory benchmark). Each statement must probe the primary
    key instead, however many rows are in flight."""
    _in_flight_after_stale_statistics(db, now, lease_seconds=60)
    dispatched = db.execute("SELECT id, dispatch_token FROM tock_jobs WHERE state = "
                            "'dispatched' ORDER BY id LIMIT 10").fetchall()
    running = [Lease(r[0], 1, r[1]) for r in db.execute(
        "SELECT id, dispatch_token FROM tock_jobs WHERE state = 'running' ORDER BY id "
        "LIMIT 10").fetchall()]
    plans: dict[str, str] = {}
    execute = job_store_module.Store._execute

    def explained(conn: Any, query: Any, params: Any) -> Any:
        if str(query).lstrip().upper().startswith(("UPDATE", "WITH")):
            plans[str(query)] = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + str(query), params).fetchall())
        return execute(conn, query, params)

    monkeypatch.setattr(job_store_module.Store, "_execute", staticmethod(explained))
    claimed = job_store.claim_messages([Claim(i, t, 3, 60.0) for i, t in dispatched], "w2",
                                       30, now=now)
    held = job_store.heartbeat(_w("w1"), running, 30, now=now)
    assert job_store.detach_lease(running[0], "w1", 30, now=now)
    written = job_store.finish_attempts(
        [_result(lease, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED) for lease in running[1:]],
        "w1", now=now)
    assert len(claimed) == 10 and len(held) == 10 and len(written) == 9
    assert len(plans) >= 4, list(plans)
    for statement, plan in plans.items():
        assert "tock_jobs_pkey" in plan, (statement, plan)
        for other in ("tock_jobs_in_flight_idx", "tock_jobs_owner_idx", "tock_jobs_state_idx",
                      "tock_jobs_dispatched_idx", "Seq Scan on tock_jobs "):
            assert other not in plan, (statement, plan)


_PARAMETER_TYPES = {
    "ids": "bigint[]", "attempts": "int[]", "tokens": "uuid[]", "states": "tock_job_state[]",
    "prev_states": "tock_job_state[]", "delays": "float8[]",
    "outcomes": "tock_attempt_outcome[]", "errors": "text[]", "tracebacks": "text[]",
    "refunds": "bool[]", "workers": "text[]", "worker": "text", "now": "timestamptz",
    "backoff_cap": "float8", "backoff_base": "float8", "id": "text", "host": "text",
    "pid": "int", "queues": "text[]", "kinds": "text[]", "concurrency": "int",
    "in_flight": "int", "lease_seconds": "float8", "running": "uuid[]"}


def _batch_rescans(conn: psycopg.Connection[Any], statement: str,
                   params: dict[str, Any]) -> list[str]:
    """Run `statement` once as a prepared statement under EXPLAIN ANALYZE (rolled back) and
    return its scans of the batch (the unnest, or a CTE over it) that ran more than once."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    numbered = statement
    for i, name in enumerate(names, 1):
        numbered = numbered.replace(f"%({name})s", f"${i}")
    conn.execute(f"PREPARE batch_plan ({', '.join(_PARAMETER_TYPES[n] for n in names)}) "
                 f"AS {numbered}")
    try:
        # Bound by the client: EXPLAIN EXECUTE cannot type its parameters
        (plan,), = psycopg.ClientCursor(conn).execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE batch_plan "
            f"({', '.join('%s' for _ in names)})", [params[n] for n in names]).fetchone()
    finally:
        conn.rollback()
        conn.execute("DEALLOCATE batch_plan")

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    return [f"{n['Node Type']} on {n.get('Alias')} x{n['Actual Loops']}"
            for n in nodes(plan["Plan"])
            if n["Node Type"] in ("CTE Scan", "Function Scan") and n["Actual Loops"] > 1]


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
def test_batch_statements_probe_the_primary_key_per_row_and_read_the_batch_once(
        database_url, db, now, plan_mode):
    """A batch statement joins its rows (an unnest) to tock_jobs on the id. With a second
    way in (`j.id = ANY(ids)` beside the join) the generic plan, counting one row there,
    read the rows first and scanned the whole batch again for each: quadratic (300
    outcomes: 29 ms instead of 9; a heartbeat of 300 leases 11 ms instead of 0.7). The
    batch must be read once, each of its rows probing the primary key, in the plan of
    a first execution and in the generic one every later execution reuses."""
    _in_flight_after_stale_statistics(db, now, lease_seconds=-60)  # expired: rescuable
    n = 50
    dispatched = db.execute("SELECT id, dispatch_token FROM tock_jobs WHERE state = "
                            "'dispatched' ORDER BY id LIMIT %s", (n,)).fetchall()
    running = db.execute("SELECT id, dispatch_token FROM tock_jobs WHERE state = 'running' "
                         "ORDER BY id LIMIT %s", (n,)).fetchall()
    leases = {"ids": [i for i, _ in running], "attempts": [1] * n,
              "tokens": [t for _, t in running], "worker": "w1", "now": None}
    outcome = {**leases, "delays": [5.0] * n, "tracebacks": None, "refunds": [False] * n}
    statements = {
        "FINISH_ATTEMPTS, succeeded": (jobs_sql.FINISH_ATTEMPTS, {
            **outcome, "states": ["succeeded"] * n, "outcomes": ["succeeded"] * n,
            "errors": None}),
        "FINISH_ATTEMPTS, retrying": (jobs_sql.FINISH_ATTEMPTS, {
            **outcome, "states": ["retrying"] * n, "outcomes": ["failed"] * n,
            "errors": ["boom"] * n}),
        "WORKER_BEAT": (jobs_sql.WORKER_BEAT, {
            **leases, "id": "w1", "host": "h", "pid": 1, "queues": ["default"],
            "kinds": ["k"], "concurrency": n, "in_flight": n, "lease_seconds": 30.0,
            "running": []}),
        "RESCUE_EXPIRED": (jobs_sql.RESCUE_EXPIRED, {
            **leases, "states": ["dead"] * n, "delays": [0.0] * n, "errors": ["lost"] * n,
            "workers": ["w1"] * n}),
        "UNDO_DISPATCH": (jobs_sql.UNDO_DISPATCH, {
            "ids": [i for i, _ in dispatched], "prev_states": ["scheduled"] * n,
            "errors": ["refused"] * n, "backoff_cap": 60.0, "backoff_base": 1.0,
            "now": None}),
    }
    with psycopg.connect(database_url) as conn:
        conn.execute(f"SET plan_cache_mode = {plan_mode}")
        conn.commit()
        rescans = {name: _batch_rescans(conn, statement, params)
                   for name, (statement, params) in statements.items()}
    assert rescans == {name: [] for name in statements}


def test_release_untracked_detaches_old_claims_the_worker_does_not_hold(job_store, db, now):
    # The claim of `orphan` committed while its reply was lost: the worker never held it.
    orphan = add_running(db, now, worker="w1", started_at=now - secs(61))
    held = add_running(db, now, worker="w1", started_at=now - secs(61))
    young = add_running(db, now, worker="w1", started_at=now - secs(59))
    others = add_running(db, now, worker="w2", started_at=now - secs(61))
    detached = add_running(db, now, worker="w1", started_at=now - secs(61))
    assert job_store.detach_lease(detached, "w1", 5, now=now)
    before = {x.job_id: job_row(db, x.job_id) for x in (held, young, others, detached)}
    released = job_store.release_untracked("w1", [held.job_id], 60, 30, now=now)
    assert released == [(orphan.job_id, orphan.attempt)]
    row = job_row(db, orphan.job_id)
    assert (row["state"], row["lease_detached"], row["lease_expires_at"]) == (
        "running", True, now + secs(30))
    assert {x.job_id: job_row(db, x.job_id) for x in (held, young, others, detached)} == before
    assert job_store.release_untracked("w1", [held.job_id], 60, 30, now=now) == []
