"""What the timer and consumers need from a message queue: the `Transport` contract.
`shared.transport.sqs.SqsTransport` is the production implementation;
`shared.transport.memory.MemoryTransport` keeps the same semantics in memory (benchmarks,
tests). Both pass one contract suite (tests/integration/test_transport_contract.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol

MAX_BATCH = 10
"""SQS batch calls take at most 10 entries."""
MAX_WAIT_SECONDS = 20
"""Longest long poll SQS allows."""
MAX_VISIBILITY_SECONDS = 43200
"""12 hours: the longest visibility timeout SQS allows."""


@dataclass(frozen=True)
class Received:
    """A received message: its body and the handle that deletes or extends it."""

    message_id: str
    receipt: str
    body: str
    receive_count: int


class Outgoing(NamedTuple):
    """One message to send."""

    entry_id: str
    body: str
    group: str | None = None
    """Who the message is for, in fairness terms: the job's tenant ('' for none). SQS
    carries it as the MessageGroupId (fair queues); a transport may ignore it."""


@dataclass(frozen=True)
class EntryFailure:
    """One entry of a batch call that the queue refused."""

    entry_id: str
    code: str
    message: str


class Transport(Protocol):
    def send_batch(self, queue: str, entries: Sequence[Outgoing]) -> list[EntryFailure]:
        """Send at most 10 messages; return the entries that failed."""
        ...

    def receive(self, queue: str, max_messages: int, wait_seconds: int,
                visibility_timeout: int) -> list[Received]:
        ...

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        ...

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                timeout_seconds: int) -> list[EntryFailure]:
        ...

    def check(self, queue: str) -> None:
        """Raise `QueueMissing` if the queue does not exist (a transport that creates
        missing queues creates it instead)."""
        ...

    def depth(self, queue: str) -> int:
        """Messages in the queue (visible, in flight, delayed); approximate on SQS."""
        ...

    def counts(self, queue: str) -> tuple[int, int]:
        """(waiting, in flight): messages visible or delayed, and messages received and
        not yet deleted or visible again; approximate on SQS."""
        ...

    def created_at(self, queue: str) -> datetime | None:
        """When the queue was created (None: not known, or it was never lost): a message
        sent before then went to a queue that is gone."""
        ...
