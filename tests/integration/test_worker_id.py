"""One worker id, one live process. A worker's jobs are known by its id alone, so two
consumers sharing a fixed TOCK_WORKER_ID would each take the other's jobs for ones it
lost (found by a walkthrough: every result of a long job discarded, the jobs dead). Here:
a crashed predecessor's id is taken once its lease runs out; a container restarted in
place takes its id back at once; a consumer that started while Postgres was away takes its
id at its first heartbeat, and claims nothing before. Real consumers, real Postgres and
LocalStack. The second live process refused: tests/e2e/test_worker_id_processes.py (it
needs another pid)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.client import Client
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.transport.sqs import SqsTransport
from tests.support.wait import wait_for
from timer_service.service import Timer


def _holder(db, worker: str) -> tuple[str, int]:
    row = db.execute("SELECT host, pid FROM tock_workers WHERE id = %s", (worker,)).fetchone()
    return row[0], row[1]


def _predecessor(db, worker: str, *, host: str, pid: int, lease_seconds: float) -> None:
    """A worker row as a process that was killed leaves it: its lease still running."""
    db.execute("""
        INSERT INTO tock_workers (id, host, pid, queues, concurrency, last_heartbeat,
                                  lease_expires_at)
        VALUES (%s, %s, %s, '{default}', 8, now(), now() + make_interval(secs => %s))
    """, (worker, host, pid, lease_seconds))


def test_the_id_of_a_consumer_that_died_is_taken_once_its_lease_runs_out(
        db, running, caplog):
    _predecessor(db, "fixed-id", host="another-host", pid=4242, lease_seconds=1.5)
    with caplog.at_level(logging.WARNING, logger="tock.consumer"):
        running(worker_id="fixed-id", lease_seconds=3, heartbeat_seconds=0.2)
    assert any(r.message == "worker_id_held" for r in caplog.records), \
        "it waited for the dead one's lease"
    assert _holder(db, "fixed-id") == (socket.gethostname(), os.getpid())


def test_a_container_restarted_in_place_takes_its_id_back_at_once(db, running, caplog):
    # The same host name and pid (a container's pid 1): the process before it, gone.
    _predecessor(db, "pod-id", host=socket.gethostname(), pid=os.getpid(), lease_seconds=600)
    with caplog.at_level(logging.WARNING, logger="tock.consumer"):
        running(worker_id="pod-id", lease_seconds=3, heartbeat_seconds=0.2)
    assert not any(r.message == "worker_id_held" for r in caplog.records)


def test_a_stop_while_waiting_for_the_id_exits_0_and_leaves_the_holders_row(
        db, consumer_settings, registry, transport, caplog):
    _predecessor(db, "waited-id", host="another-host", pid=4242, lease_seconds=600)
    consumer = Consumer(consumer_settings.model_copy(update={"worker_id": "waited-id"}),
                        registry, transport)
    code: list[int] = []
    with caplog.at_level(logging.WARNING, logger="tock.consumer"):
        runner = threading.Thread(target=lambda: code.append(consumer.run_forever()))
        runner.start()
        wait_for(lambda: any(r.message == "worker_id_held" for r in caplog.records),
                 timeout=30, message="waiting for the id")
        consumer.stop_flag.set()  # as SIGTERM does
        runner.join(30)
    assert code == [0]
    row = db.execute("SELECT host, pid, stopped_at FROM tock_workers WHERE id = 'waited-id'"
                     ).fetchone()
    assert row == ("another-host", 4242, None), "not announced, not marked stopped"


# --- Postgres away at start: the heartbeat loop takes the id, and nothing is claimed before --

@pytest.fixture
def started_during_outage(server, sqs_server, caplog
                          ) -> Iterator[Callable[[float], dict[str, Any]]]:
    """Start, while its own Postgres is down (its id then untaken), a consumer with the
    fixed id "fixed-id", which another host held with a lease of `holder_lease` seconds
    just before the outage; then bring Postgres back and start a timer and a client."""
    prefix = f"w{uuid.uuid4().hex[:8]}-"
    SqsTransport(prefix).create_queue("default", visibility_timeout=10)
    registry = Registry()
    ran: list[int] = []
    registry.add("work", lambda payload, ctx: ran.append(ctx.job_id))
    consumer = Consumer(ConsumerSettings(
        database_url=server.url(), queue_prefix=prefix, worker_id="fixed-id", lease_seconds=3,
        heartbeat_seconds=0.3, visibility_timeout_seconds=10, receive_wait_seconds=1), registry)
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix,
                                max_idle_seconds=0.2))
    client = Client(ClientSettings(database_url=server.url()))
    caplog.set_level(logging.INFO, logger="tock")

    def start(holder_lease: float) -> dict[str, Any]:
        with psycopg.connect(server.url(), autocommit=True) as db:
            _predecessor(db, "fixed-id", host="another-host", pid=4242,
                         lease_seconds=holder_lease)
        server.stop("immediate")  # durable: the holder's row survives
        consumer.start()
        assert any(r.message == "announce_failed" for r in caplog.records)
        server.start()
        timer.start()
        return {"consumer": consumer, "client": client, "ran": ran}

    try:
        yield start
    finally:
        consumer.shutdown()
        timer.stop()
        client.close()


def test_an_id_a_live_process_holds_is_refused_when_postgres_was_away_at_start(
        server, started_during_outage, caplog):
    system = started_during_outage(600)
    consumer, client = system["consumer"], system["client"]
    job = client.schedule("work")
    wait_for(lambda: any(r.message == "worker_id_held" for r in caplog.records),
             timeout=30, message="the heartbeat loop found the id held")
    ready, why = consumer.supervisor.ready()
    assert not ready and "heartbeat" in why, why  # nothing claimed, and it says so
    with psycopg.connect(server.url(), autocommit=True) as db:
        db.execute("UPDATE tock_workers SET last_heartbeat = now() + interval '1 second' "
                   "WHERE id = 'fixed-id'")  # the holder beats: it is alive
        wait_for(lambda: consumer.supervisor.fatal is not None, timeout=30,
                 message="the consumer stops")
        assert consumer.supervisor.exit_code == 2, consumer.supervisor.fatal
        assert not consumer.supervisor.live()[0], "the liveness probe goes red"
        assert "TOCK_WORKER_ID 'fixed-id' is in use" in consumer.supervisor.fatal
        assert system["ran"] == []
        assert client.get(job.id).attempt == 0, "claimed under an id another process holds"
        assert _holder(db, "fixed-id") == ("another-host", 4242)


def test_the_id_of_a_dead_holder_is_taken_by_the_heartbeat_when_postgres_was_away_at_start(
        server, started_during_outage):
    system = started_during_outage(3)  # it beats no more: its lease runs out
    client = system["client"]
    job = client.schedule("work")
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the job, run once the dead holder's lease ran out")
    with psycopg.connect(server.url(), autocommit=True) as db:
        assert _holder(db, "fixed-id") == (socket.gethostname(), os.getpid())
    assert system["ran"] == [job.id]
