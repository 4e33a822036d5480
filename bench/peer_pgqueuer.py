"""Run by the peers' virtualenv's Python (bench.peers), not by tock's: PgQueuer's side of
the peer comparison, with its defaults (asyncpg) and an async no-op entrypoint held to the
concurrency asked for, fetched in batches of its default 10 or the concurrency if smaller
(measured here: a batch of 10 over a limit of 8 drained at 77 jobs/s, a batch of 8 at
1,124).

    python peer_pgqueuer.py setup URL N              schema, then N jobs enqueued
    python peer_pgqueuer.py work URL CONCURRENCY     one worker drains them; prints
                                                     {"seconds": ...} as JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import asyncpg  # type: ignore[import-not-found]  # the peers' virtualenv only
from pgqueuer import AsyncpgDriver, Queries, QueueManager  # type: ignore[import-not-found]
from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found]

ENTRYPOINT = "noop"
ENQUEUE_BATCH = 1000
DEFAULT_BATCH = 10
"""QueueManager.run's default batch_size."""


async def setup(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for start in range(0, jobs, ENQUEUE_BATCH):
            n = min(jobs, start + ENQUEUE_BATCH) - start
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
    finally:
        await conn.close()
    print(json.dumps({"enqueued": jobs}))


async def work(url: str, concurrency: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint(ENTRYPOINT, concurrency_limit=concurrency)  # type: ignore[untyped-decorator]
        async def noop(job: Any) -> None:
            return None

        start = time.perf_counter()
        # drain: the worker returns once the queue is empty and its tasks have finished.
        await manager.run(mode=QueueExecutionMode.drain,
                          batch_size=min(DEFAULT_BATCH, concurrency))
        seconds = time.perf_counter() - start
    finally:
        await conn.close()
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "setup":
        asyncio.run(setup(url, int(sys.argv[3])))
    elif mode == "work":
        asyncio.run(work(url, int(sys.argv[3])))
    else:
        raise SystemExit(f"unknown mode {mode!r}: setup or work")
