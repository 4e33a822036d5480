"""The hot table's upkeep between autovacuum's visits (the timer's `statistics` loop,
timer_service/statistics.py): an ANALYZE when the planner's statistics lag far behind the
table, and a VACUUM when its dead rows outnumber what it holds.

Autovacuum looks at a database once a minute (autovacuum_naptime). For the statistics: a
table it never analyzed is planned from default selectivities, and planned so, the timer's
walk of the due (kind, tenant) pairs sorts every due row of a level instead of probing
tock_jobs_fair_idx: 15 ms a pass at 30,000 due rows, against 0.1 ms. For dead rows: every
job leaves three in tock_jobs (two claims and the move to the history), so at 200 jobs/s a
minute leaves 36,000 dead rows and their index entries beside a few hundred live ones
(measured: the table and its indexes grew from 1.6 to 8 MB holding 200 rows, and the
claim's probes step over the dead entries until vacuum). The hot table holds only
unfinished work, so vacuuming it takes milliseconds.
"""

from __future__ import annotations

import psycopg

from shared.store.base import Store
from shared.store.database import LINK_OPTIONS
from shared.store.errors import translated

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

# (dead rows, live rows, may this role vacuum it)
HOT_TABLE_DEAD = """
SELECT s.n_dead_tup, s.n_live_tup, pg_has_role(c.relowner, 'USAGE')
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'tock_jobs'::regclass
"""
# SKIP_LOCKED: another timer's vacuum or an autovacuum at it already: nothing to wait for.
VACUUM_HOT_TABLE = "VACUUM (SKIP_LOCKED) tock_jobs"
VACUUM_TIMEOUT_MS = 60_000

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

    def dead_rows(self) -> tuple[int, int, bool]:
        """(dead rows, live rows, whether this role owns tock_jobs and so may vacuum it),
        from the statistics Postgres keeps as rows change."""
        row = self._one(HOT_TABLE_DEAD)
        if row is None:
            return 0, 0, False
        return int(row[0] or 0), int(row[1] or 0), bool(row[2])

    def vacuum(self) -> None:
        """VACUUM tock_jobs, on a connection of its own (VACUUM runs outside a transaction,
        and a pooled connection would be held for its duration); skipped at once if the
        table is being vacuumed already."""
        assert self._db is not None, "vacuum needs a Database, not a caller's connection"
        # The pool's link options (a vanished server is noticed within seconds) and a
        # statement timeout: a pass never hangs past the loop's bound.
        with translated(), psycopg.connect(self._db.url, autocommit=True,
                                           application_name="tock-vacuum",
                                           options=f"-c statement_timeout={VACUUM_TIMEOUT_MS}",
                                           **LINK_OPTIONS) as conn:
            conn.execute(VACUUM_HOT_TABLE)

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
