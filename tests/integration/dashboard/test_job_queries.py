"""The operator queries (shared.store.operator_store, shared.ops.jobs) at a size where plans
matter: the listing must walk an index in id order (keyset), never scan a table that holds
rows (the hot table, or the history's day partitions), and bulk actions must cross
batches."""

from __future__ import annotations

import re

import pytest

from shared.core.errors import InvalidInput
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


@pytest.fixture
def big_history(db):
    # The same, moved to the history: spread over the day partitions of three days.
    db.execute(f"""
        INSERT INTO tock_history_jobs (id, kind, queue, payload, priority, state, run_at,
                                       attempt, tenant, created_at, updated_at, finished_at,
                                       dispatch_failures, lease_detached)
        SELECT nextval(pg_get_serial_sequence('tock_jobs', 'id')), 'kind' || (g % 20),
               'q' || (g % 5), '{{}}', 0,
               CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END::tock_job_state,
               now(), 1, CASE WHEN g % 3 = 0 THEN 't' || (g % 50) END, now(), now(),
               now() + (g % 3) * interval '1 day', 0, false
        FROM generate_series(1, {ROWS}) g""")
    db.execute("ANALYZE tock_history_jobs")
    return db


def plan(db, where: JobFilter, before_id: int | None = None) -> str:
    """The plan of the listing statement the store runs (shared.store.operator_sql)."""
    from psycopg import sql as pgsql

    clause, params = operator_sql.where(where)
    params.update(limit=51, before_id=before_id)
    statement = pgsql.SQL("EXPLAIN ") + operator_sql.list_jobs(
        clause, with_cursor=before_id is not None)
    return "\n".join(r[0] for r in db.execute(statement, params))


def scanned_tables_with_rows(db, text: str) -> list[str]:
    """Relations the plan reads whole although they hold rows."""
    names = re.findall(r"Seq Scan on (\w+)", text)
    return [n for n in names if db.execute(
        "SELECT reltuples FROM pg_class WHERE relname = %s", (n,)).fetchone()[0] > 100]


@pytest.mark.parametrize("where", [
    JobFilter(),
    JobFilter.of(states="dead"),
    JobFilter.of(kind="kind7"),
    JobFilter.of(queue="q3"),
    JobFilter.of(tenant="t9"),
], ids=["all", "state", "kind", "queue", "tenant"])
@pytest.mark.parametrize("side", ["big", "big_history"])
def test_listing_walks_an_index_never_the_table(request, side, where):
    db = request.getfixturevalue(side)
    for before in (None, ROWS // 2):
        text = plan(db, where, before)
        assert "Index" in text and not scanned_tables_with_rows(db, text), text


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
    with pytest.raises(InvalidInput, match="cancel applies to scheduled, retrying, dispatched "
                                           "and running jobs only; the filter asks for dead"):
        job_queries.plan_bulk(operator_store, "cancel", JobFilter.of(states="dead"))


def test_a_dry_run_over_more_than_its_cap_says_more_than(big, operator_store):
    where = JobFilter.of(states="dead", queue="q0")
    exact = job_queries.plan_bulk(operator_store, "retry", where)
    capped = job_queries.plan_bulk(operator_store, "retry", where, cap=100)
    assert (capped.count, capped.more, capped.up_to_id) == (100, True, exact.up_to_id)
    assert capped.shown == "more than 100" and not exact.more
    assert exact.shown == str(exact.count)
