"""What the timer and consumers need from a message queue. `shared.sqs.SqsTransport`
is the production implementation; the benchmarks also run an in-memory one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Received:
    """A received message: its body and the handle that deletes or extends it."""

    message_id: str
    receipt: str
    body: str
    receive_count: int


@dataclass(frozen=True)
class EntryFailure:
    """One entry of a batch call that the queue refused."""

    entry_id: str
    code: str
    message: str


class Transport(Protocol):
    def send_batch(self, queue: str, entries: list[tuple[str, str]]) -> list[EntryFailure]:
        """Send (entry id, body) pairs, at most 10; return the entries that failed."""
        ...

    def receive(self, queue: str, max_messages: int, wait_seconds: int,
                visibility_timeout: int) -> list[Received]:
        ...

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        ...

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                timeout_seconds: int) -> list[EntryFailure]:
        ...
