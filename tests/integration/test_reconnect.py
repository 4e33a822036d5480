"""After Postgres goes away and comes back, every part works again at once: a producer
call waiting through a short outage succeeds instead of timing out, and the timer and a
consumer dispatch and run jobs again, with no process restarted. Each test has its own
throwaway Postgres server (the session's is shared by other tests), restarted for real."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.postgres import PostgresServer
from shared.client import Client
from shared.core.errors import Retryable
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.store import producer_sql
from shared.store.base import Store
from shared.store.database import Database
from shared.store.statistics_store import StatisticsStore
from shared.transport.sqs import SqsTransport
from tests.faults.proxy import TcpProxy
from tests.support.wait import wait_for
from timer_service.service import Timer
from timer_service.statistics import Statistics


def _outage(server: PostgresServer, seconds: float, mode: str = "immediate"
            ) -> threading.Thread:
    """Stop the server now (as a crash would, or `mode` "fast": a clean restart) and start
    it again after `seconds`: the length of the outage is the fault itself."""
    server.stop(mode)
    back = threading.Timer(seconds, server.start)
    back.start()
    return back


def test_a_producer_call_waiting_through_a_short_outage_succeeds(server):
    client = Client(ClientSettings(database_url=server.url()))
    try:
        client.schedule("warm")  # the pool is open and holds a connection
        back = _outage(server, 2.0)
        job = client.schedule("during", {"n": 1})  # waits, reconnects, succeeds
        back.join()
        assert client.get(job.id).payload == {"n": 1}
    finally:
        client.close()


@pytest.mark.parametrize("fault", ["restart", "terminate"])
def test_a_producer_whose_pool_held_many_connections_rides_a_restart_at_once(server, fault):
    """A fault walkthrough: after a restart (or an idle timeout, a proxy, an operator ending
    the sessions) every idle connection of a producer's pool is dead, and the pool dropped
    them one per try, sleeping 1, 2, 4 ... s between tries: seven of them took the whole
    30 s wait, and the call failed with the server long back. The first dead one found now
    has the pool test all of them; with a 5 s wait, eight dead ones fail the call without."""
    client = Client(ClientSettings(database_url=server.url(), pool_max_size=8),
                    pool_timeout=5.0)
    try:
        with contextlib.ExitStack() as held:
            for _ in range(8):
                held.enter_context(client.database.connection())
        assert client.database.pool.get_stats()["pool_available"] == 8
        if fault == "restart":
            _outage(server, 0.0, "fast").join()
        else:
            with psycopg.connect(server.url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'tock-client'")
        job = client.schedule("after", {"n": 1})
        assert client.get(job.id).payload == {"n": 1}
    finally:
        client.close()


def test_a_keyed_call_whose_key_read_meets_a_crash_waits_it_out(server, monkeypatch):
    # Postgres killed between the insert (every key already taken: nothing written) and
    # the read of the jobs holding the keys: that read is safe to repeat, so the call
    # rides the restart as any call does. It raised ConnectionLost, saying "the new
    # job(s) were written", of a call that wrote nothing.
    client = Client(ClientSettings(database_url=server.url()))
    try:
        held = client.schedule("email", key="k-1")
        real = Store._execute
        crashes: list[threading.Thread] = []

        def crash_first(conn: Any, query: Any, params: Any) -> Any:
            # On the connection the read has checked out, as the statement goes.
            if query is producer_sql.SELECT_JOBS_BY_KEY and not crashes:
                crashes.append(_outage(server, 2.0))
            return real(conn, query, params)

        monkeypatch.setattr(Store, "_execute", staticmethod(crash_first))
        again = client.schedule("email", key="k-1")
        crashes[0].join()
        assert (again.id, again.created) == (held.id, False)
    finally:
        client.close()


@pytest.fixture
def system(server, sqs_server) -> Iterator[dict[str, Any]]:
    prefix = f"r{uuid.uuid4().hex[:8]}-"
    SqsTransport(prefix).create_queue("default", visibility_timeout=10)
    registry = Registry()
    ran: list[int] = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix,
                                max_idle_seconds=0.2, maintenance_interval_seconds=0.5))
    consumer = Consumer(ConsumerSettings(
        database_url=server.url(), queue_prefix=prefix, lease_seconds=4, heartbeat_seconds=1,
        visibility_timeout_seconds=10, receive_wait_seconds=1), registry)
    client = Client(ClientSettings(database_url=server.url()))
    timer.start()
    consumer.start()
    yield {"timer": timer, "consumer": consumer, "client": client, "ran": ran}
    consumer.shutdown()
    timer.stop()
    client.close()


@pytest.mark.parametrize("outage", [0.0, 6.0], ids=["restart", "down 6 s"])
def test_timer_and_consumer_work_again_after_postgres_comes_back(server, system, outage):
    client, timer, consumer = system["client"], system["timer"], system["consumer"]
    before = client.schedule("work")
    wait_for(lambda: client.get(before.id).state is JobState.SUCCEEDED, timeout=30,
             message="a job before the outage")
    _outage(server, outage).join()
    after = client.schedule("work")
    wait_for(lambda: client.get(after.id).state is JobState.SUCCEEDED, timeout=30,
             message="a job after Postgres came back")
    assert timer.supervisor.live()[0], timer.supervisor.live()[1]
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]
    wait_for(lambda: timer.supervisor.ready()[0] and consumer.supervisor.ready()[0],
             timeout=30, message="both ready again")


def _a_running_job_outlives(server: PostgresServer, fault: Callable[[], None], *,
                            lease_seconds: float, heartbeat_seconds: float) -> None:
    """A job runs, its consumer is cut off (a proxy), `fault` befalls Postgres, and the
    timer's rescue passes go on for 1.5 s while the consumer is still cut off: the job must
    stay running, then finish in its first attempt once the consumer is back."""
    prefix = f"r{uuid.uuid4().hex[:8]}-"
    SqsTransport(prefix).create_queue("default", visibility_timeout=30)
    release = threading.Event()
    registry = Registry()
    registry.add("hold", lambda payload, ctx: release.wait(60))
    proxy = TcpProxy(server.port).start()
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix,
                                max_idle_seconds=0.2, maintenance_interval_seconds=0.5))
    consumer = Consumer(ConsumerSettings(
        database_url=server.url().replace(f":{server.port}/", f":{proxy.port}/"),
        queue_prefix=prefix, lease_seconds=lease_seconds, heartbeat_seconds=heartbeat_seconds,
        visibility_timeout_seconds=30, receive_wait_seconds=1), registry)
    client = Client(ClientSettings(database_url=server.url()))
    timer.start()
    consumer.start()
    try:
        job = client.schedule("hold", max_attempts=1)
        wait_for(lambda: client.get(job.id).state is JobState.RUNNING, timeout=30,
                 message="the job running")
        proxy.partition(new="refuse")
        fault()
        back = time.monotonic()
        # Rescue passes on the database clock while the consumer is still cut off.
        wait_for(lambda: (timer.rescuer.last_success_age(time.monotonic()) or 99)
                 < time.monotonic() - back - 1.5, timeout=30,
                 message="rescue passes after Postgres came back")
        assert client.get(job.id).state is JobState.RUNNING
        proxy.heal()
        release.set()
        wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
                 message="the job's own attempt succeeding")
        attempts = client.get(job.id, with_attempts=True).attempts
        assert [(a.attempt, a.outcome.value) for a in attempts] == [(1, "succeeded")]
    finally:
        release.set()
        proxy.heal()
        consumer.shutdown()
        timer.stop()
        client.close()
        proxy.close()


def test_a_job_running_through_an_outage_longer_than_its_lease_keeps_its_attempt(
        server, sqs_server):
    """Postgres down for longer than the consumer's lease (8 s), its handler running all
    along, and the consumer cut off for 2 s more (a proxy): by the database clock the
    lease ran out, but nobody could renew it. The timer's rescue passes in those 2 s leave
    the job alone (they used to fail the attempt at once, throwing the handler's result
    away); the consumer, back, renews, and the job finishes in its first attempt."""
    # A clean restart: a crash could also lose the claim's asynchronous commit, and then
    # the job runs again by design (consumer/completer.py, _claims_lost).
    _a_running_job_outlives(server, lambda: _outage(server, 10.0, "fast").join(),
                            lease_seconds=8, heartbeat_seconds=2)


def test_a_job_running_through_a_frozen_database_keeps_its_attempt(server, sqs_server):
    """Postgres frozen (every process stopped, as a hung host would be) for longer than the
    consumer's lease (4 s). No statement failed, so the timer saw no outage; its lease
    query, sent during the freeze, ran the moment it ended, found the lease run out by the
    database clock and failed the attempt, throwing the handler's result away. Answered
    that late, it now counts as an outage that just ended."""
    from tests.integration.test_hung_server import frozen

    def freeze() -> None:
        with frozen(server):
            stopped = time.monotonic()
            wait_for(lambda: time.monotonic() - stopped > 6, timeout=10,
                     message="a freeze longer than the lease")

    _a_running_job_outlives(server, freeze, lease_seconds=4, heartbeat_seconds=1)


def test_a_per_key_limit_holds_through_a_postgres_restart(server, system):
    """Keyed jobs dispatched one per key at a time while Postgres restarts under the
    timer's key walk: all run, and no two of one key ever overlap (the slots are counted
    from the rows again after the restart; nothing is remembered in the timer)."""
    client = system["client"]
    client.set_limit("kind_key", "work", max_running=1)
    jobs = client.schedule_many([{"kind": "work", "concurrency_key": key}
                                 for key in ["a"] * 4 + ["b"] * 4])
    _outage(server, 0.0).join()
    wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED for j in jobs),
             timeout=60, message="every keyed job after the restart")
    for key in ("a", "b"):
        spans = sorted((a.started_at, a.finished_at)
                       for j in jobs if j.concurrency_key == key
                       for a in client.get(j.id, with_attempts=True).attempts
                       if a.started_at is not None)
        assert all(later[0] >= earlier[1] for earlier, later in pairwise(spans)), spans


def test_the_due_watcher_serves_a_newcomer_again_after_a_restart_mid_backlog(server):
    """The due watcher holds a LISTEN connection of its own while a tenant is backlogged.
    Postgres restarts under it: every loop stays alive, the backlog is picked up again, and
    a newcomer's jobs go out while the backlog is still being dispatched."""
    from shared.transport.memory import MemoryTransport

    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                        SELECT 'work', now() - interval '1 hour', '{}', 'big'
                        FROM generate_series(1, 400000)""")
    # No consumer takes the messages: without dispatch_window=0 the window would stop the
    # backlog at its size, and nothing would be backlogged after the restart.
    timer = Timer(TimerSettings(database_url=server.url(), batch_size=20,
                                max_idle_seconds=0.2, maintenance_interval_seconds=0.5,
                                dispatch_window=0),
                  MemoryTransport())
    timer.start()
    try:
        wait_for(timer.dispatcher.backlogged, timeout=30,
                 message="tenant big backlogged")
        _outage(server, 0.0).join()
        wait_for(timer.dispatcher.backlogged, timeout=30,
                 message="the backlog picked up again after the restart")
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                            SELECT 'work', now(), '{}', 'new' FROM generate_series(1, 10)""")

            def counts() -> tuple[int, int]:
                row = conn.execute("""
                    SELECT count(*) FILTER (WHERE tenant = 'new' AND state = 'dispatched'),
                           count(*) FILTER (WHERE tenant = 'big' AND state = 'scheduled')
                    FROM tock_jobs""").fetchone()
                assert row is not None
                return int(row[0]), int(row[1])

            wait_for(lambda: counts()[0] == 10, timeout=30, message="the newcomer dispatched")
            assert counts()[1] > 0, "the backlog was still there when the newcomer went out"
        assert timer.supervisor.live()[0], timer.supervisor.live()[1]
    finally:
        timer.stop()


def test_a_consumer_started_while_postgres_is_down_runs_jobs_once_it_is_back(server,
                                                                             sqs_server):
    """The database can go away between a consumer's start-up probe and its first
    announcement: it starts its loops anyway, is not ready until a heartbeat gets through,
    and then runs jobs, instead of dying with a traceback."""
    prefix = f"r{uuid.uuid4().hex[:8]}-"
    SqsTransport(prefix).create_queue("default", visibility_timeout=10)
    registry = Registry()
    registry.add("work", lambda payload, ctx: None)
    consumer = Consumer(ConsumerSettings(
        database_url=server.url(), queue_prefix=prefix, lease_seconds=4, heartbeat_seconds=1,
        visibility_timeout_seconds=10, receive_wait_seconds=1), registry)
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix,
                                max_idle_seconds=0.2))
    client = Client(ClientSettings(database_url=server.url()))
    server.stop("immediate")
    try:
        consumer.start()  # announces nothing: Postgres is down
        ready, why = consumer.supervisor.ready()
        assert not ready and "heartbeat" in why
        assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]
        server.start()
        timer.start()
        job = client.schedule("work")
        wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
                 message="a job run by the consumer that started during the outage")
        wait_for(lambda: consumer.supervisor.ready()[0], timeout=30, message="ready")
    finally:
        consumer.shutdown()
        timer.stop()
        client.close()


def test_the_statistics_loop_waits_out_an_outage_and_vacuums_after_it(server):
    """Postgres down under the timer's statistics loop: a pass fails with a retryable
    error (the supervisor waits it out), never another one; once the server is back the
    next pass vacuums the dead rows of tock_jobs."""
    def churn() -> None:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("""INSERT INTO tock_jobs (kind, run_at, payload)
                            SELECT 'k', now(), '{}' FROM generate_series(1, 6000)""")
            conn.execute("DELETE FROM tock_jobs")
            conn.execute("SELECT pg_stat_force_next_flush()")

    def vacuums() -> int:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            row = conn.execute("SELECT vacuum_count FROM pg_stat_user_tables "
                               "WHERE relid = 'tock_jobs'::regclass").fetchone()
        assert row is not None
        return int(row[0])

    database = Database.for_service(server.url(), name="tock-timer", max_size=2)
    loop = Statistics(StatisticsStore(database), vacuum_dead_rows=5_000)
    try:
        server.stop("immediate")
        with pytest.raises(Retryable):
            loop.run_once()
        server.start()
        churn()  # the crash reset the statistics: dead rows made after it
        wait_for(lambda: _passes(loop), timeout=30, message="a pass once Postgres is back")
        assert vacuums() == 1
    finally:
        database.close()


def _passes(loop: Statistics) -> bool:
    try:
        loop.run_once()
    except Retryable:
        return False  # the pool still reconnecting
    return True


def test_a_lingering_handlers_slot_holds_through_a_postgres_restart(server, sqs_server):
    """A cancelled job's handler runs on, ignoring ctx.cancelled, and holds its kind's one
    slot; Postgres restarts under the consumer's heartbeat (which writes and forgets the
    lingering rows) and the timer's rescuer (which frees dead workers' rows). After it, the
    heartbeat is healthy again, the slot is still held while the handler runs, and it comes
    back once the handler returns."""
    prefix = f"r{uuid.uuid4().hex[:8]}-"
    SqsTransport(prefix).create_queue("default", visibility_timeout=10)
    started, release = threading.Event(), threading.Event()
    registry = Registry()

    def ignores_cancel(payload: Any, ctx: Any) -> None:
        if (payload or {}).get("hold"):
            started.set()
            release.wait(60)

    registry.add("one", ignores_cancel)
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix,
                                max_idle_seconds=0.2, maintenance_interval_seconds=0.5))
    consumer = Consumer(ConsumerSettings(
        database_url=server.url(), queue_prefix=prefix, lease_seconds=4, heartbeat_seconds=1,
        visibility_timeout_seconds=10, receive_wait_seconds=1, concurrency=2), registry)
    client = Client(ClientSettings(database_url=server.url()))

    def lingering() -> int:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            return int(conn.execute("SELECT count(*) FROM tock_lingering").fetchone()[0])

    def beat_since_restart() -> bool:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            return bool(conn.execute(
                "SELECT count(*) FROM tock_workers "
                "WHERE last_heartbeat > pg_postmaster_start_time() + interval '1 second'"
            ).fetchone()[0])

    timer.start()
    consumer.start()
    try:
        client.set_limit("kind", "one", max_running=1)
        held = client.schedule("one", {"hold": True})
        assert started.wait(30)
        client.cancel(held.id)
        waiting = client.schedule("one")
        _outage(server, 0.0, "immediate").join()
        wait_for(lambda: _ok(beat_since_restart) and consumer.supervisor.ready()[0],
                 timeout=30, message="heartbeats landing again after the restart")
        assert _ok(lingering) == 1, "the beats kept the cancelled handler's row"
        assert client.get(waiting.id).state is JobState.SCHEDULED, "its slot still held"
        assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]
        release.set()
        wait_for(lambda: client.get(waiting.id).state is JobState.SUCCEEDED, timeout=30,
                 message="the slot back once the handler returned")
        assert _ok(lingering) == 0
    finally:
        release.set()
        consumer.shutdown()
        timer.stop()
        client.close()


def _ok(read: Any) -> Any:
    """`read()`, or None while the database is still coming back."""
    try:
        return read()
    except (psycopg.Error, Retryable):
        return None
