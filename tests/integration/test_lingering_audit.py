"""Lingering handlers in the corners: the same job's retry on the worker whose handler for
it is stuck, a cancel racing the claim, a graceful stop. Each counts the handlers that
really run at once, in the handlers themselves. Real consumer, timer, Postgres and SQS."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from shared.core.states import JobState
from tests.support.drive import dispatch, timer_running
from tests.support.wait import wait_for


class Gauge:
    """How many handlers run now, and the most that ever ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> Gauge:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def _lingering(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM tock_lingering").fetchone()[0])


def test_a_stuck_handler_keeps_its_slot_when_its_own_retry_ran_on_the_same_worker(
        client, db, timer, registry, running):
    """One consumer: the retry of a stuck handler's job lands beside it. When the retry
    finishes, the stuck handler still runs, and still holds its slot."""
    gauge = Gauge()
    stuck_started, let_go = threading.Event(), threading.Event()
    blockers = threading.Semaphore(0)

    def handler(payload: dict[str, Any], ctx: Any) -> None:
        with gauge:
            role = (payload or {}).get("role")
            if role == "stuck" and not stuck_started.is_set():
                stuck_started.set()
                let_go.wait(60)  # ignores its deadline
            elif role == "block":
                blockers.release()
                let_go.wait(60)

    registry.add("k", handler)
    running(concurrency=4, lease_seconds=2, heartbeat_seconds=0.4,
            visibility_timeout_seconds=2)
    client.set_limit("kind", "k", max_running=2)
    stuck = client.schedule("k", {"role": "stuck"}, timeout=0.2, max_attempts=3)
    dispatch(timer)
    assert stuck_started.wait(30)
    try:
        # Rescued, retried on this same (only) consumer beside its stuck first attempt,
        # and succeeded there.
        wait_for(lambda: dispatch(timer) >= 0
                 and client.get(stuck.id).state is JobState.SUCCEEDED,
                 message="the stuck job's retry ran")
        assert gauge.now == 1, "the first attempt's handler still runs"
        others = [client.schedule("k", {"role": "block"}) for _ in range(2)]
        # Give heartbeats time to (wrongly) forget the stuck handler's row: wait until
        # the consumer has beaten at least twice more, seen through its worker row.
        beat = db.execute("SELECT last_heartbeat FROM tock_workers").fetchone()[0]
        wait_for(lambda: db.execute("SELECT count(*) FROM tock_workers "
                                    "WHERE last_heartbeat > %s + interval '1 second'",
                                    (beat,)).fetchone()[0] == 1,
                 message="two more heartbeats")
        sent = dispatch(timer)
        assert sent == 1, "one slot is the stuck handler's, one is free"
        assert _lingering(db) == 1, "the stuck handler still runs: its row stays"
        assert blockers.acquire(timeout=30)
        assert {client.get(o.id).state for o in others} == {JobState.RUNNING,
                                                            JobState.SCHEDULED}
    finally:
        let_go.set()
    for job in others:
        wait_for(lambda j=job: dispatch(timer) >= 0
                 and client.get(j.id).state is JobState.SUCCEEDED, message=f"job {job.id}")
    assert gauge.most <= 2


def test_a_cancelled_handler_keeps_its_slot_when_its_job_is_retried_onto_its_worker(
        client, db, timer, registry, running):
    """A retry starts the attempts again: the retried job's first attempt on the same
    worker is no reason to stop counting the cancelled first run's handler."""
    gauge = Gauge()
    started = threading.Semaphore(0)
    let_go = threading.Event()
    contexts: list[Any] = []

    def ignores_cancel(payload: dict[str, Any], ctx: Any) -> None:
        with gauge:
            contexts.append(ctx)
            started.release()
            let_go.wait(60)

    registry.add("k", ignores_cancel)
    running(concurrency=4, lease_seconds=2, heartbeat_seconds=0.4,
            visibility_timeout_seconds=2)
    client.set_limit("kind", "k", max_running=2)
    job = client.schedule("k")
    dispatch(timer)
    assert started.acquire(timeout=30)
    try:
        client.cancel(job.id)
        wait_for(contexts[0].cancelled.is_set, message="the handler was told")
        client.retry(job.id)
        assert dispatch(timer) == 1, "one slot is the cancelled handler's, one is free"
        assert started.acquire(timeout=30), "the retried job runs"
        assert client.get(job.id).attempt == contexts[0].attempt, "the same attempt again"
        other = client.schedule("k")
        assert dispatch(timer) == 0, (
            "the cancelled handler and the retry run: a limit of 2 has no room for a third")
        assert client.get(other.id).state is JobState.SCHEDULED
    finally:
        let_go.set()
    wait_for(lambda: dispatch(timer) >= 0 and client.get(other.id).state is JobState.SUCCEEDED,
             message="the other job ran once the handlers returned")
    assert gauge.most <= 2


def test_a_handler_released_at_shutdown_keeps_its_slot_until_its_worker_stops(
        client, timer, registry, running, database_url):
    """A graceful stop gives its unfinished jobs back at once, while their handlers run
    until the process exits: the released job must not start elsewhere before then."""
    started = threading.Semaphore(0)
    let_go = threading.Event()
    stopped_at_start: list[Any] = []

    def ignores_cancel(payload: dict[str, Any], ctx: Any) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            stopped_at_start.append(conn.execute(
                "SELECT stopped_at FROM tock_workers WHERE id = %s",
                ((payload or {}).get("first_worker", ""),)).fetchone())
        started.release()
        let_go.wait(60)

    registry.add("k", ignores_cancel)
    settings = {"concurrency": 1, "lease_seconds": 5, "heartbeat_seconds": 0.4,
                "visibility_timeout_seconds": 5}
    first = running(**settings, shutdown_grace_seconds=0.5)
    client.set_limit("kind", "k", max_running=1)
    client.schedule("k", {"first_worker": first.worker_id})
    dispatch(timer)
    assert started.acquire(timeout=30)
    running(**settings)
    stopping = threading.Thread(target=first.shutdown)
    try:
        with timer_running(timer.settings, timer.transport):
            stopping.start()
            assert started.acquire(timeout=30), "the released job ran again"
    finally:
        let_go.set()
        stopping.join(30)
    again = stopped_at_start[1]
    assert again is not None and again[0] is not None, \
        "the released job started elsewhere while its first handler still ran"
