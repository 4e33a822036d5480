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
from shared.store.statistics_store import VACUUM_TIMEOUT_MS, StatisticsStore

log = logging.getLogger("tock.timer.statistics")

INTERVAL_SECONDS = 2.0
"""A pass is two catalog reads. Checked every 10 s, a table churning 600 dead rows a second
(200 jobs/s) reached up to 17,000 dead rows before its vacuum, and its indexes, which never
shrink, grew to hold each new peak; every 2 s the peak stays near the threshold."""
MAX_BACKOFF_PASSES = 150
"""A vacuum that removes little is not tried again for up to this many passes (5 minutes
at the default interval)."""


class Statistics(Loop):
    """One check per pass (a catalog read); `run_once` returns 1 if it analyzed."""

    name = "statistics"
    # A VACUUM of a large hot table may rightly run up to its statement timeout: only a
    # pass past that is a stall (a server that hangs without answering).
    stall_log_seconds = VACUUM_TIMEOUT_MS / 1000 + 10

    def __init__(self, store: StatisticsStore, interval_seconds: float = INTERVAL_SECONDS,
                 vacuum_dead_rows: int = 10_000) -> None:
        super().__init__()
        self.store = store
        self.idle_seconds = interval_seconds
        self.vacuum_dead_rows = vacuum_dead_rows
        """0: leave vacuuming to autovacuum."""
        self._not_owner_logged = False
        self._backoff = 0
        self._skip_passes = 0

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
        if self._skip_passes:
            self._skip_passes -= 1
            return
        started = time.monotonic()
        self.store.vacuum()
        left, _, _ = self.store.dead_rows()
        emit(log, "hot_table_vacuumed", logging.DEBUG, dead_rows=dead, live_rows=live,
             left=left, ms=round((time.monotonic() - started) * 1000, 1))
        if left * 2 >= dead:
            # Vacuum could not remove most of them: a transaction somewhere still sees them
            # (a long report, a forgotten session). Vacuuming again every pass would only
            # re-read the table; back off, doubling, until one does its job.
            self._backoff = min(max(self._backoff * 2, 1), MAX_BACKOFF_PASSES)
            self._skip_passes = self._backoff
            emit(log, "hot_table_vacuum_blocked", logging.WARNING, dead_rows=dead, left=left,
                 next_try_seconds=round(self._skip_passes * self.idle_seconds),
                 detail="an open transaction keeps the dead rows of tock_jobs alive; find it "
                        "in pg_stat_activity (oldest xact_start) and end it")
        else:
            self._backoff = 0
