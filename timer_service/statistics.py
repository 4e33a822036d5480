"""Looks after tock_jobs between autovacuum's visits (shared/store/statistics_store.py says
why they leave gaps). Every `interval_seconds`: an ANALYZE if the table was never analyzed
or grew tenfold since, so a burst into a fresh or long-quiet table is planned from true
statistics within seconds, not a minute; and a VACUUM once its dead rows pass
`vacuum_dead_rows` and outnumber its live ones, so a busy hot table stays the size of the
work in it instead of a minute of churn."""

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

    def __init__(self, store: StatisticsStore, interval_seconds: float = INTERVAL_SECONDS,
                 vacuum_dead_rows: int = 10_000) -> None:
        super().__init__()
        self.store = store
        self.idle_seconds = interval_seconds
        self.vacuum_dead_rows = vacuum_dead_rows
        """0: leave vacuuming to autovacuum."""
        self._not_owner_logged = False

    def run_once(self, now: datetime | None = None) -> int:
        # 0 whatever was done: the next check waits the interval (a pass that did work
        # would run again at once).
        self._analyze()
        if self.vacuum_dead_rows:
            self._vacuum()
        return 0

    def _analyze(self) -> None:
        if not self.store.stale():
            return
        started = time.monotonic()
        try:
            analyzed = self.store.analyze()
        except LockTimeout:
            return  # an autovacuum holds the table: it is refreshing the statistics itself
        if analyzed:
            emit(log, "hot_table_analyzed", ms=round((time.monotonic() - started) * 1000, 1))

    def _vacuum(self) -> None:
        dead, live, may = self.store.dead_rows()
        if dead < self.vacuum_dead_rows or dead < live:
            return
        if not may:
            if not self._not_owner_logged:
                self._not_owner_logged = True
                emit(log, "hot_table_vacuum_skipped", logging.WARNING, dead_rows=dead,
                     detail="the timer's role does not own tock_jobs, so it cannot vacuum "
                            "it; autovacuum still does, once a minute at most")
            return
        started = time.monotonic()
        self.store.vacuum()
        emit(log, "hot_table_vacuumed", logging.DEBUG, dead_rows=dead, live_rows=live,
             ms=round((time.monotonic() - started) * 1000, 1))
