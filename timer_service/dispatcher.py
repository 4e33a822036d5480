"""Due rows -> SQS messages.

Order, chosen so that no crash loses a job or leaves it stuck: claim (scheduled ->
dispatched with a new token), send, then commit, all in one transaction.
- Crash before the send, or between send and commit: the transaction rolls back, the job
  is due again at once and another pass sends it with a new token. A message already sent
  carries a token that was never committed, so it claims nothing and is dropped.
- A consumer that receives a message before the commit waits on the row lock for the
  moment it takes the commit to land, then claims normally.
- SQS refusing some entries: those rows are put back in the same transaction.
A message lost after the commit is covered by the rescuer's re-dispatch of stuck jobs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from shared.core.errors import TransportError
from shared.core.messages import JobMessage
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.store import jobs_sql as sql
from shared.store.database import transaction
from shared.transport.base import EntryFailure, Transport
from shared.transport.sqs import MAX_BATCH

log = logging.getLogger("tock.timer.dispatch")


class Dispatcher:
    """Claims due jobs in batches and sends them, several SendMessageBatch calls at once."""

    def __init__(self, pool: ConnectionPool, transport: Transport, *, batch_size: int,
                 send_concurrency: int) -> None:
        self.pool = pool
        self.transport = transport
        self.batch_size = batch_size
        self._executor = ThreadPoolExecutor(send_concurrency, thread_name_prefix="tock-send")

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def dispatch_due(self, now: datetime | None = None) -> tuple[int, int]:
        """One batch: returns (sent, refused)."""
        with transaction(self.pool) as conn:
            rows = conn.execute(sql.CLAIM_DUE, {"limit": self.batch_size, "now": now}).fetchall()
            if not rows:
                return 0, 0
            failed = self._send(rows)
            if failed:
                prev = {r[0]: r[4] for r in rows}
                ids = list(failed)
                conn.execute(sql.UNDO_DISPATCH, {
                    "ids": ids, "prev_states": [prev[i] for i in ids],
                    "errors": [failed[i] for i in ids], "now": now,
                })
        sent = len(rows) - len(failed)
        for row in rows:
            if row[0] not in failed:
                metrics.DUE_TO_DISPATCH.observe(max(row[5], 0.0))
                emit(log, "job_dispatched", logging.DEBUG, job_id=row[0], kind=row[1],
                     queue=row[2], lag_ms=round(row[5] * 1000, 1))
        return sent, len(failed)

    def _send(self, rows: list[Any]) -> dict[int, str]:
        """Send every row; returns {job id: error} for the ones SQS did not take."""
        by_queue: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for job_id, kind, queue, token, _prev, _lag in rows:
            by_queue[queue].append((str(job_id), JobMessage(job_id, token, kind).encode()))
        calls = [
            (queue, entries[i:i + MAX_BATCH])
            for queue, entries in by_queue.items()
            for i in range(0, len(entries), MAX_BATCH)
        ]
        futures = [(q, chunk, self._executor.submit(self.transport.send_batch, q, chunk))
                   for q, chunk in calls]
        failed: dict[int, str] = {}
        for queue, chunk, future in futures:
            try:
                refused: list[EntryFailure] = future.result()
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("SendMessageBatch").inc()
                emit(log, "dispatch_failed", logging.WARNING, queue=queue, jobs=len(chunk),
                     error=str(exc))
                refused = [EntryFailure(entry_id, "TransportError", str(exc))
                           for entry_id, _ in chunk]
            for failure in refused:
                failed[int(failure.entry_id)] = f"SQS refused the send: {failure.code}: " \
                                                f"{failure.message}"
            metrics.DISPATCHED.labels(queue).inc(len(chunk) - len(refused))
            if refused:
                metrics.DISPATCH_FAILURES.labels(queue).inc(len(refused))
        return failed
