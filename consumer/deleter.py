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
from datetime import datetime

from consumer.pipeline import Pipeline, Tidy
from shared.runtime.supervisor import Loop

TAKE_WAIT_SECONDS = 0.2


class Deleter(Loop):
    name = "delete"

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        self.pass_bound_seconds = pipe.sqs_pass_bound()
        self.stall_log_seconds = pipe.settings.sqs_call_timeout_seconds + 5

    def run_once(self, now: datetime | None = None,
                 wait_seconds: float = TAKE_WAIT_SECONDS) -> int:
        """Delete (or make visible) one batch's messages; returns how many."""
        try:
            tidy = self.pipe.tidy.get(timeout=wait_seconds) if wait_seconds else \
                self.pipe.tidy.get_nowait()
        except queues.Empty:
            return 0
        self.apply(tidy)
        return len(tidy.receipts)

    def apply(self, tidy: Tidy) -> None:
        if tidy.visible:
            self.pipe.make_visible(tidy.queue, tidy.receipts)
        else:
            self.pipe.delete(tidy.queue, tidy.receipts)

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
