"""After an outcome's commit, its SQS message: deleted (or, for a claim the database lost,
made visible again) on a thread of its own, so that the next outcomes' commit never waits
for SQS. An SQS that hangs then delays only the deletes: the outcomes are written, and a
message left undeleted comes back after its visibility timeout and claims nothing (its
job is finished), which the claimer deletes then.

The completer hands each batch's receipts over (`Pipeline.after_commit`) only once the
commit is done: a message is never deleted before its outcome is durable.
"""

from __future__ import annotations

import queue as queues
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from consumer.pipeline import DELETE_CALLS_AT_ONCE, Pipeline, Tidy
from shared.runtime.supervisor import Loop
from shared.transport.base import MAX_BATCH

TAKE_WAIT_SECONDS = 0.2
MERGE_RECEIPTS = 10 * MAX_BATCH * DELETE_CALLS_AT_ONCE
"""Most receipts one pass takes from the batches waiting (ten waves of calls)."""


class Deleter(Loop):
    name = "delete"

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        self._pool = ThreadPoolExecutor(DELETE_CALLS_AT_ONCE, thread_name_prefix="tock-delete")
        self.pass_bound_seconds = pipe.sqs_pass_bound()
        self.stall_log_seconds = pipe.settings.sqs_call_timeout_seconds + 5

    def run_once(self, now: datetime | None = None,
                 wait_seconds: float = TAKE_WAIT_SECONDS) -> int:
        """Delete (or make visible) the messages of every batch waiting, up to
        MERGE_RECEIPTS, merged per queue (full batches of 10, several calls at once);
        returns how many."""
        try:
            first = self.pipe.tidy.get(timeout=wait_seconds) if wait_seconds else \
                self.pipe.tidy.get_nowait()
        except queues.Empty:
            return 0
        taken = [first]
        count = len(first.receipts)
        while count < MERGE_RECEIPTS:
            try:
                more = self.pipe.tidy.get_nowait()
            except queues.Empty:
                break
            taken.append(more)
            count += len(more.receipts)
        merged: dict[tuple[str, bool], list[str]] = {}
        for tidy in taken:
            merged.setdefault((tidy.queue, tidy.visible), []).extend(tidy.receipts)
        for (queue, visible), receipts in merged.items():
            self.apply(Tidy(queue, receipts, visible))
        return count

    def apply(self, tidy: Tidy) -> None:
        if tidy.visible:
            self.pipe.make_visible(tidy.queue, tidy.receipts)
        else:
            self.pipe.delete(tidy.queue, tidy.receipts, self._calls)

    def _calls(self, call: Callable[[list[str]], bool], chunks: list[list[str]]) -> list[bool]:
        """`call` on each chunk at once, on the pool; an unexpected error is raised here
        (in the loop, whose supervisor reports it), not lost in a worker thread."""
        return list(self._pool.map(call, chunks))

    def close(self) -> None:
        """Let the pool's threads go (after `drain`); calls under way finish first."""
        self._pool.shutdown(wait=False)

    def idle(self) -> None:
        """The wait is in `run_once` (on the queue), woken by the next batch."""

    def drain(self) -> int:
        """At shutdown, once this loop has stopped: the batches still queued, here."""
        done = 0
        while True:
            try:
                tidy = self.pipe.tidy.get_nowait()
            except queues.Empty:
                return done
            self.apply(tidy)
            done += len(tidy.receipts)
