"""The timer's statistics loop against a real Postgres: a hot table that was never analyzed
(or grew tenfold since) is analyzed, and the timer's walk is then planned on
tock_jobs_fair_idx; one timer analyzes at a time; a fresh table is left alone."""

from __future__ import annotations

from typing import Any

import psycopg

from shared.store.database import Database
from shared.store.flow_sql import DUE_PAIRS_FROM
from shared.store.statistics_store import ANALYZE_LOCK, StatisticsStore
from timer_service.statistics import Statistics


def _no_autovacuum(db: Any) -> None:
    """This test's database is its own: autovacuum must not analyze behind its back."""
    db.execute("ALTER TABLE tock_jobs SET (autovacuum_enabled = false)")


def _insert_due(db: Any, n: int) -> None:
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload)
                  SELECT 'k', now() - interval '1 minute', '{}' FROM generate_series(1, %s)""",
               (n,))
    db.execute("SELECT pg_stat_force_next_flush()")


def _analyzed(db: Any) -> float:
    row = db.execute("SELECT reltuples FROM pg_class WHERE oid = 'tock_jobs'::regclass"
                     ).fetchone()
    return float(row[0])


def _walk_plan(db: Any) -> str:
    walk = DUE_PAIRS_FROM
    for name, value in {"level": "0", "after": "''", "per_kind": "10", "now": "now()",
                        "skip_kinds": "'{}'", "skip_tenants": "'{}'",
                        "skip_lane_kinds": "'{}'", "skip_lane_queues": "'{}'"}.items():
        walk = walk.replace(f"%({name})s", value)
    return "\n".join(r[0] for r in db.execute("EXPLAIN " + walk))


def test_a_never_analyzed_hot_table_is_analyzed_and_the_walk_then_probes_the_fair_index(
        database: Database, db):
    _no_autovacuum(db)
    loop = Statistics(StatisticsStore(database))
    _insert_due(db, 500)
    assert loop.run_once() == 0 and _analyzed(db) < 0, "a small table is left alone"
    _insert_due(db, 20_000)
    loop.run_once()
    assert _analyzed(db) > 20_000
    plan = _walk_plan(db)
    assert "tock_jobs_fair_idx" in plan, plan
    assert not any(line.strip().startswith("Sort Key: j") for line in plan.splitlines()), \
        "no step of the walk sorts rows of tock_jobs (only the result is sorted)"
    # Statistics that describe the table are left alone; a tenfold growth is analyzed.
    assert not StatisticsStore(database).stale()
    _insert_due(db, 205_000)
    assert StatisticsStore(database).stale()
    loop.run_once()
    assert _analyzed(db) > 200_000


def test_one_timer_analyzes_at_a_time(database: Database, db, database_url: str):
    _no_autovacuum(db)
    _insert_due(db, 2_000)
    store = StatisticsStore(database)
    with psycopg.connect(database_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (ANALYZE_LOCK,))
        assert store.analyze() is False
        assert _analyzed(db) < 0
    assert store.analyze() is True
    assert _analyzed(db) > 1_000


def _churn(db: Any, n: int) -> None:
    """`n` jobs that came and went: `n` dead rows, none live."""
    _insert_due(db, n)
    db.execute("DELETE FROM tock_jobs")
    db.execute("SELECT pg_stat_force_next_flush()")


def _dead_and_vacuumed(db: Any) -> tuple[int, bool]:
    row = db.execute("SELECT n_dead_tup, last_vacuum IS NOT NULL FROM pg_stat_user_tables "
                     "WHERE relid = 'tock_jobs'::regclass").fetchone()
    return int(row[0]), bool(row[1])


def test_a_hot_table_full_of_dead_rows_is_vacuumed_without_waiting_for_autovacuum(
        database: Database, db):
    _no_autovacuum(db)
    loop = Statistics(StatisticsStore(database), vacuum_dead_rows=5_000)
    _churn(db, 3_000)
    loop.run_once()
    assert _dead_and_vacuumed(db) == (3_000, False), "under the threshold: left alone"
    _churn(db, 3_000)
    _insert_due(db, 100)  # a few live rows: still far fewer than the dead ones
    loop.run_once()
    dead, vacuumed = _dead_and_vacuumed(db)
    assert vacuumed and dead == 0


def test_dead_rows_fewer_than_live_ones_are_left_to_autovacuum(database: Database, db):
    _no_autovacuum(db)
    _insert_due(db, 9_000)
    db.execute("DELETE FROM tock_jobs WHERE id % 3 = 0")
    db.execute("SELECT pg_stat_force_next_flush()")
    Statistics(StatisticsStore(database), vacuum_dead_rows=1_000).run_once()
    assert _dead_and_vacuumed(db) == (3_000, False)


def test_a_timer_that_may_not_vacuum_says_so_once_and_goes_on(db, database_url: str, caplog):
    _no_autovacuum(db)
    _churn(db, 6_000)
    role = "tock_not_owner"
    db.execute(f"DROP ROLE IF EXISTS {role}")
    db.execute(f"CREATE ROLE {role} LOGIN")
    url = database_url.replace("postgres@", f"{role}@", 1)
    other = Database(url, max_size=1, name="not-owner")
    try:
        loop = Statistics(StatisticsStore(other), vacuum_dead_rows=5_000)
        with caplog.at_level("WARNING", logger="tock.timer.statistics"):
            loop.run_once()
            loop.run_once()
        skipped = [r for r in caplog.records if getattr(r, "event", "") ==
                   "hot_table_vacuum_skipped"]
        assert len(skipped) == 1
        assert _dead_and_vacuumed(db) == (6_000, False)
    finally:
        other.close()
        db.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_vacuum_an_open_transaction_defeats_backs_off_and_says_why(
        database: Database, db, database_url: str, caplog):
    _no_autovacuum(db)
    loop = Statistics(StatisticsStore(database), vacuum_dead_rows=5_000)
    with psycopg.connect(database_url) as blocker:
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute("SELECT count(*) FROM tock_workers")  # holds its snapshot
        _churn(db, 6_000)
        with caplog.at_level("WARNING", logger="tock.timer.statistics"):
            loop.run_once()
        blocked = [r for r in caplog.records if getattr(r, "event", "") ==
                   "hot_table_vacuum_blocked"]
        assert len(blocked) == 1 and "pg_stat_activity" in blocked[0].fields["detail"]
        assert _dead_and_vacuumed(db) == (6_000, True), "tried, and could remove nothing"
        blocker.rollback()
    vacuums = _vacuum_count(db)
    loop.run_once()  # backing off: not tried this pass
    assert _vacuum_count(db) == vacuums
    loop.run_once()  # tried again, and now it works
    assert _vacuum_count(db) == vacuums + 1 and _dead_and_vacuumed(db)[0] == 0


def _vacuum_count(db: Any) -> int:
    row = db.execute("SELECT vacuum_count FROM pg_stat_user_tables "
                     "WHERE relid = 'tock_jobs'::regclass").fetchone()
    return int(row[0])
