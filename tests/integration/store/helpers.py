"""Arranging and inspecting rows with plain SQL on the `db` connection, so a test of one
store method does not lean on the others."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID, uuid4

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from shared.store.flow_store import FlowStore
from shared.store.rows import Lease
from tests.support.wait import wait_for

T = TypeVar("T")


def claim(store: Any, limit: int, now: datetime) -> list[Any]:
    """The timer's claim of up to `limit` due jobs, highest level first, then (kind, queue,
    tenant) by (kind, queue, tenant), from FlowStore's pieces (due_levels, due_pairs,
    claim_pairs) on `store`'s connection, without the dispatcher's fair share."""
    flow = store.sibling(FlowStore)
    claimed: list[Any] = []
    for level in flow.due_levels(now):
        for kind, queue, tenant, _ in flow.due_pairs(level, limit, now=now):
            if len(claimed) < limit:
                claimed += flow.claim_pairs(
                    level, [(kind, queue, tenant, limit - len(claimed))], now)
    return claimed


def secs(n: float) -> timedelta:
    return timedelta(seconds=n)


def insert_row(db: Any, table: str, **cols: Any) -> None:
    """Insert one row with exactly these columns."""
    db.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, cols)),
        sql.SQL(", ").join(sql.Placeholder(c) for c in cols)), cols)


def add_job(db: Any, *, run_at: datetime, kind: str = "k", state: str = "scheduled",
            payload: Any = None, **cols: Any) -> int:
    """A job row in any state, with the columns given (the rest take their defaults)."""
    values = {"kind": kind, "state": state, "run_at": run_at,
              "payload": Jsonb(payload if payload is not None else {}), **cols}
    query = sql.SQL("INSERT INTO tock_jobs ({}) VALUES ({}) RETURNING id").format(
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder(c) for c in values))
    job_id: int = db.execute(query, values).fetchone()[0]
    return job_id


def running_before_upgrade(url: str, before: str) -> tuple[datetime, Lease]:
    """On a database at an older schema: worker w1's row and a job of kind report it runs;
    then every migration after `before`. Returns (the database's now, the job's lease)."""
    from shared.store.migrate import available, migrate

    with psycopg.connect(url, autocommit=True) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
        conn.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, "
                     "in_flight, started_at, last_heartbeat, lease_expires_at) "
                     "VALUES ('w1', 'h', 1, '{default}', 4, 1, %s, %s, %s)",
                     (now, now, now + secs(30)))
        lease = add_running(conn, now, kind="report")
    names = [name for name, _ in available()]
    assert migrate(url) == names[names.index(before) + 1:]
    return now, lease


def add_running(db: Any, now: datetime, *, worker: str = "w1", attempt: int = 1,
                lease_until: datetime | None = None, token: UUID | None = None,
                **cols: Any) -> Lease:
    """A job `worker` runs under a lease (attempt, token); returns the lease."""
    token = token or uuid4()
    cols.setdefault("run_at", now - secs(60))
    cols.setdefault("started_at", now - secs(30))
    cols.setdefault("dispatched_at", now - secs(40))
    job_id = add_job(db, state="running", attempt=attempt, lease_owner=worker,
                     lease_expires_at=lease_until or now + secs(30), dispatch_token=token,
                     **cols)
    return Lease(job_id, attempt, token)


def add_dispatched(db: Any, now: datetime, **cols: Any) -> tuple[int, UUID]:
    token = cols.pop("dispatch_token", None) or uuid4()
    cols.setdefault("run_at", now - secs(5))
    cols.setdefault("dispatched_at", now - secs(1))
    cols.setdefault("state", "dispatched")
    return add_job(db, dispatch_token=token, **cols), token


def job_row(db: Any, job_id: int) -> dict[str, Any]:
    """The job's row, in the hot table or in the history (the view tock_jobs_all)."""
    row: dict[str, Any] = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM tock_jobs_all WHERE id = %s", (job_id,)).fetchone()
    return row


def side_of(db: Any, job_id: int) -> str | None:
    """Where the job is: 'hot' (tock_jobs), 'history' (its partition's name) or None."""
    if db.execute("SELECT 1 FROM tock_jobs WHERE id = %s", (job_id,)).fetchone():
        return "hot"
    row = db.execute("SELECT tableoid::regclass::text FROM tock_history_jobs WHERE id = %s",
                     (job_id,)).fetchone()
    return row[0] if row else None


def attempt_rows(db: Any, job_id: int | None = None) -> list[dict[str, Any]]:
    """Attempt rows (of one job, or all), oldest first, without their serial id, wherever
    they are (the view tock_attempts_all)."""
    cur = db.cursor(row_factory=dict_row)
    if job_id is None:
        rows = cur.execute("SELECT * FROM tock_attempts_all ORDER BY id").fetchall()
    else:
        rows = cur.execute("SELECT * FROM tock_attempts_all WHERE job_id = %s ORDER BY id",
                           (job_id,)).fetchall()
    for r in rows:
        del r["id"]
    return rows


def count(db: Any, table: str, where: str = "true", params: Any = None) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE ").format(sql.Identifier(table)) \
        + sql.SQL(where)
    n: int = db.execute(query, params).fetchone()[0]
    return n


def wait_until_blocked_by(db: Any, blocker_pid: int) -> None:
    """Wait (polling, no fixed sleep) until some backend waits for a lock `blocker_pid`
    holds."""
    wait_for(lambda: db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        (blocker_pid,)).fetchone()[0] > 0, timeout=10, interval=0.005,
        message=f"a backend blocked by {blocker_pid}")


def run_blocked(db: Any, blocker: Any, call: Callable[[], T], release: Callable[[], object]
                ) -> T:
    """Run `call()` in a thread; once it waits for a lock the connection `blocker` holds,
    `release()` (commit or roll back `blocker`); return what `call()` returned (or raise
    what it raised)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # re-raised in the test's thread below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until_blocked_by(db, blocker.info.backend_pid)
        release()
    finally:
        thread.join(timeout=15)
    assert not thread.is_alive(), "the blocked call did not finish after the release"
    if "error" in result:
        raise result["error"]
    value: T = result["value"]
    return value


def add_finished(db: Any, *, state: str, finished_at: datetime, kind: str = "k",
                 payload: Any = None, **cols: Any) -> int:
    """A job already in the history, as a move leaves it (its key's row written too); its
    id comes from tock_jobs' sequence like every job's."""
    job_id: int = db.execute(
        "SELECT nextval(pg_get_serial_sequence('tock_jobs', 'id'))").fetchone()[0]
    values = {"id": job_id, "kind": kind, "queue": "default", "priority": 0,
              "state": state, "run_at": finished_at - timedelta(seconds=5), "attempt": 1,
              "created_at": finished_at - timedelta(seconds=10), "updated_at": finished_at,
              "finished_at": finished_at, "dispatch_failures": 0, "lease_detached": False,
              "payload": Jsonb(payload if payload is not None else {}), **cols}
    insert_row(db, "tock_history_jobs", **values)
    if values.get("unique_key") is not None:
        insert_row(db, "tock_keys", unique_key=values["unique_key"], job_id=job_id)
    return job_id


def add_history_attempt(db: Any, job_id: int, *, attempt: int, outcome: str,
                        finished_at: datetime, **cols: Any) -> None:
    """An attempt of a job in the history, in its job's partition."""
    state, job_finished_at = db.execute(
        "SELECT state, finished_at FROM tock_history_jobs WHERE id = %s", (job_id,)).fetchone()
    insert_row(db, "tock_history_attempts", job_id=job_id, attempt=attempt, outcome=outcome,
               finished_at=finished_at, job_state=state, job_finished_at=job_finished_at,
               **cols)


def keys(db: Any) -> dict[str, int]:
    """tock_keys as {key: job id}."""
    return dict(db.execute("SELECT unique_key, job_id FROM tock_keys").fetchall())


def day_table(prefix: str, state: str, day: datetime) -> str:
    """The name of a day partition, e.g. tock_history_jobs_dead_p20261202."""
    return f"{prefix}_{state}_p{day.astimezone(UTC):%Y%m%d}"


def attempt_sides(db: Any, job_id: int) -> list[tuple[int, str]]:
    """(attempt id, 'hot' or its history partition) of the job's attempts, oldest first."""
    rows = db.execute(
        "SELECT id, 'hot' FROM tock_attempts WHERE job_id = %s UNION ALL "
        "SELECT id, tableoid::regclass::text FROM tock_history_attempts WHERE job_id = %s "
        "ORDER BY 1", (job_id, job_id)).fetchall()
    return [(r[0], r[1]) for r in rows]
