"""Amazon SQS through boto3, behind the `Transport` interface. botocore errors are
translated here, once, into `TransportError`; per-entry failures of batch calls are
returned per entry.

The endpoint, region and credentials come from the standard AWS configuration
(`AWS_ENDPOINT_URL_SQS`, `AWS_DEFAULT_REGION`, roles ...), so this runs unchanged against
LocalStack, moto and real SQS.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from shared.core.errors import TransportError
from shared.transport.base import (
    MAX_BATCH,
    MAX_VISIBILITY_SECONDS,
    MAX_WAIT_SECONDS,
    EntryFailure,
    Received,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

class SqsTransport:
    """SQS queues named `prefix + tock queue name`; queue URLs are resolved once and cached."""

    def __init__(self, prefix: str = "tock-", *, call_timeout_seconds: float = 10.0,
                 max_connections: int = 50, client: SQSClient | None = None) -> None:
        self.prefix = prefix
        # Long polls hold a connection for up to 20 s: the read timeout must exceed that.
        config = Config(
            connect_timeout=call_timeout_seconds,
            read_timeout=call_timeout_seconds + MAX_WAIT_SECONDS,
            retries={"mode": "standard", "max_attempts": 3},
            max_pool_connections=max_connections,
        )
        self.client: SQSClient = client or boto3.client("sqs", config=config)
        self._urls: dict[str, str] = {}
        self._lock = threading.Lock()

    def queue_name(self, queue: str) -> str:
        return f"{self.prefix}{queue}"

    def url(self, queue: str) -> str:
        with self._lock:
            cached = self._urls.get(queue)
        if cached:
            return cached
        try:
            found = self.client.get_queue_url(QueueName=self.queue_name(queue))["QueueUrl"]
        except ClientError as exc:
            raise TransportError(
                f"SQS queue {self.queue_name(queue)!r} for tock queue {queue!r} not found or not "
                f"accessible: {_describe(exc)}"
            ) from exc
        except BotoCoreError as exc:
            raise TransportError(f"SQS unreachable: {exc}") from exc
        with self._lock:
            self._urls[queue] = found
        return found

    def create_queue(self, queue: str, *, visibility_timeout: int = 60,
                     dead_letter_after: int | None = None) -> str:
        """Create the queue (idempotent); for local stacks and tests. Production queues come
        from infra/ templates."""
        attributes: dict[str, str] = {"VisibilityTimeout": str(visibility_timeout)}
        try:
            if dead_letter_after:
                dlq = self.client.create_queue(QueueName=self.queue_name(queue) + "-dlq")
                arn = self.client.get_queue_attributes(
                    QueueUrl=dlq["QueueUrl"], AttributeNames=["QueueArn"]
                )["Attributes"]["QueueArn"]
                attributes["RedrivePolicy"] = (
                    f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{dead_letter_after}"}}'
                )
            url = self.client.create_queue(QueueName=self.queue_name(queue),
                                           Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
        except (ClientError, BotoCoreError) as exc:
            raise TransportError(f"cannot create SQS queue {queue!r}: {exc}") from exc
        with self._lock:
            self._urls[queue] = url
        return url

    def send_batch(self, queue: str, entries: list[tuple[str, str]]) -> list[EntryFailure]:
        if not entries:
            return []
        resp = self._call(
            "SendMessageBatch", self.client.send_message_batch, QueueUrl=self.url(queue),
            Entries=[{"Id": i, "MessageBody": body} for i, body in entries],
        )
        return _failures(resp)

    def receive(self, queue: str, max_messages: int = MAX_BATCH, wait_seconds: int = 20,
                visibility_timeout: int = 60) -> list[Received]:
        resp = self._call(
            "ReceiveMessage", self.client.receive_message, QueueUrl=self.url(queue),
            MaxNumberOfMessages=min(max_messages, MAX_BATCH),
            WaitTimeSeconds=min(wait_seconds, MAX_WAIT_SECONDS),
            VisibilityTimeout=visibility_timeout,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        return [
            Received(
                message_id=m["MessageId"], receipt=m["ReceiptHandle"], body=m.get("Body", ""),
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
            )
            for m in resp.get("Messages", [])
        ]

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        if not receipts:
            return []
        resp = self._call(
            "DeleteMessageBatch", self.client.delete_message_batch, QueueUrl=self.url(queue),
            Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)],
        )
        return _failures(resp)

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                timeout_seconds: int) -> list[EntryFailure]:
        if not receipts:
            return []
        resp = self._call(
            "ChangeMessageVisibilityBatch", self.client.change_message_visibility_batch,
            QueueUrl=self.url(queue),
            Entries=[{"Id": str(i), "ReceiptHandle": r,
                      "VisibilityTimeout": min(timeout_seconds, MAX_VISIBILITY_SECONDS)}
                     for i, r in enumerate(receipts)],
        )
        return _failures(resp)

    def _call(self, name: str, method: Any, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except ClientError as exc:
            raise TransportError(f"SQS {name} failed: {_describe(exc)}") from exc
        except BotoCoreError as exc:
            raise TransportError(f"SQS {name} failed: {exc}") from exc


def _describe(exc: ClientError) -> str:
    err = exc.response.get("Error", {})
    return f"{err.get('Code', '?')}: {err.get('Message', str(exc))}"


def _failures(resp: Any) -> list[EntryFailure]:
    return [
        EntryFailure(f["Id"], f.get("Code", "?"), f.get("Message", ""))
        for f in resp.get("Failed", [])
    ]
