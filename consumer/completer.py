"""Write outcomes: take the finished attempts waiting (up to `completion_batch_size`),
write them with one fenced statement, commit, and only then hand their messages to the
deleter (consumer/deleter.py).

A crash before the delete leaves messages that are redelivered and find their job
finished, which is harmless. A result whose fence matches nothing (the lease was lost:
cancelled, or expired and taken over) is discarded with a `result_discarded` line.
"""

from __future__ import annotations

import logging
import queue as queues
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from typing import Any

from consumer.lease import let_go
from consumer.outcomes import Finished
from consumer.pipeline import Pipeline
from shared.core.errors import DataRejected, LeaseLost, Retryable
from shared.core.states import AttemptOutcome, JobState
from shared.runtime import metrics
from shared.runtime.logs import emit, one_write
from shared.runtime.supervisor import Loop

log = logging.getLogger("tock.consumer")

TAKE_WAIT_SECONDS = 0.2
NOTIFY_WITHIN_SECONDS = 60
"""A retry due sooner than this wakes the timers (NOTIFY) instead of waiting for a pass."""


class Completer(Loop):
    name = "complete"

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.pipe = pipe
        self.pass_bound_seconds = pipe.sqs_pass_bound()  # its deletes, driven step by step
        self.group_commit_seconds = pipe.settings.group_commit_ms / 1000
        self._retrying: list[Finished] = []

    def run_once(self, now: datetime | None = None, wait_seconds: float = TAKE_WAIT_SECONDS
                 ) -> int:
        """Write one batch of outcomes, then delete their messages; returns how many."""
        batch = self._take(wait_seconds)
        if not batch:
            return 0
        self.finish(batch)
        return len(batch)

    def _take(self, wait_seconds: float) -> list[Finished]:
        """The outcomes waiting, up to completion_batch_size. After the first one comes,
        wait `group_commit_seconds` for more while handlers are still running: one commit
        then covers several outcomes (group commit), for a few milliseconds of latency.
        The wait is a plain sleep, not a wait on the queue: woken by every outcome put
        there, this thread would cost a thread switch per job."""
        batch, self._retrying = self._retrying, []
        limit = self.pipe.settings.completion_batch_size
        try:
            if not batch:
                batch.append(self.pipe.done.get(timeout=wait_seconds) if wait_seconds
                             else self.pipe.done.get_nowait())
            if wait_seconds and self.group_commit_seconds and self.pipe.slots.used:
                time.sleep(self.group_commit_seconds)
            while len(batch) < limit:
                batch.append(self.pipe.done.get_nowait())
        except queues.Empty:
            pass
        return batch

    def finish(self, batch: list[Finished]) -> None:
        """Write (fenced), then delete, then forget. A retryable database error keeps the
        batch for the next pass: the lease may run out meanwhile, and then the fence
        rejects the write, which is the correct outcome."""
        pipe = self.pipe
        # A late result of a job released at shutdown is not written: the release is.
        batch = [f for f in batch if pipe.tracker.holds(f.item)
                 and (not f.item.released or f.result.outcome is AttemptOutcome.RELEASED)]
        live = [f for f in batch if not f.item.lease_lost]
        for f in live:
            f.item.completing = True
        written: set[int] = set()
        if live:
            try:
                written = self._write(live)
            except Retryable:
                for f in live:
                    f.item.completing = False
                self._retrying = batch
                raise
        # A lease the heartbeat found lost may be a claim lost with it: checked too.
        unclaimed, states = self._claims_lost([f for f in batch
                                               if f.item.job_id not in written])
        by_queue: dict[str, list[str]] = defaultdict(list)
        again: dict[str, list[str]] = defaultdict(list)
        with one_write():  # the batch's job lines, in one write
            for f in batch:
                if f.item.job_id in unclaimed:
                    again[f.item.queue].append(f.item.receipt)
                    continue
                self._report(f, f.item.job_id in written, states.get(f.item.job_id))
                by_queue[f.item.queue].append(f.item.receipt)
        # Only now, after the commit: delete (on the deleter's thread, so that the next
        # outcomes' commit does not wait for SQS).
        for q, receipts in by_queue.items():
            pipe.after_commit(q, receipts)
        for q, receipts in again.items():
            pipe.after_commit(q, receipts, visible=True)
        for f in batch:
            if not (f.item.abandoned and not f.item.detached and not f.item.released):
                pipe.tracker.forget(f.item)

    def _claims_lost(self, discarded: list[Finished]
                     ) -> tuple[set[int], dict[int, JobState]]:
        """Jobs whose result matched no row because the claim itself was lost (a database
        crash took its asynchronous commit): still `dispatched` with this very token. Their
        message is made visible again, not deleted, so the job runs again at once instead
        of waiting for the timer to notice a lost message. Also the state of each discarded
        job, for its log line."""
        if not discarded:
            return set(), {}
        try:
            states = self.pipe.store.job_states([f.item.job_id for f in discarded])
        except Retryable:
            return set(), {}  # cannot tell: delete as usual; the timer re-sends lost messages
        lost = {f.item.job_id for f in discarded
                if states.get(f.item.job_id) == (JobState.DISPATCHED, f.item.lease.token)}
        for job_id in lost:
            emit(log, "claim_lost", logging.WARNING, job_id=job_id, worker=self.pipe.worker_id,
                 detail="the claim did not survive a database restart; the message is "
                        "visible again and the job runs again")
        return lost, {job_id: state for job_id, (state, _) in states.items()}

    def _write(self, batch: list[Finished]) -> set[int]:
        pipe = self.pipe
        try:
            written = pipe.store.finish_attempts([f.result for f in batch], pipe.worker_id,
                                                 pipe.clock())
        except DataRejected:
            written = self._write_each(batch)
        if any(f.result.state in (JobState.RETRYING, JobState.SCHEDULED)
               and f.result.delay_seconds < NOTIFY_WITHIN_SECONDS for f in batch):
            try:
                pipe.store.notify_due()
            except Retryable as exc:
                # The outcomes are committed: keeping the batch for another pass would
                # write nothing and report them discarded. The timers look for due work
                # at least every TOCK_MAX_IDLE_SECONDS anyway: a lost wake-up costs that.
                emit(log, "notify_failed", logging.WARNING, worker=pipe.worker_id,
                     error=str(exc), detail="the retries are due all the same; a timer "
                                            "finds them at its next pass")
        return written

    def _write_each(self, batch: list[Finished]) -> set[int]:
        """Postgres refused a value in the batch (outcomes are made storable, so this is a
        last line of defence): write one by one, and an outcome it refuses with its error
        text replaced by the reason. One that still cannot be written is left to its lease
        expiring, as if this worker had died: the timer rescues the job."""
        pipe, written = self.pipe, set()
        for f in batch:
            plain = replace(f.result, traceback=None, error=(
                f"{f.result.outcome.value}: the error text and traceback of this attempt "
                "were refused by Postgres and are not stored"))
            for result in (f.result, plain):
                try:
                    written |= pipe.store.finish_attempts([result], pipe.worker_id,
                                                          pipe.clock())
                    break
                except DataRejected as exc:
                    emit(log, "outcome_rejected", logging.ERROR, job_id=f.item.job_id,
                         attempt=f.item.attempt, error=str(exc))
            else:
                let_go(pipe, f.item)  # if Postgres is away too: at the lease keeper's tick
        return written

    def _report(self, f: Finished, written: bool, state: JobState | None = None) -> None:
        item, kind = f.item, f.item.context.kind
        worker = self.pipe.worker_id
        if not written:
            metrics.STALE_COMPLETIONS.inc()
            if state is JobState.CANCELLED:  # an operator's doing: as asked, no alarm
                emit(log, "result_discarded", logging.INFO, job_id=item.job_id, kind=kind,
                     attempt=item.attempt, worker=worker, outcome=f.result.outcome.value,
                     detail="the job was cancelled while it ran")
                return
            lost = LeaseLost(f"job {item.job_id} attempt {item.attempt}: the fenced write "
                             "matched no row (cancelled, or its lease expired and the job "
                             "was taken over)")
            emit(log, "result_discarded", logging.WARNING, job_id=item.job_id, kind=kind,
                 attempt=item.attempt, worker=worker, error=f"LeaseLost: {lost}",
                 outcome=f.result.outcome.value)
            return
        outcome = f.result.outcome.value
        metrics.child(metrics.OUTCOMES, kind, outcome).inc()
        metrics.child(metrics.RUN_DURATION, kind, outcome).observe(f.run_seconds)
        if f.result.state is JobState.RETRYING and not f.result.refund:
            metrics.child(metrics.RETRIES, kind).inc()
        if f.result.state is JobState.DEAD:
            metrics.child(metrics.DEAD, kind).inc()
        level = logging.INFO if f.result.state is JobState.SUCCEEDED else logging.WARNING
        extra: dict[str, Any] = {"error": f.result.error} if f.result.error else {}
        if f.result.state is JobState.RETRYING and not f.result.refund:
            extra["retry_in_s"] = round(f.result.delay_seconds, 2)
        emit(log, f"job_{f.result.outcome.value}", level, job_id=item.job_id, kind=kind,
             attempt=item.attempt, worker=worker, next_state=f.result.state.value,
             ms=round(f.run_seconds * 1000, 1), **extra)
