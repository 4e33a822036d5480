"""Amazon SQS through boto3, behind the `Transport` interface. botocore errors are
translated here, once, into `TransportError` (`QueueMissing` when the queue does not
exist); per-entry failures of batch calls are returned per entry.

The endpoint, region and credentials come from the standard AWS configuration
(`AWS_ENDPOINT_URL_SQS`, `AWS_DEFAULT_REGION`, roles ...), so this runs unchanged against
LocalStack, moto and real SQS. A configuration that cannot work (no region, an endpoint
that is not an http(s) URL) is a `ConfigError` naming the variable when the transport is
made, before any call.

Queue URLs are cached. A call that finds its queue gone (deleted, or a LocalStack restart)
drops the cached URL, so the next call resolves it again; with `create_missing` the queue
(and its dead-letter queue) is created at once and the call retried, which is what
`TOCK_CREATE_QUEUES=1` turns on for local stacks. Production queues come from infra/.
Both are logged: `queue_recreated` (WARNING: the messages it held are gone) when a
queue this process had used is created again, else `queue_missing` (ERROR), at most once
per 30 s per queue, since every loop meets the error again on every pass.

SQS quotes the whole receipt handle (hundreds of characters) before the reason in its
error messages; error texts built here cut handles short (`shorten_handles`), so a log
line cut to length still says why.

With `message_groups`, each message carries its group (the job's tenant) as its
MessageGroupId, which on a standard queue is what SQS fair queues order deliveries by: a
quiet tenant's messages are handed out ahead of a noisy tenant's backlog.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, InvalidRegionError, NoRegionError

from shared.core.errors import ConfigError, QueueMissing, TransportError
from shared.transport.base import (
    MAX_BATCH,
    MAX_VISIBILITY_SECONDS,
    MAX_WAIT_SECONDS,
    EntryFailure,
    Outgoing,
    Received,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

log = logging.getLogger("tock.sqs")

ATTEMPTS = 3
"""Tries of one SQS call, the first included (botocore's `total_max_attempts`; its
`max_attempts` counts retries only, so `max_attempts: 3` was 4 tries). A call into an SQS
that does not answer therefore returns within ATTEMPTS x its read timeout, plus backoff."""

REPORT_MISSING_EVERY_SECONDS = 30.0
"""A queue that stays missing is reported at most this often (per queue and process)."""

_HANDLE = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")
"""A receipt handle (or any long base64 run) inside an SQS error message."""
HANDLE_KEEP = 12
"""Characters of a handle kept in error texts: enough to tell two apart."""

MISSING_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
"""What SQS answers for a queue that does not exist (query and JSON protocols)."""

_GROUP_ID = re.compile(r"[!-~]{1,128}")
"""What SQS takes as a MessageGroupId: 1-128 printable ASCII characters, no space."""
NO_TENANT_GROUP = "tock:no-tenant"
"""The group of jobs enqueued without a tenant (which form one tenant)."""


class RequestCounts:
    """HTTP requests this process sent to SQS, per operation, each retry included: what
    SQS bills (per 64 KB request, whatever a batch holds). Counted by a botocore
    `before-send` hook on every client a transport makes; exported by the processes as
    `tock_sqs_requests_total` (shared/runtime/metrics.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def count(self, event_name: str = "", **_: Any) -> None:
        """The hook: `event_name` is `before-send.sqs.<Operation>`. Returns None, which
        botocore takes as "send it" (a reply returned here would replace SQS's)."""
        operation = event_name.rpartition(".")[2] or "unknown"
        with self._lock:
            self._counts[operation] = self._counts.get(operation, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def watch(self, client: SQSClient) -> None:
        """Count `client`'s requests (once, however many transports share it). A
        stand-in without botocore's events (a test's) is not counted."""
        events = getattr(getattr(client, "meta", None), "events", None)
        if events is not None:
            events.register("before-send.sqs", self.count, unique_id="tock-sqs-requests")


REQUESTS = RequestCounts()
"""This process's SQS requests."""


def message_group_id(group: str) -> str:
    """A valid MessageGroupId for a tenant: the tenant itself when SQS takes it as one, else
    a stable digest of it (the same tenant always lands in the same group)."""
    if not group:
        return NO_TENANT_GROUP
    if _GROUP_ID.fullmatch(group):
        return group
    return "tock:" + hashlib.sha256(group.encode()).hexdigest()[:40]


def shorten_handles(text: str) -> str:
    """`text` with every receipt handle cut to its first characters and "...": SQS puts
    the whole handle before the reason ("Value OGM3Mjk5NjgtMmY2NS00... for parameter
    ReceiptHandle is invalid. Reason: ..."), and a cut log line would keep only the
    handle."""
    return _HANDLE.sub(lambda m: m.group()[:HANDLE_KEEP] + "...", text)


def sqs_client(config: Config | None = None) -> SQSClient:
    """A boto3 SQS client from the standard AWS configuration, or `ConfigError` naming the
    variable to fix when that configuration cannot work: no region, or an endpoint that is
    not an http(s) URL. No call is made, so a process finds out at start, not with a
    traceback (or a loop failing forever) later."""
    region = os.environ.get("AWS_DEFAULT_REGION")
    if region is not None and not region.strip():
        # boto3 takes an empty region as given, and then builds an endpoint URL from it
        # that it refuses as "Invalid endpoint" (or, with an endpoint set, signs for "").
        raise ConfigError("AWS_DEFAULT_REGION is set but empty; set it to a region (e.g. "
                          "AWS_DEFAULT_REGION=us-east-1) or unset it to use the AWS config "
                          "file's")
    try:
        client: SQSClient = boto3.client("sqs", config=config)
    except NoRegionError:
        raise ConfigError(
            "AWS_DEFAULT_REGION: no AWS region is configured; set it (e.g. "
            "AWS_DEFAULT_REGION=us-east-1) or `region` in the AWS config file (boto3 does "
            "not read AWS_REGION)") from None
    except InvalidRegionError as exc:
        raise ConfigError(f"AWS_DEFAULT_REGION: {exc}") from None
    except ValueError as exc:  # botocore's "Invalid endpoint: ...", urllib's own
        raise _bad_endpoint(str(exc)) from None
    endpoint = client.meta.endpoint_url
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # a port past 65535 raises only here
    except ValueError as exc:
        raise _bad_endpoint(str(exc)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad_endpoint("not an http:// or https:// URL")
    return client


def _bad_endpoint(reason: str) -> ConfigError:
    """The endpoint URL boto3 was given cannot work: where it came from, and why."""
    setting = next((name for name in ("AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL")
                    if os.environ.get(name)), None)
    where = (f"{setting}={_hidden(os.environ[setting])!r}" if setting
             else "the endpoint_url of the AWS config file")
    if reason.startswith("Invalid endpoint"):  # it quotes the URL, shown already
        reason = "not a URL"
    return ConfigError(f"{where}: {reason}; expected a URL such as http://127.0.0.1:4566 "
                       "(or nothing, for AWS itself)")


def _hidden(url: str) -> str:
    """`url` without the password of its user part."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


class SqsTransport:
    """SQS queues named `prefix + tock queue name`."""

    def __init__(self, prefix: str = "tock-", *, call_timeout_seconds: float = 10.0,
                 max_connections: int = 50, client: SQSClient | None = None,
                 create_missing: bool = False, visibility_timeout: int = 60,
                 dead_letter_after: int | None = 5, message_groups: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix = prefix
        self.message_groups = message_groups
        self.create_missing = create_missing
        self.visibility_timeout = visibility_timeout
        self.dead_letter_after = dead_letter_after
        retries: Any = {"mode": "standard", "total_max_attempts": ATTEMPTS}
        # Every call but the long poll has its own short read timeout, so a hung SQS call
        # returns within call_timeout_seconds; the long poll holds its connection up to
        # 20 s, so its client allows that on top.
        self.client: SQSClient = client or sqs_client(Config(
            connect_timeout=call_timeout_seconds, read_timeout=call_timeout_seconds,
            retries=retries, max_pool_connections=max_connections))
        self._poll: SQSClient = client or sqs_client(Config(
            connect_timeout=call_timeout_seconds,
            read_timeout=call_timeout_seconds + MAX_WAIT_SECONDS,
            retries=retries, max_pool_connections=max_connections))
        REQUESTS.watch(self.client)
        REQUESTS.watch(self._poll)
        self._urls: dict[str, str] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._known: set[str] = set()
        """Queues this transport has found or created: one created again was lost."""
        self._missing_said: dict[str, float] = {}
        self._recreated_said: dict[str, float] = {}
        """When each missing queue was last reported (by `_clock`)."""

    def queue_name(self, queue: str) -> str:
        return f"{self.prefix}{queue}"

    def url(self, queue: str) -> str:
        """The queue's URL (cached); `QueueMissing` if it does not exist."""
        with self._lock:
            cached = self._urls.get(queue)
        if cached:
            return cached
        try:
            found: str = _field(self.client.get_queue_url(QueueName=self.queue_name(queue)),
                                "GetQueueUrl", "QueueUrl")
        except UNREADABLE as exc:
            raise TransportError(f"SQS GetQueueUrl answered what cannot be read: "
                                 f"{type(exc).__name__}: {exc}") from exc
        except ClientError as exc:
            if _code(exc) in MISSING_CODES:
                raise QueueMissing(
                    f"SQS queue {self.queue_name(queue)!r} for tock queue {queue!r} does not "
                    "exist") from exc
            raise TransportError(
                f"SQS queue {self.queue_name(queue)!r} for tock queue {queue!r} is not "
                f"accessible: {_describe(exc)}") from exc
        except BotoCoreError as exc:
            raise TransportError(f"SQS unreachable: {shorten_handles(str(exc))}") from exc
        self._remember(queue, found)
        return found

    def create_queue(self, queue: str, *, visibility_timeout: int | None = None,
                     dead_letter_after: int | None = None) -> str:
        """Create the queue, and a dead-letter queue `...-dlq` when `dead_letter_after`
        (idempotent)."""
        attributes: dict[str, str] = {
            "VisibilityTimeout": str(visibility_timeout or self.visibility_timeout)}
        try:
            if dead_letter_after:
                dlq = _field(self.client.create_queue(
                    QueueName=self.queue_name(queue) + "-dlq"), "CreateQueue", "QueueUrl")
                arn = _field(self.client.get_queue_attributes(
                    QueueUrl=dlq, AttributeNames=["QueueArn"]).get("Attributes", {}),
                    "GetQueueAttributes", "QueueArn")
                attributes["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": arn, "maxReceiveCount": str(dead_letter_after)})
            url: str = _field(self.client.create_queue(
                QueueName=self.queue_name(queue), Attributes=attributes),  # type: ignore[arg-type]
                "CreateQueue", "QueueUrl")
        except (ClientError, BotoCoreError, TransportError, *UNREADABLE) as exc:
            raise TransportError(
                f"cannot create SQS queue {queue!r}: {shorten_handles(str(exc))}") from exc
        self._remember(queue, url)
        return url

    def send_batch(self, queue: str, entries: Sequence[Outgoing]) -> list[EntryFailure]:
        if not entries:
            return []
        batch: list[Any] = []
        for entry in entries:
            one = {"Id": entry.entry_id, "MessageBody": entry.body}
            if self.message_groups and entry.group is not None:
                one["MessageGroupId"] = message_group_id(entry.group)
            batch.append(one)
        resp = self._call("SendMessageBatch", queue, self.client.send_message_batch,
                          Entries=batch)
        return _failures(resp, [entry.entry_id for entry in entries])

    def receive(self, queue: str, max_messages: int = MAX_BATCH, wait_seconds: int = 20,
                visibility_timeout: int = 60) -> list[Received]:
        resp = self._call(
            "ReceiveMessage", queue, self._poll.receive_message,
            MaxNumberOfMessages=min(max_messages, MAX_BATCH),
            WaitTimeSeconds=min(wait_seconds, MAX_WAIT_SECONDS),
            VisibilityTimeout=visibility_timeout,
            MessageSystemAttributeNames=["ApproximateReceiveCount"])
        messages = resp.get("Messages", [])
        if not isinstance(messages, list):
            raise TransportError("SQS ReceiveMessage answered Messages that are not a list")
        return [
            Received(
                message_id=_field(m, "ReceiveMessage", "MessageId"),
                receipt=_field(m, "ReceiveMessage", "ReceiptHandle"),
                body=str(m.get("Body", "")),
                receive_count=_count(m.get("Attributes") or {"ApproximateReceiveCount": "1"},
                                     "ApproximateReceiveCount"),
            )
            for m in messages
        ]

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        if not receipts:
            return []
        resp = self._call(
            "DeleteMessageBatch", queue, self.client.delete_message_batch,
            Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)])
        return _failures(resp, [str(i) for i in range(len(receipts))])

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                timeout_seconds: int) -> list[EntryFailure]:
        if not receipts:
            return []
        resp = self._call(
            "ChangeMessageVisibilityBatch", queue, self.client.change_message_visibility_batch,
            Entries=[{"Id": str(i), "ReceiptHandle": r,
                      "VisibilityTimeout": min(timeout_seconds, MAX_VISIBILITY_SECONDS)}
                     for i, r in enumerate(receipts)])
        return _failures(resp, [str(i) for i in range(len(receipts))])

    def check(self, queue: str) -> None:
        """GetQueueUrl (which every tock role may call), creating the queue if it is
        missing and `create_missing` is on. A missing queue is the caller's to report (the
        start-up check does), so the calls right after it do not report it again."""
        try:
            self._url_or_create(queue)
        except QueueMissing:
            with self._lock:
                self._missing_said[queue] = self._clock()
            raise

    def depth(self, queue: str) -> int:
        """Messages in the queue: visible, in flight and delayed (SQS's approximations)."""
        return sum(self.counts(queue))

    def counts(self, queue: str) -> tuple[int, int]:
        """(visible or delayed, in flight): SQS's approximate attributes."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed"]
        resp = self._call("GetQueueAttributes", queue, self.client.get_queue_attributes,
                          AttributeNames=names)
        # No zeros for a reply without them: "the queue is empty" would make the timer
        # send its whole backlog again (an empty reply of a server starting or stopping).
        attributes = _field(resp, "GetQueueAttributes", "Attributes", kind=dict)
        visible, in_flight, delayed = (_count(attributes, n) for n in names)
        return visible + delayed, in_flight

    def created_at(self, queue: str) -> datetime | None:
        """SQS's CreatedTimestamp of the queue (whole seconds). A queue deleted and created
        again (a restarted LocalStack, an operator's mistake) has a new one."""
        resp = self._call("GetQueueAttributes", queue, self.client.get_queue_attributes,
                          AttributeNames=["CreatedTimestamp"])
        attributes = _field(resp, "GetQueueAttributes", "Attributes", kind=dict)
        value = attributes.get("CreatedTimestamp")
        if not value:
            return None
        try:  # whole seconds from SQS; moto's server adds a fraction
            return datetime.fromtimestamp(float(value), UTC)
        except (ValueError, OverflowError, OSError):
            raise TransportError(f"SQS GetQueueAttributes answered CreatedTimestamp "
                                 f"{shorten_handles(str(value))[:40]!r}, not a time") from None

    def _call(self, name: str, queue: str, method: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return self._call_once(name, queue, method, **kwargs)
        except QueueMissing:
            self._report_missing(queue, name)
            raise

    def _call_once(self, name: str, queue: str, method: Callable[..., Any],
                   **kwargs: Any) -> Any:
        for attempt in (1, 2):
            url = self._url_or_create(queue)
            try:
                return method(QueueUrl=url, **kwargs)
            except UNREADABLE as exc:  # botocore's parser, on a reply of the wrong shape
                raise TransportError(f"SQS {name} answered what cannot be read: "
                                     f"{type(exc).__name__}: {exc}") from exc
            except ClientError as exc:
                if _code(exc) not in MISSING_CODES:
                    raise TransportError(f"SQS {name} failed: {_describe(exc)}") from exc
                with self._lock:  # the cached URL names a queue that is gone
                    self._urls.pop(queue, None)
                if not self.create_missing or attempt == 2:
                    raise QueueMissing(
                        f"SQS {name} failed: queue {self.queue_name(queue)!r} for tock queue "
                        f"{queue!r} does not exist") from exc
            except BotoCoreError as exc:
                raise TransportError(f"SQS {name} failed: {shorten_handles(str(exc))}") from exc
        raise AssertionError("unreachable")

    def _url_or_create(self, queue: str) -> str:
        try:
            return self.url(queue)
        except QueueMissing:
            if not self.create_missing:
                raise
        with self._lock:
            lost = queue in self._known
        url = self.create_queue(queue, dead_letter_after=self.dead_letter_after)
        self._report_created(queue, lost)
        return url

    def _remember(self, queue: str, url: str) -> None:
        with self._lock:
            self._urls[queue] = url
            self._known.add(queue)

    def _report_created(self, queue: str, lost: bool) -> None:
        """A queue created at first use is news; one created again means messages lost."""
        if not lost:
            _log(logging.INFO, "queue_created", queue=queue, sqs_queue=self.queue_name(queue))
            return
        # The timer's senders meet the loss at once, each creating the queue (CreateQueue
        # is idempotent): one line for the event, not one per thread.
        if not self._due_to_say(self._recreated_said, queue):
            return
        _log(logging.WARNING, "queue_recreated", queue=queue,
             sqs_queue=self.queue_name(queue),
             detail="the queue was gone (deleted, or SQS restarted) and is created again "
                    "(TOCK_CREATE_QUEUES=1); the messages it held are gone: the timer "
                    "sends their jobs again once they have waited its dispatch timeout "
                    "(TOCK_DISPATCH_TIMEOUT_SECONDS)")

    def _due_to_say(self, said: dict[str, float], queue: str) -> bool:
        """Whether a line of the kind `said` records is due for `queue`: at most once per
        REPORT_MISSING_EVERY_SECONDS (recorded as said when it is)."""
        now = self._clock()
        with self._lock:
            last = said.get(queue)
            if last is not None and now - last < REPORT_MISSING_EVERY_SECONDS:
                return False
            said[queue] = now
            return True

    def _report_missing(self, queue: str, operation: str) -> None:
        """`queue_missing`, at most once per REPORT_MISSING_EVERY_SECONDS per queue: every
        loop using the queue meets it on every pass."""
        if not self._due_to_say(self._missing_said, queue):
            return
        _log(logging.ERROR, "queue_missing", queue=queue, sqs_queue=self.queue_name(queue),
             operation=operation,
             detail="create it (infra/ templates), or set TOCK_CREATE_QUEUES=1 for a local "
                    "stack; calls are retried until it exists (reported once per 30 s)")


def _log(level: int, event: str, **fields: Any) -> None:
    """A structured line as `shared.runtime.logs.emit` writes it (the transport sits
    below the runtime layer, so it cannot import it)."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, "fields": fields})


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _describe(exc: ClientError) -> str:
    err = exc.response.get("Error", {})
    return f"{err.get('Code', '?')}: {shorten_handles(err.get('Message', str(exc)))}"


UNREADABLE = (AttributeError, TypeError, KeyError, ValueError)
"""What botocore's parser raises on a reply of the wrong shape (a map where it expects a
list, text where a number): not its own errors, so caught around the call alone."""

NO_REPLY = "NoReply"
"""The code of an entry a batch reply left out: it may or may not have been done."""


def _field(reply: Any, operation: str, name: str, *, kind: type = str) -> Any:
    """`reply[name]`, a `kind`, or TransportError: a server starting or being killed
    (LocalStack's gateway does this) can answer 200 with an empty body, which boto3
    returns as a reply with no fields rather than an error."""
    value = reply.get(name) if isinstance(reply, dict) else None
    if value is None:
        raise TransportError(f"SQS {operation} answered without {name} (an empty reply: "
                             "is the server starting or stopping?)")
    if not isinstance(value, kind):
        raise TransportError(f"SQS {operation} answered a {type(value).__name__} as "
                             f"{name}, not a {kind.__name__}")
    return value


def _count(attributes: Any, name: str) -> int:
    """A count SQS gives as text (`"12"`), or TransportError."""
    if not isinstance(attributes, dict) or name not in attributes:
        raise TransportError(f"SQS answered without the attribute {name}")
    try:
        return int(attributes[name])
    except (TypeError, ValueError):
        raise TransportError(f"SQS answered {name} = "
                             f"{shorten_handles(str(attributes[name]))[:40]!r}, not a "
                             "count") from None


def _entries(resp: Any, name: str) -> list[dict[str, Any]]:
    """The entries of a batch reply's `name` list that are objects (the rest say nothing)."""
    found = resp.get(name, []) if isinstance(resp, dict) else []
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def _failures(resp: Any, ids: Sequence[str]) -> list[EntryFailure]:
    """The entries of a batch call that did not succeed: those SQS refused, and those its
    reply does not mention (an empty reply is no promise that anything was done)."""
    failed = [
        EntryFailure(str(f.get("Id")), str(f.get("Code", "?")),
                     shorten_handles(str(f.get("Message", ""))))
        for f in _entries(resp, "Failed")
    ]
    answered = {f.entry_id for f in failed} | {
        str(s.get("Id")) for s in _entries(resp, "Successful")}
    return failed + [EntryFailure(i, NO_REPLY, "SQS's reply did not mention this entry")
                     for i in ids if i not in answered]
