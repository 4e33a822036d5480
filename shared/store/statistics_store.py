"""The planner's statistics of the hot table: whether they lag far behind it, and an
ANALYZE when they do (the timer's `statistics` loop, timer_service/statistics.py).

Autovacuum analyzes tock_jobs once a tenth of it changed, but looks only once a minute
(autovacuum_naptime), and a table it never analyzed is planned from default selectivities.
Planned so, the timer's walk of the due (kind, tenant) pairs sorts every due row of a level
instead of probing tock_jobs_fair_idx: 15 ms a pass at 30,000 due rows, against 0.1 ms.
"""

from __future__ import annotations

from shared.store.base import Store

ANALYZE_LOCK = 0x746F636B61  # "tocka": one timer analyzes at a time
ANALYZE_LOCK_TIMEOUT_MS = 1000

# (live rows, rows when last analyzed, -1 if never)
HOT_TABLE_SIZES = """
SELECT s.n_live_tup, c.reltuples
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'tock_jobs'::regclass
"""
TRY_ANALYZE_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s::int || 'ms', true)"
ANALYZE_HOT_TABLE = "ANALYZE tock_jobs"

MIN_ROWS = 1000
"""Below this many live rows a plan that reads them all costs nothing: never analyze."""
GROWTH = 10
"""Analyze once the table holds this many times the rows its statistics describe."""


class StatisticsStore(Store):
    """See the module docstring."""

    def stale(self) -> bool:
        """True if tock_jobs holds at least MIN_ROWS live rows and was never analyzed, or
        grew GROWTH-fold since it was."""
        row = self._one(HOT_TABLE_SIZES)
        if row is None:
            return False
        live, described = int(row[0] or 0), float(row[1])
        return live >= MIN_ROWS and live > GROWTH * max(described, 0.0)

    def analyze(self) -> bool:
        """ANALYZE tock_jobs, unless another timer is at it; False if it did not. Waits at
        most ANALYZE_LOCK_TIMEOUT_MS for the table's lock (an autovacuum may hold it):
        `LockTimeout` then, and the next pass tries again."""
        with self.transaction() as tx:
            row = tx._one(TRY_ANALYZE_LOCK, {"key": ANALYZE_LOCK})
            if not (row and row[0]):
                return False
            tx._run(SET_LOCK_TIMEOUT, {"ms": ANALYZE_LOCK_TIMEOUT_MS})
            tx._run(ANALYZE_HOT_TABLE)
        return True
