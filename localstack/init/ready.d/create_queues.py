"""LocalStack init hook (ready stage): create tock's SQS queues, each with a dead-letter
queue and the same attributes as infra/cloudformation/queues.yaml.

LocalStack runs this inside its own Python interpreter once SQS is ready (mounted at
/etc/localstack/init/ready.d by localstack/compose.yaml). It can also be run by hand
against any endpoint: `AWS_ENDPOINT_URL=http://127.0.0.1:4566 python create_queues.py`.
It raises on failure (LocalStack then reports the script as ERROR) and is idempotent.

Environment: TOCK_QUEUE_PREFIX ("tock-"), TOCK_QUEUES (comma-separated or a JSON list,
"default"), TOCK_VISIBILITY_TIMEOUT_SECONDS (60), TOCK_DLQ_MAX_RECEIVE_COUNT (10).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import boto3

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,61}$")


def queue_names(raw: str) -> list[str]:
    """Parse TOCK_QUEUES the way tock accepts it (JSON list) or as a comma list."""
    text = raw.strip()
    names = json.loads(text) if text.startswith("[") else text.split(",")
    names = [str(n).strip() for n in names if str(n).strip()]
    bad = [n for n in names if not QUEUE_NAME.match(n)]
    if not names or bad:
        raise ValueError(f"TOCK_QUEUES must name queues matching {QUEUE_NAME.pattern}: {raw!r}")
    return names


def create_queues(sqs: Any, prefix: str, queues: list[str], visibility_timeout: int,
                  max_receive_count: int) -> dict[str, str]:
    """Create each queue and its `-dlq`; returns {SQS queue name: URL}."""
    created: dict[str, str] = {}
    for queue in queues:
        name = f"{prefix}{queue}"
        dlq_url = sqs.create_queue(
            QueueName=f"{name}-dlq",
            Attributes={"MessageRetentionPeriod": "1209600", "SqsManagedSseEnabled": "true"},
        )["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(
            QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        url = sqs.create_queue(
            QueueName=name,
            Attributes={
                "VisibilityTimeout": str(visibility_timeout),
                "MessageRetentionPeriod": "345600",
                "ReceiveMessageWaitTimeSeconds": "20",
                "SqsManagedSseEnabled": "true",
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                             "maxReceiveCount": str(max_receive_count)}),
            },
        )["QueueUrl"]
        created[name] = url
        created[f"{name}-dlq"] = dlq_url
    return created


def main() -> None:
    env = os.environ
    client = boto3.client(
        "sqs",
        endpoint_url=env.get("AWS_ENDPOINT_URL", "http://localhost:4566"),
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", "test"),
    )
    created = create_queues(
        client,
        prefix=env.get("TOCK_QUEUE_PREFIX", "tock-"),
        queues=queue_names(env.get("TOCK_QUEUES", "default")),
        visibility_timeout=int(env.get("TOCK_VISIBILITY_TIMEOUT_SECONDS", "60")),
        max_receive_count=int(env.get("TOCK_DLQ_MAX_RECEIVE_COUNT", "10")),
    )
    for name, url in created.items():
        print(f"tock: queue {name} ready at {url}")


# No __main__ guard: LocalStack runs init scripts with exec(source, {}), where __name__
# is not set.
main()
