"""SQS fair queues: the timer sends each job's tenant as its message's MessageGroupId, by
which SQS (on AWS, standard queues) hands a quiet tenant's messages out ahead of another
tenant's backlog. The real timer, built from its settings, against the session's SQS
server, read back with boto3; whether the server reorders by group is SQS's part and is
not measurable on LocalStack (it carries the group, in send order)."""

from __future__ import annotations

import json
import re

import boto3
import pytest

from shared.transport.base import Outgoing
from shared.transport.sqs import NO_TENANT_GROUP, SqsTransport, message_group_id
from tests.support.drive import dispatch, make_consumer, receive, run_all
from timer_service.service import Timer

ODD_TENANT = "Café Ünïcode & spaces"
"""A tenant tock takes but SQS would not as a MessageGroupId (spaces, non-ASCII)."""


def _groups(transport: SqsTransport, expect: int) -> dict[int, str | None]:
    """job id -> the MessageGroupId its message carries, for `expect` messages."""
    sqs = boto3.client("sqs")
    url = transport.url("default")
    seen: dict[int, str | None] = {}
    for _ in range(20):
        if len(seen) >= expect:
            break
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  VisibilityTimeout=0,
                                  MessageSystemAttributeNames=["MessageGroupId"])
        for m in got.get("Messages", []):
            seen[json.loads(m["Body"])["job"]] = m.get("Attributes", {}).get("MessageGroupId")
    assert len(seen) == expect, seen
    return seen


def test_each_message_carries_its_tenant_as_its_group(client, timer_settings, transport,
                                                      consumer_settings, registry, clock):
    registry.add("work", lambda payload, ctx: None)
    acme = client.schedule("work", tenant="acme")
    odd = client.schedule("work", tenant=ODD_TENANT)
    none = client.schedule("work")
    timer = Timer(timer_settings)  # its transport from the settings, as in production
    try:
        assert dispatch(timer) == 3
    finally:
        timer.close()
    groups = _groups(transport, 3)
    assert groups[acme.id] == "acme"
    assert groups[none.id] == NO_TENANT_GROUP
    assert groups[odd.id] == message_group_id(ODD_TENANT)
    # And the messages run as any other.
    consumer = make_consumer(consumer_settings, registry, transport, clock)
    try:
        run_all(consumer, receive(consumer, 3))
    finally:
        consumer.shutdown()
    assert {client.get(j.id).state.value for j in (acme, odd, none)} == {"succeeded"}


def test_turned_off_the_messages_carry_no_group(client, timer_settings, transport):
    job = client.schedule("work", tenant="acme")
    timer = Timer(timer_settings.model_copy(update={"sqs_fair_queues": False}))
    try:
        assert dispatch(timer) == 1
    finally:
        timer.close()
    assert _groups(transport, 1) == {job.id: None}


@pytest.mark.parametrize("tenant", ["", "acme", "a" * 128, "a" * 129, "with space", "ü",
                                    ODD_TENANT])
def test_every_tenant_maps_to_a_valid_stable_group(tenant):
    group = message_group_id(tenant)
    assert re.fullmatch(r"[!-~]{1,128}", group)
    assert group == message_group_id(tenant)
    if re.fullmatch(r"[!-~]{1,128}", tenant):
        assert group == tenant  # readable in the console when it can be


def test_the_transport_sends_groups_only_when_asked(queue_prefix):
    plain = SqsTransport(queue_prefix)
    plain.create_queue("default", visibility_timeout=60)
    grouped = SqsTransport(queue_prefix, message_groups=True)
    assert plain.send_batch("default", [Outgoing("1", json.dumps({"job": 1}), "t")]) == []
    assert grouped.send_batch("default", [Outgoing("2", json.dumps({"job": 2}), "t"),
                                          Outgoing("3", json.dumps({"job": 3}))]) == []
    assert _groups(plain, 3) == {1: None, 2: "t", 3: None}
