"""An in-memory `Transport`: the SQS semantics tock relies on, without a server.

The benchmarks run the real timer and consumer code over it to isolate the database work
per job from the cost of SQS. It keeps what matters to that code: at most 10 entries per
batch call, visibility timeouts (a received message reappears when its timeout runs out,
with a higher receive count), receipt handles that go stale on redelivery, long polling,
and thread safety (the timer sends from a pool while consumer threads receive).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shared.core.errors import InvalidInput
from shared.transport.base import (
    MAX_BATCH,
    MAX_VISIBILITY_SECONDS,
    MAX_WAIT_SECONDS,
    EntryFailure,
    Outgoing,
    Received,
)


@dataclass
class _Message:
    message_id: str
    body: str
    receive_count: int = 0
    receipt: str | None = None
    """The receipt of the latest receive; None while the message is visible."""
    visible_at: float = 0.0


@dataclass
class _Queue:
    messages: dict[str, _Message] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    """Visible message ids in send order."""
    hidden: list[tuple[float, int, str]] = field(default_factory=list)
    """Heap of (visible_at, sequence, message id) of received messages."""
    by_receipt: dict[str, str] = field(default_factory=dict)


class MemoryTransport:
    """Queues live in this object; every thread that shares it sees the same queues.

    `clock` (monotonic seconds) is injectable so tests can move time past a visibility
    timeout without waiting; long polls still wait in real time.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queues: dict[str, _Queue] = {}
        self._cond = threading.Condition()
        self._seq = itertools.count()
        # Ids as SQS's are: unique, opaque. A counter under one random prefix per transport
        # costs the process that runs it (a benchmark's) nothing: uuid4 per message read
        # urandom twice per job.
        self._prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()
        self.deleted = 0
        """Messages deleted so far, across queues (the benchmark waits on it: a consumer
        deletes a message only after its outcome is committed)."""

    # --- the Transport protocol ------------------------------------------------------------

    def send_batch(self, queue: str, entries: Sequence[Outgoing]) -> list[EntryFailure]:
        """Append the messages (their group is not used here); all succeed."""
        _check_batch(len(entries))
        with self._cond:
            q = self._queue(queue)
            for entry in entries:
                msg = _Message(f"{self._prefix}-{next(self._ids)}", entry.body)
                q.messages[msg.message_id] = msg
                q.ready.append(msg.message_id)
            self._cond.notify_all()
        return []

    def receive(self, queue: str, max_messages: int = MAX_BATCH, wait_seconds: int = 0,
                visibility_timeout: int = 30) -> list[Received]:
        """Up to `max_messages` visible messages, hidden for `visibility_timeout` seconds;
        waits up to `wait_seconds` for one to arrive (long poll)."""
        if not 1 <= max_messages <= MAX_BATCH:
            raise InvalidInput(f"max_messages must be 1..{MAX_BATCH}, got {max_messages}")
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise InvalidInput(f"wait_seconds must be 0..{MAX_WAIT_SECONDS}, got {wait_seconds}")
        _check_visibility(visibility_timeout)
        deadline = time.monotonic() + wait_seconds
        with self._cond:
            q = self._queue(queue)
            while True:
                got = self._take(q, max_messages, visibility_timeout)
                left = deadline - time.monotonic()
                if got or left <= 0:
                    return got
                # Woken by a send, or early enough to see a visibility timeout run out.
                self._cond.wait(min(left, 0.05))

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        """Delete by receipt; a receipt superseded by a later receive is refused."""
        _check_batch(len(receipts))
        failures = []
        with self._cond:
            q = self._queue(queue)
            for index, receipt in enumerate(receipts):
                msg = self._current(q, receipt)
                if msg is None:
                    failures.append(EntryFailure(str(index), "ReceiptHandleIsInvalid",
                                                 "unknown or superseded receipt handle"))
                    continue
                del q.messages[msg.message_id]
                del q.by_receipt[receipt]
                self.deleted += 1
        return failures

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                timeout_seconds: int) -> list[EntryFailure]:
        """Hide in-flight messages for `timeout_seconds` from now."""
        _check_batch(len(receipts))
        _check_visibility(timeout_seconds)
        failures = []
        with self._cond:
            q = self._queue(queue)
            now = self._clock()
            for index, receipt in enumerate(receipts):
                msg = self._current(q, receipt)
                if msg is None or msg.visible_at <= now:
                    failures.append(EntryFailure(str(index), "MessageNotInflight",
                                                 "the message is not in flight"))
                    continue
                msg.visible_at = now + timeout_seconds
                heapq.heappush(q.hidden, (msg.visible_at, next(self._seq), msg.message_id))
        return failures

    # --- for tests and the benchmark harness -------------------------------------------------

    def create_queue(self, queue: str) -> None:
        with self._cond:
            self._queue(queue)

    def check(self, queue: str) -> None:
        """Queues exist from their first use."""

    def depth(self, queue: str) -> int:
        """Messages in the queue, visible or in flight."""
        visible, in_flight = self.counts(queue)
        return visible + in_flight

    def created_at(self, queue: str) -> datetime | None:
        """Queues here are never lost: no evidence to give."""
        return None

    def counts(self, queue: str) -> tuple[int, int]:
        """(visible, in flight) message counts, as SQS's approximate attributes give them."""
        with self._cond:
            q = self._queue(queue)
            self._reveal(q, self._clock())
            return len(q.ready), len(q.messages) - len(q.ready)

    # --- internals ------------------------------------------------------------------------------

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue()
        return q

    def _current(self, q: _Queue, receipt: str) -> _Message | None:
        message_id = q.by_receipt.get(receipt)
        msg = q.messages.get(message_id) if message_id else None
        if msg is None or msg.receipt != receipt:
            return None
        return msg

    def _reveal(self, q: _Queue, now: float) -> None:
        """Move messages whose visibility timeout ran out back to the ready queue. Heap
        entries left behind by a later extension or a delete are skipped."""
        while q.hidden and q.hidden[0][0] <= now:
            visible_at, _, message_id = heapq.heappop(q.hidden)
            msg = q.messages.get(message_id)
            if msg is None or msg.receipt is None or msg.visible_at != visible_at:
                continue
            q.by_receipt.pop(msg.receipt, None)
            msg.receipt = None
            q.ready.append(message_id)

    def _take(self, q: _Queue, most: int, visibility_timeout: int) -> list[Received]:
        now = self._clock()
        self._reveal(q, now)
        out: list[Received] = []
        while q.ready and len(out) < most:
            msg = q.messages.get(q.ready.popleft())
            if msg is None:
                continue
            msg.receive_count += 1
            msg.receipt = f"{msg.message_id}:{msg.receive_count}:{next(self._ids)}"
            msg.visible_at = now + visibility_timeout
            q.by_receipt[msg.receipt] = msg.message_id
            heapq.heappush(q.hidden, (msg.visible_at, next(self._seq), msg.message_id))
            out.append(Received(msg.message_id, msg.receipt, msg.body, msg.receive_count))
        return out


def _check_batch(size: int) -> None:
    if size > MAX_BATCH:
        raise InvalidInput(f"batch calls take at most {MAX_BATCH} entries, got {size}")


def _check_visibility(seconds: int) -> None:
    if not 0 <= seconds <= MAX_VISIBILITY_SECONDS:
        raise InvalidInput(f"visibility timeout must be 0..{MAX_VISIBILITY_SECONDS} s, "
                           f"got {seconds}")
