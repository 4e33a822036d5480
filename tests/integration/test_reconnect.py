"""After Postgres goes away and comes back, every part works again at once: a producer
call waiting through a short outage succeeds instead of timing out, and the timer and a
consumer dispatch and run jobs again, with no process restarted. Each test has its own
throwaway Postgres server (the session's is shared by other tests), restarted for real."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.postgres import PostgresServer, start_postgres
from shared.client import Client
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.store.migrate import migrate
from shared.transport.sqs import SqsTransport
from tests.support.wait import wait_for
from timer_service.service import Timer


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    pg = start_postgres(durable=True)  # an immediate stop must not lose the migrations
    migrate(pg.url())
    yield pg
    pg.destroy()


def _outage(server: PostgresServer, seconds: float) -> threading.Thread:
    """Stop the server now (as a crash would) and start it again after `seconds`: the
    length of the outage is the fault itself."""
    server.stop("immediate")
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
