"""A consumer that lost Postgres stops receiving until it answers again: every receive
counts towards the queue's maxReceiveCount, and receiving through an outage would walk
the messages into the dead-letter queue in seconds (their jobs would then wait for the
timer's lost-message check). Against a real Postgres server stopped for real and the real
SQS server; the outage's length is the fault itself."""

from __future__ import annotations

import threading
import uuid

import psycopg

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.client import Client
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.transport.sqs import SqsTransport
from tests.support.wait import wait_for
from timer_service.service import Timer

JOBS = 20
DEAD_LETTER_AFTER = 2
"""Without the check, each failed claim (a 2 s wait for a connection) costs a receive: an
outage of a few of them takes the messages past this."""
OUTAGE_SECONDS = 10.0



def test_no_message_reaches_the_dead_letter_queue_through_an_outage(server, sqs_server):
    prefix = f"o{uuid.uuid4().hex[:8]}-"
    transport = SqsTransport(prefix)
    transport.create_queue("default", visibility_timeout=30,
                           dead_letter_after=DEAD_LETTER_AFTER)
    client = Client(ClientSettings(database_url=server.url()))
    ids = [client.schedule("work").id for _ in range(JOBS)]
    timer = Timer(TimerSettings(database_url=server.url(), queue_prefix=prefix))
    try:
        while timer.run_once().dispatched:
            pass
    finally:
        timer.close()
    assert transport.depth("default") == JOBS
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # the timer commits asynchronously: make it durable

    registry = Registry()
    registry.add("work", lambda payload, ctx: None)
    server.stop("immediate")  # the messages wait in SQS; the database is gone
    back = threading.Timer(OUTAGE_SECONDS, server.restart)
    consumer = Consumer(ConsumerSettings(
        database_url=server.url(), queue_prefix=prefix, receive_wait_seconds=1,
        visibility_timeout_seconds=30, dead_letter_after=DEAD_LETTER_AFTER), registry)
    try:
        back.start()
        consumer.start()
        wait_for(lambda: all(client.get(i).state is JobState.SUCCEEDED for i in ids),
                 timeout=90, interval=0.5, message="every job succeeded after the outage")
    finally:
        back.join()
        consumer.shutdown()
        client.close()
    assert transport.depth("default-dlq") == 0
