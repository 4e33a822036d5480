"""Upgrading a database from the 0010 schema: migration 0011 indexes the unfinished jobs
already there for the bounded counts, and the counts read them as before."""

from __future__ import annotations

import psycopg

from shared.core.reports import QueueKindStats
from shared.store import Database, OperatorStore
from shared.store.migrate import available, migrate
from tests.integration.store.helpers import add_job, secs
from tests.support.drive import db_now

BEFORE = "0010_newest_first_fair_index.sql"



def test_0011_indexes_the_jobs_already_there_and_counts_them(old_url):
    with psycopg.connect(old_url, autocommit=True) as conn:
        now = db_now(conn)
        add_job(conn, run_at=now - secs(40), queue="mail", kind="email")
        add_job(conn, run_at=now + secs(60), queue="mail", kind="email", state="retrying")
        add_job(conn, run_at=now - secs(5), queue="mail", kind="email", state="dispatched")
    names = [name for name, _ in available()]
    assert migrate(old_url) == names[names.index(BEFORE) + 1:]
    with psycopg.connect(old_url, autocommit=True) as conn:
        made = conn.execute(
            "SELECT (SELECT count(*) FROM pg_indexes WHERE indexname = 'tock_jobs_group_idx'),"
            " (SELECT count(*) FROM pg_statistic_ext WHERE stxname = 'tock_jobs_group_stats')"
        ).fetchone()
    assert made == (1, 1)
    db = Database(old_url)
    try:
        found = OperatorStore(db).unfinished(now)
    finally:
        db.close()
    assert found.queues == [QueueKindStats("mail", "email", due=1, dispatched=1, running=0,
                                           future=1, oldest_due_age_seconds=40.0)]
    assert found.counts == {("scheduled", "email"): 1, ("retrying", "email"): 1,
                            ("dispatched", "email"): 1}
