"""The operator queries (shared.store.operator_store, shared.ops.jobs) at a size where plans
matter: the listing must walk an index in id order (keyset), never scan the table, and bulk
actions must cross batches."""

from __future__ import annotations

import pytest

from shared.core.filters import JobFilter
from shared.ops import jobs as job_queries
from shared.store import operator_sql

ROWS = 60_000


@pytest.fixture
def big(db):
    # 60k jobs across kinds, queues, tenants and states, as in a busy cluster's history.
    db.execute(f"""
        INSERT INTO tock_jobs (kind, queue, tenant, state, run_at, finished_at)
        SELECT 'kind' || (g % 20), 'q' || (g % 5), CASE WHEN g % 3 = 0 THEN 't' || (g % 50) END,
               CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END::tock_job_state,
               now(), now()
        FROM generate_series(1, {ROWS}) g""")
    db.execute("ANALYZE tock_jobs")
    return db


def plan(db, where: JobFilter, before_id: int | None = None) -> str:
    from psycopg import sql as pgsql

    clause, params = operator_sql.where(where)
    if before_id is not None:
        clause = pgsql.SQL("{} AND id < %(before_id)s").format(clause)
        params["before_id"] = before_id
    statement = pgsql.SQL("EXPLAIN SELECT id FROM tock_jobs WHERE {} ORDER BY id DESC "
                          "LIMIT 51").format(clause)
    return "\n".join(r[0] for r in db.execute(statement, params))


@pytest.mark.parametrize("where", [
    JobFilter(),
    JobFilter.of(states="dead"),
    JobFilter.of(kind="kind7"),
    JobFilter.of(queue="q3"),
    JobFilter.of(tenant="t9"),
], ids=["all", "state", "kind", "queue", "tenant"])
def test_listing_walks_an_index_never_the_table(big, where):
    for before in (None, ROWS // 2):
        text = plan(big, where, before)
        assert "Index" in text and "Seq Scan" not in text, text


def test_pages_cover_every_match_once(big, operator_store):
    seen, cursor = [], None
    while True:
        page = job_queries.list_jobs(operator_store, JobFilter.of(states="dead"), limit=250,
                                     before_id=cursor)
        seen += [j.id for j in page.jobs]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == ROWS // 100 == len(set(seen))
    assert seen == sorted(seen, reverse=True)


def test_bulk_retry_crosses_batches_and_stops_at_up_to_id(big, operator_store):
    where = JobFilter.of(states="dead", queue="q0")
    plan_ = job_queries.plan_bulk(operator_store, "retry", where)
    assert plan_.count == ROWS // 100
    cutoff = plan_.up_to_id - 5000
    expected = big.execute("SELECT count(*) FROM tock_jobs WHERE state = 'dead' AND "
                           "queue = 'q0' AND id <= %s", (cutoff,)).fetchone()[0]
    done = job_queries.run_bulk(operator_store, "retry", where, up_to_id=cutoff, batch_size=7)
    assert done == expected
    left = big.execute("SELECT min(id) FROM tock_jobs WHERE state = 'dead'").fetchone()[0]
    assert left > cutoff
    assert job_queries.plan_bulk(operator_store, "cancel", JobFilter.of(states="dead")).count == 0
