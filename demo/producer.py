"""`python -m demo.producer`: enqueue a mix of demo jobs continuously until SIGTERM."""

from __future__ import annotations

import logging
import random
import sys

from shared.client import Client
from shared.core.errors import TockError
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import configure, emit
from shared.runtime.settings import ClientSettings

log = logging.getLogger("tock.demo")

MIX = [("email", 6), ("flaky", 2), ("slow", 1), ("crash", 1), ("sync", 2)]
ACCOUNTS = ["account-1", "account-2", "account-3"]


def main() -> int:
    settings = ClientSettings.load()
    configure(settings.log_format, settings.log_level, "producer")
    stop = StopFlag()
    stop.install_signal_handlers()
    kinds = [k for k, weight in MIX for _ in range(weight)]
    with Client(settings) as client:
        # Declared at every start: an unchanged definition is a no-op (upsert by name).
        client.recurring("demo-report", "report", {"demo": True}, every=15)
        # One sync at a time per account: the rest wait in Postgres (`tock limits`).
        client.set_limit("kind_key", "sync", max_running=1)
        while not stop.wait(random.uniform(0.5, 1.5)):
            kind = random.choice(kinds)
            delay = random.choice([0, 0, 0, 2, 5])
            account = random.choice(ACCOUNTS) if kind == "sync" else None
            try:
                job = client.schedule(kind, {"demo": True}, delay=delay,
                                      concurrency_key=account)
            except TockError as exc:
                emit(log, "enqueue_failed", logging.ERROR, error=str(exc))
                continue
            emit(log, "job_enqueued", job_id=job.id, kind=kind, delay_s=delay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
