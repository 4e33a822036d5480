"""Conformance of `JobStore`'s fair-share statements against the real Postgres: due_levels,
due_tenants (the loose scan of tenants with due work), claim_tenants (each tenant's oldest
jobs up to its quota) and the tenant weights. Time is pinned through `now=`."""

from __future__ import annotations

import pytest

from shared.core.errors import DataRejected
from shared.store import JobStore, jobs_sql
from tests.integration.store.helpers import add_job, secs


def _bulk(db, n: int, *, now, tenant: str | None, priority: int = 0,
          state: str = "scheduled", age: float = 60) -> None:
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, tenant, priority)
        SELECT 'k', %s, %s - make_interval(secs => %s + g * 0.001), '{}', %s, %s
        FROM generate_series(1, %s) g
    """, (state, now, age, tenant, priority, n))


def test_due_levels_lists_the_levels_with_due_work_highest_first(job_store, db, now):
    add_job(db, run_at=now - secs(5), priority=2)
    add_job(db, run_at=now - secs(5), priority=7)
    add_job(db, run_at=now + secs(60), priority=9)  # not due yet
    add_job(db, run_at=now - secs(5), priority=8, state="running")  # not waiting
    assert job_store.due_levels(now) == [7, 2]
    assert job_store.due_levels(now + secs(60)) == [9, 7, 2]


def test_due_tenants_walks_tenant_keys_in_order_with_weights(job_store, db, now):
    for tenant in ["c", "a", None, "b", "a"]:
        add_job(db, run_at=now - secs(5), tenant=tenant)
    add_job(db, run_at=now + secs(60), tenant="d")  # has waiting work, none due yet
    add_job(db, run_at=now - secs(5), tenant="e", priority=3)  # another level
    job_store.set_tenant_weight("b", 4)
    assert job_store.due_tenants(0, 10, now=now) == [("", 1), ("a", 1), ("b", 4), ("c", 1)]
    assert job_store.due_tenants(0, 2, now=now) == [("", 1), ("a", 1)]
    assert job_store.due_tenants(0, 10, after="a", now=now) == [("b", 4), ("c", 1)]
    assert job_store.due_tenants(0, 10, after="c", now=now) == []
    assert job_store.due_tenants(0, 10, now=now + secs(60))[-1] == ("d", 1)
    assert job_store.due_tenants(3, 10, now=now) == [("e", 1)]


def test_claim_tenants_takes_each_tenants_oldest_up_to_its_quota(job_store, db, now):
    a_old = add_job(db, run_at=now - secs(30), tenant="a")
    a_new = add_job(db, run_at=now - secs(10), tenant="a")
    a_newest = add_job(db, run_at=now - secs(5), tenant="a")
    none_job = add_job(db, run_at=now - secs(20))
    b_job = add_job(db, run_at=now - secs(1), tenant="b")
    add_job(db, run_at=now - secs(1), tenant="b", priority=5)  # another level
    with job_store.transaction() as tx:
        got = tx.claim_tenants(0, [("a", 2), ("", 5), ("b", 1)], now)
    assert sorted((d.tenant_key, d.id) for d in got) == sorted(
        [("a", a_old), ("a", a_new), ("", none_job), ("b", b_job)])
    assert all(d.token for d in got)
    states = dict(db.execute("SELECT id, state FROM tock_jobs").fetchall())
    assert states[a_newest] == "scheduled" and states[a_old] == "dispatched"


def test_claim_tenants_skips_rows_another_transaction_holds(job_store, db, other, now):
    held = add_job(db, run_at=now - secs(30), tenant="a")
    free = add_job(db, run_at=now - secs(10), tenant="a")
    other.execute("BEGIN")
    other.execute("SELECT 1 FROM tock_jobs WHERE id = %s FOR UPDATE", (held,))
    try:
        with job_store.transaction() as tx:
            assert [d.id for d in tx.claim_tenants(0, [("a", 5)], now)] == [free]
    finally:
        other.execute("ROLLBACK")


def test_tenant_weights_set_replace_and_reset(job_store):
    job_store.set_tenant_weight("acme", 5)
    job_store.set_tenant_weight("acme", 7)
    job_store.set_tenant_weight("", 2)
    assert job_store.tenant_weights() == {"": 2, "acme": 7}
    assert job_store.reset_tenant_weight("acme") is True
    assert job_store.reset_tenant_weight("acme") is False
    assert job_store.tenant_weights() == {"": 2}


@pytest.mark.parametrize("weight", [0, 1001])
def test_tenant_weight_out_of_range_is_refused_by_the_schema(job_store, weight):
    with pytest.raises(DataRejected):
        job_store.set_tenant_weight("acme", weight)


def test_the_tenant_walk_uses_the_fair_index_not_a_scan(job_store, db, now):
    """With many rows of one tenant, finding the tenants stays a handful of index probes."""
    _bulk(db, 20_000, now=now, tenant="big")
    _bulk(db, 3, now=now, tenant="small")
    db.execute("ANALYZE tock_jobs")
    plan = "\n".join(r[0] for r in db.execute(
        "EXPLAIN (ANALYZE, FORMAT TEXT) " + jobs_sql.DUE_TENANTS_FROM.replace(
            "%(level)s", "0").replace("%(after)s", "''").replace("%(limit)s", "10")
        .replace("%(now)s", "now()")))
    assert "tock_jobs_fair_idx" in plan
    assert "Seq Scan on tock_jobs" not in plan
    assert JobStore.on(db).due_tenants(0, 10, now=now) == [("big", 1), ("small", 1)]
    claim_plan = "\n".join(r[0] for r in db.execute(
        "EXPLAIN " + jobs_sql.CLAIM_TENANTS.replace("%(level)s", "0")
        .replace("%(tenants)s", "'{big,small}'").replace("%(quotas)s", "'{5,5}'")
        .replace("%(now)s", "now()")))
    assert "tock_jobs_fair_idx" in claim_plan, claim_plan
