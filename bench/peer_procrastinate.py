"""Run by the peers' virtualenv's Python (bench.peers), not by tock's: Procrastinate's side
of the peer comparison, with its defaults and an async no-op task.

    python peer_procrastinate.py setup URL N              schema, then N jobs deferred
    python peer_procrastinate.py work URL CONCURRENCY     one worker drains them; prints
                                                          {"seconds": ...} as JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import procrastinate  # type: ignore[import-not-found]  # the peers' virtualenv only

QUEUE = "bench"
DEFER_BATCH = 1000


def _app(url: str) -> tuple[Any, Any]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue=QUEUE)  # type: ignore[untyped-decorator]
    async def noop(n: int) -> None:
        return None

    return app, noop


async def setup(url: str, jobs: int) -> None:
    app, noop = _app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, DEFER_BATCH):
            await noop.batch_defer_async(
                *({"n": n} for n in range(start, min(jobs, start + DEFER_BATCH))))
    print(json.dumps({"deferred": jobs}))


async def work(url: str, concurrency: int) -> None:
    app, _ = _app(url)
    async with app.open_async():
        start = time.perf_counter()
        # wait=False: the worker returns once it has caught up with the queue.
        await app.run_worker_async(queues=[QUEUE], concurrency=concurrency, wait=False,
                                   install_signal_handlers=False)
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "setup":
        asyncio.run(setup(url, int(sys.argv[3])))
    elif mode == "work":
        asyncio.run(work(url, int(sys.argv[3])))
    else:
        raise SystemExit(f"unknown mode {mode!r}: setup or work")
