"""A consumer that receives from several queues serves each of them: one queue found
empty must not keep the other from being received. Real consumer (its receivers on their
threads), real Postgres and SQS."""

from __future__ import annotations

from shared.core.states import JobState
from tests.support.drive import dispatch
from tests.support.wait import wait_for


def test_an_idle_queue_does_not_keep_the_other_from_being_received(
        client, timer, registry, running, transport):
    """Each receiver reserved a whole batch of slots (all 8) for its 2 s long poll, gave
    them back empty-handed and took them again at once, before the other queue's
    receivers, woken by the release, could: jobs on the second queue waited 5 minutes in a
    fault walkthrough, while readiness said that queue had been received 0.2 s ago."""
    transport.create_queue("second", visibility_timeout=60)
    try:
        registry.add("tick", lambda payload, ctx: None)
        consumer = running(queues=["default", "second"], concurrency=8)
        # Both queues' receivers at work, their queues empty.
        wait_for(lambda: consumer.supervisor.ready()[0], timeout=30, message="ready")
        jobs = [client.schedule("tick", queue=q) for q in ("second", "default", "second")]
        dispatch(timer)
        for job in jobs:
            wait_for(lambda j=job: client.get(j.id).state is JobState.SUCCEEDED, timeout=15,
                     message=f"job {job.id} on {job.queue} run")
    finally:
        transport.client.delete_queue(QueueUrl=transport.url("second"))


def test_a_queue_kept_from_receiving_goes_not_ready_and_back(running, registry):
    """A pass that got no slot because other receivers held them all is no receive: the
    probe used to count it as one, and said a queue never polled had just been received."""
    registry.add("tick", lambda payload, ctx: None)
    consumer = running(concurrency=1, receive_wait_seconds=1, sqs_call_timeout_seconds=1)
    wait_for(lambda: consumer.supervisor.ready()[0], timeout=30, message="ready")
    # Another receiver holds the only slot (as one long-polling an empty queue did).
    held = wait_for(lambda: consumer.pipe.slots.reserve(1, timeout=0.5), timeout=30,
                    message="the slot held")
    try:
        wait_for(lambda: not consumer.supervisor.ready()[0], timeout=30,
                 message="not ready")
        why = consumer.supervisor.ready()[1]
        assert "claim-default" in why, why
    finally:
        consumer.pipe.slots.settle(held, 0)
    wait_for(lambda: consumer.supervisor.ready()[0], timeout=30, message="ready again")
