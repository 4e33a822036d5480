"""Upgrading a database from the 0013 schema: migration 0014 rebuilds tock_jobs_fair_idx
with the queue after the kind, and the due jobs already there are walked and claimed by
(kind, queue) lane."""

from __future__ import annotations

import psycopg

from shared.store import Database
from shared.store.flow_store import FlowStore
from shared.store.migrate import available, migrate
from tests.integration.store.helpers import add_job, secs
from tests.support.drive import db_now

BEFORE = "0013_cancelled_attempts.sql"


def test_0014_rebuilds_the_fair_index_by_queue_and_the_due_jobs_are_claimed_by_lane(old_url):
    with psycopg.connect(old_url, autocommit=True) as conn:
        now = db_now(conn)
        mail = add_job(conn, run_at=now - secs(40), queue="mail", kind="email", tenant="t")
        bulk = add_job(conn, run_at=now - secs(30), queue="bulk", kind="email", tenant="t")
        add_job(conn, run_at=now + secs(60), queue="mail", kind="email", state="retrying")
    names = [name for name, _ in available()]
    assert migrate(old_url) == names[names.index(BEFORE) + 1:]
    with psycopg.connect(old_url, autocommit=True) as conn:
        (definition,) = conn.execute("SELECT indexdef FROM pg_indexes "
                                     "WHERE indexname = 'tock_jobs_fair_idx'").fetchone()
    assert "(priority, kind, queue, COALESCE(tenant, ''::text), run_at DESC, id DESC)" \
        in definition, definition
    db = Database(old_url)
    try:
        flow = FlowStore(db)
        assert flow.due_pairs(0, 10, now=now) == [("email", "bulk", "t", 1),
                                                  ("email", "mail", "t", 1)]
        with flow.transaction() as tx:
            got = tx.claim_pairs(0, [("email", "mail", "t", 5)], now)
        assert [d.id for d in got] == [mail]
        with flow.transaction() as tx:
            got = tx.claim_pairs(0, [("email", "bulk", "t", 5)], now)
        assert [d.id for d in got] == [bulk]
    finally:
        db.close()
