"""Keeps the planner's statistics of tock_jobs from lagging far behind the table: every
`interval_seconds`, an ANALYZE if the table was never analyzed or grew tenfold since
(shared/store/statistics_store.py says why autovacuum alone leaves a gap). A burst into a
fresh or long-quiet table is planned from true statistics within seconds, not a minute."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from shared.core.errors import LockTimeout
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.statistics_store import StatisticsStore

log = logging.getLogger("tock.timer.statistics")

INTERVAL_SECONDS = 10.0


class Statistics(Loop):
    """One check per pass (a catalog read); `run_once` returns 1 if it analyzed."""

    name = "statistics"

    def __init__(self, store: StatisticsStore, interval_seconds: float = INTERVAL_SECONDS
                 ) -> None:
        super().__init__()
        self.store = store
        self.idle_seconds = interval_seconds

    def run_once(self, now: datetime | None = None) -> int:
        if not self.store.stale():
            return 0
        started = time.monotonic()
        try:
            analyzed = self.store.analyze()
        except LockTimeout:
            return 0  # an autovacuum holds the table: it is refreshing the statistics itself
        if analyzed:
            emit(log, "hot_table_analyzed", ms=round((time.monotonic() - started) * 1000, 1))
        # 0 either way: the next check waits the interval (a pass that did work would run
        # again at once).
        return 0
