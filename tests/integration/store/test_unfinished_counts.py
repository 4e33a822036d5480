"""Bounded counts of unfinished work (shared.store.counts_sql): each (queue, kind, state)
is counted up to a bound and estimated past it, the oldest waiting age stays exact, a rare
queue is never missed, tenants are sampled past the bound, limits' waiting counts stop at
it, and no statement reads the whole table. The bounds are lowered so that a few hundred
rows are "big"."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from shared.core.states import JobState
from shared.store import counts_sql, flow_sql
from shared.store.flow_store import FlowStore
from tests.integration.store.helpers import add_job, secs

BIG = 600
BOUND = 50


def _bulk(db: psycopg.Connection[Any], n: int, *, queue: str, kind: str, state: str,
          run_at: Any, tenant: str | None = None) -> None:
    db.execute(
        "INSERT INTO tock_jobs (kind, queue, state, run_at, tenant, payload) "
        "SELECT %s, %s, %s, %s::timestamptz + g * interval '1 millisecond', %s, '{}' "
        "FROM generate_series(1, %s) g", [kind, queue, state, run_at, tenant, n])


@pytest.fixture
def backlog(db, now):
    """BIG due and BIG later jobs of one pair, their oldest due 100 s ago; one rare
    dispatched job on its own queue; a few running ones."""
    _bulk(db, BIG, queue="default", kind="big", state="scheduled", run_at=now - secs(100),
          tenant="a")
    _bulk(db, BIG, queue="default", kind="big", state="scheduled", run_at=now + secs(3600),
          tenant="a")
    add_job(db, run_at=now - secs(7), queue="rare", kind="small", state="dispatched",
            tenant="b")
    for _ in range(3):
        add_job(db, run_at=now - secs(1), queue="default", kind="big", state="running",
                tenant="b")
    db.execute("ANALYZE tock_jobs")


def test_past_the_bound_counts_are_estimated_and_marked_and_the_oldest_age_is_exact(
        operator_store, backlog, now):
    found = operator_store.unfinished(now, exact_up_to=BOUND)
    big, rare = found.queues
    assert (big.queue, big.kind, rare.queue, rare.kind) == ("default", "big", "rare", "small")
    assert big.estimated and not rare.estimated
    # Estimated from the planner's statistics: more than the bound, near the truth.
    assert big.due > BOUND and BIG / 3 < big.due < BIG * 3
    assert big.future > BOUND and BIG / 3 < big.future < BIG * 3
    assert (big.running, big.dispatched) == (3, 0)  # below the bound: counted
    assert big.oldest_due_age_seconds == pytest.approx(100.0 - 0.001, abs=1e-6)
    assert (rare.due, rare.dispatched, rare.running, rare.future) == (0, 1, 0, 0)
    assert rare.oldest_due_age_seconds == pytest.approx(7.0)
    assert found.estimated == {"scheduled"}
    assert found.counts[("scheduled", "big")] == big.due + big.future
    assert found.counts[("running", "big")] == 3


def test_below_the_bound_everything_is_counted_exactly(operator_store, backlog, now):
    found = operator_store.unfinished(now, exact_up_to=10 * BIG)
    big = found.queues[0]
    assert (big.due, big.future, big.running, big.estimated) == (BIG, BIG, 3, False)
    assert found.estimated == set()
    assert found.counts == {("scheduled", "big"): 2 * BIG, ("running", "big"): 3,
                            ("dispatched", "small"): 1}


def test_tenants_past_the_bound_are_sampled_and_their_jobs_in_flight_counted(
        operator_store, backlog, now):
    # Half the waiting jobs: a sample of about half the table's pages (SYSTEM sampling
    # takes whole pages; with a smaller share, a table this small could yield none).
    sampled = {t.tenant: t for t in operator_store.tenant_stats(now, exact_up_to=BIG)}
    assert {t.estimated for t in sampled.values()} == {True}
    a, b = sampled["a"], sampled["b"]
    assert a.due + a.future > 0  # scaled up from the sample
    assert (b.dispatched, b.running, b.due, b.future) == (1, 3, 0, 0)  # always counted
    exact = {t.tenant: t for t in operator_store.tenant_stats(now, exact_up_to=10 * BIG)}
    assert (exact["a"].due, exact["a"].future, exact["a"].estimated) == (BIG, BIG, False)


def test_waiting_counts_of_limits_stop_at_the_bound(db, database, backlog, now):
    flow = FlowStore(database)
    flow.set_limit("kind", "big", max_running=5, rate_per_second=None, burst=None)
    flow.set_limit("tenant", "a", max_running=5, rate_per_second=None, burst=None)
    flow.set_limit("kind", "small", max_running=5, rate_per_second=None, burst=None)
    limits = {(lim.scope, lim.key): lim for lim in flow.limits(now=now, waiting_up_to=BOUND)}
    big, a, small = limits["kind", "big"], limits["tenant", "a"], limits["kind", "small"]
    assert (big.waiting, big.waiting_more, big.waiting_shown) == (BOUND, True, "more than 50")
    assert (a.waiting, a.waiting_more) == (BOUND, True)
    assert (small.waiting, small.waiting_more, small.waiting_shown) == (0, False, "0")
    exact = {(lim.scope, lim.key): lim.waiting for lim in flow.limits(now=now)}
    assert exact["kind", "big"] == exact["tenant", "a"] == BIG


def _plan_nodes(db: psycopg.Connection[Any], statement: str, params: dict[str, Any]
                ) -> list[dict[str, Any]]:
    with db.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
        plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    return nodes


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "no-statistics"])
def test_no_count_reads_the_whole_table(db, now, analyzed):
    # Enough rows for a sequential scan to be a real choice; with no statistics, the
    # planner guesses from defaults (the state of a table no ANALYZE has seen yet).
    _bulk(db, 20_000, queue="default", kind="big", state="scheduled", run_at=now - secs(5),
          tenant="a")
    _bulk(db, 200, queue="default", kind="big", state="dispatched", run_at=now - secs(5))
    if analyzed:
        db.execute("ANALYZE tock_jobs")
    params = {"now": now, "bound": 10_000, "scope": None, "key": None, "percent": 1.0,
              "scale": 100.0}
    sampled = counts_sql.tenant_stats(sampled=True).as_string(db)
    for statement in (counts_sql.GROUP_COUNTS, counts_sql.WAITING_UP_TO, flow_sql.LIMITS,
                      sampled):
        scans = [n for n in _plan_nodes(db, statement, params)
                 if n.get("Relation Name") == "tock_jobs"]
        seq = [n for n in scans if n["Node Type"] == "Seq Scan"]
        assert scans and not seq, (statement, seq)


def test_a_pair_whose_jobs_all_finished_is_left_out(operator_store, db, now):
    add_job(db, run_at=now - timedelta(seconds=5), queue="old", kind="k", state="succeeded")
    add_job(db, run_at=now - timedelta(seconds=5), queue="q", kind="k", state="running")
    found = operator_store.unfinished(now)
    assert [(q.queue, q.kind) for q in found.queues] == [("q", "k")]
    assert found.counts == {(JobState.RUNNING.value, "k"): 1}
