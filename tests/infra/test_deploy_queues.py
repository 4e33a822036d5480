"""Deploy infra/cloudformation/queues.yaml (the SQS part of tock.yaml, nested there) into
moto's CloudFormation, read the queues back, and run a job through the deployed queue with
a real Timer and Consumer against a real Postgres."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.sqs import SqsServer, start_moto
from shared.client import Client
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings, ConsumerSettings, TimerSettings
from shared.transport.sqs import SqsTransport
from tests.infra.paths import QUEUES_TEMPLATE
from tests.support.wait import wait_for
from timer_service.service import Timer

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    server = start_moto()
    yield server
    server.stop()


def _aws(moto: SqsServer, service: str) -> Any:
    # Explicit credentials and endpoint: this must not depend on (or leak into) the
    # LocalStack environment other tests set up.
    return boto3.client(service, endpoint_url=moto.endpoint, region_name=REGION,
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture(scope="module")
def stack(moto: SqsServer) -> dict[str, str]:
    """The deployed stack's outputs, plus the prefix it was deployed with."""
    prefix = f"d{uuid.uuid4().hex[:6]}-"
    cfn = _aws(moto, "cloudformation")
    cfn.create_stack(
        StackName=f"tock-queues-{prefix.rstrip('-')}",
        TemplateBody=QUEUES_TEMPLATE.read_text(),
        Parameters=[
            {"ParameterKey": "QueuePrefix", "ParameterValue": prefix},
            {"ParameterKey": "MaxReceiveCount", "ParameterValue": "2"},
        ],
    )
    described = cfn.describe_stacks(StackName=f"tock-queues-{prefix.rstrip('-')}")["Stacks"][0]
    assert described["StackStatus"] == "CREATE_COMPLETE", described
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]}
    return {**outputs, "prefix": prefix}


def _attributes(moto: SqsServer, name: str) -> dict[str, str]:
    sqs = _aws(moto, "sqs")
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attrs: dict[str, str] = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return attrs


def test_stack_creates_encrypted_queue_with_redrive_to_its_dlq(moto, stack):
    prefix = stack["prefix"]
    assert stack["QueueName"] == f"{prefix}default"
    assert stack["DeadLetterQueueName"] == f"{prefix}default-dlq"
    queue = _attributes(moto, stack["QueueName"])
    dlq = _attributes(moto, stack["DeadLetterQueueName"])
    assert queue["QueueArn"] == stack["QueueArn"]
    assert dlq["QueueArn"] == stack["DeadLetterQueueArn"]
    # Visibility matches the consumer defaults: >= TOCK_LEASE_SECONDS (30).
    assert queue["VisibilityTimeout"] == "60"
    assert queue["ReceiveMessageWaitTimeSeconds"] == "20"
    assert queue["SqsManagedSseEnabled"] == "true"
    assert dlq["SqsManagedSseEnabled"] == "true"
    assert dlq["MessageRetentionPeriod"] == "1209600"
    redrive = json.loads(queue["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == stack["DeadLetterQueueArn"]
    assert int(redrive["maxReceiveCount"]) == 2
    assert "RedrivePolicy" not in dlq


def test_message_received_too_often_moves_to_the_dlq(moto, stack):
    sqs = _aws(moto, "sqs")
    queue_url = sqs.get_queue_url(QueueName=stack["QueueName"])["QueueUrl"]
    dlq_url = sqs.get_queue_url(QueueName=stack["DeadLetterQueueName"])["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody="poison")
    # Received and never deleted (a consumer crashing on it), maxReceiveCount=2 times.
    for _ in range(2):
        got = sqs.receive_message(QueueUrl=queue_url, VisibilityTimeout=0, WaitTimeSeconds=1)
        assert [m["Body"] for m in got.get("Messages", [])] == ["poison"]
    assert sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0).get("Messages") is None

    def dead() -> list[str]:
        got = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1)
        return [m["Body"] for m in got.get("Messages", [])]

    assert wait_for(dead, timeout=10, message="poison message in the DLQ") == ["poison"]


def test_timer_and_consumer_run_a_job_through_the_deployed_queue(moto, stack, database_url):
    prefix = stack["prefix"]
    transport = SqsTransport(prefix, client=_aws(moto, "sqs"))
    # The transport finds the stack's queue by name, exactly as in production.
    assert transport.url("default").endswith(f"/{prefix}default")
    seen: list[Any] = []
    registry = Registry()
    registry.add("deployed", lambda payload, ctx: seen.append(payload))

    with Client(ClientSettings(database_url=database_url)) as client:
        job = client.schedule("deployed", {"via": "cloudformation"})
        timer = Timer(TimerSettings(database_url=database_url, queue_prefix=prefix), transport)
        try:
            assert timer.run_once().dispatched == 1
        finally:
            timer.close()
        consumer = Consumer(
            ConsumerSettings(database_url=database_url, queue_prefix=prefix,
                             queues=["default"], concurrency=2, receive_wait_seconds=1,
                             shutdown_grace_seconds=5),
            registry, transport)
        consumer.start()
        try:
            wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
                     message="job succeeded")
        finally:
            consumer.shutdown()
    assert seen == [{"via": "cloudformation"}]

    def drained() -> bool:
        attrs = _attributes(moto, stack["QueueName"])
        counts = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible")
        return all(attrs[c] == "0" for c in counts)

    # Deleted after the outcome committed: nothing left visible or in flight.
    wait_for(drained, timeout=10, message="queue drained")
