"""Conformance of `FlowStore` (shared.store.flow_sql) against the real Postgres: the claim's
pieces (due_levels; due_pairs, the loose scan of (kind, queue, tenant) with due work;
claim_pairs), the limits' rooms with their locks and tokens, and the configuration
tables. Time is pinned through `now=`."""

from __future__ import annotations

import pytest

from shared.core.errors import DataRejected
from shared.store import flow_sql
from shared.store.database import Database
from shared.store.flow_store import FlowStore
from tests.integration.store.helpers import add_job, secs


@pytest.fixture
def flow(database: Database) -> FlowStore:
    return FlowStore(database)


def _bulk(db, n: int, *, now, tenant: str | None, kind: str = "k", priority: int = 0,
          state: str = "scheduled", age: float = 60) -> None:
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, tenant, priority)
        SELECT %s, %s, %s - make_interval(secs => %s + g * 0.001), '{}', %s, %s
        FROM generate_series(1, %s) g
    """, (kind, state, now, age, tenant, priority, n))


# --- the claim ---------------------------------------------------------------------------


def test_due_levels_lists_the_levels_with_due_work_highest_first(flow, db, now):
    add_job(db, run_at=now - secs(5), priority=2)
    add_job(db, run_at=now - secs(5), priority=7)
    add_job(db, run_at=now + secs(60), priority=9)  # not due yet
    add_job(db, run_at=now - secs(5), priority=8, state="running")  # not waiting
    assert flow.due_levels(now) == [7, 2]
    assert flow.due_levels(now + secs(60)) == [9, 7, 2]


def test_due_pairs_walks_kinds_then_tenants_in_key_order_with_weights(flow, db, now):
    for kind, tenant in [("b", "c"), ("a", "a"), ("a", None), ("b", "b"), ("a", "a")]:
        add_job(db, run_at=now - secs(5), kind=kind, tenant=tenant)
    add_job(db, run_at=now + secs(60), kind="a", tenant="d")  # waiting, not due yet
    add_job(db, run_at=now - secs(5), kind="a", tenant="e", priority=3)  # another level
    flow.set_tenant_weight("b", 4)
    d = "default"
    assert flow.due_pairs(0, 10, now=now) == [
        ("a", d, "", 1), ("a", d, "a", 1), ("b", d, "b", 4), ("b", d, "c", 1)]
    assert flow.due_pairs(0, 1, now=now) == [("a", d, "", 1), ("b", d, "b", 4)], "per lane"
    assert flow.due_pairs(0, 10, after="a", now=now) == [("b", d, "b", 4), ("b", d, "c", 1)]
    assert flow.due_pairs(0, 10, after="c", now=now) == []
    assert ("a", d, "d", 1) in flow.due_pairs(0, 10, now=now + secs(60))
    assert flow.due_pairs(3, 10, now=now) == [("a", d, "e", 1)]


def test_due_pairs_walks_each_kinds_queues_as_lanes_of_their_own(flow, db, now):
    for kind, queue in [("a", "q2"), ("a", "q1"), ("b", "q1"), ("a", "q2")]:
        add_job(db, run_at=now - secs(5), kind=kind, queue=queue, tenant="t")
    assert flow.due_pairs(0, 10, now=now) == [
        ("a", "q1", "t", 1), ("a", "q2", "t", 1), ("b", "q1", "t", 1)]
    assert flow.due_pairs(0, 10, skip_lanes=[("a", "q1")], now=now) == [
        ("a", "q2", "t", 1), ("b", "q1", "t", 1)], "a full lane; its kind's other goes on"
    with flow.transaction() as tx:
        got = tx.claim_pairs(0, [("a", "q2", "t", 5)], now)
    assert [d.queue for d in got] == ["q2", "q2"]


def test_due_pairs_leaves_out_the_kinds_and_tenants_at_their_limit(flow, db, now):
    for kind, tenant in [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]:
        add_job(db, run_at=now - secs(5), kind=kind, tenant=tenant)
    d = "default"
    assert flow.due_pairs(0, 10, skip_kinds=["a"], now=now) == [("b", d, "x", 1),
                                                                ("b", d, "y", 1)]
    assert flow.due_pairs(0, 10, skip_tenants=["x"], now=now) == [("a", d, "y", 1),
                                                                  ("b", d, "y", 1)]


def test_claim_pairs_takes_each_pairs_oldest_up_to_its_quota(flow, db, now):
    a_old = add_job(db, run_at=now - secs(30), tenant="a")
    a_new = add_job(db, run_at=now - secs(10), tenant="a")
    a_newest = add_job(db, run_at=now - secs(5), tenant="a")
    none_job = add_job(db, run_at=now - secs(20))
    b_job = add_job(db, run_at=now - secs(1), tenant="b", kind="other")
    add_job(db, run_at=now - secs(1), tenant="b", priority=5)  # another level
    with flow.transaction() as tx:
        got = tx.claim_pairs(0, [("k", "default", "a", 2), ("k", "default", "", 5),
                                 ("other", "default", "b", 1), ("k", "default", "b", 3),
                                 ("k", "elsewhere", "a", 3)], now)
    assert sorted((d.tenant_key, d.id) for d in got) == sorted(
        [("a", a_old), ("a", a_new), ("", none_job), ("b", b_job)])
    assert all(d.token for d in got)
    states = dict(db.execute("SELECT id, state FROM tock_jobs").fetchall())
    assert states[a_newest] == "scheduled" and states[a_old] == "dispatched"


def test_claim_pairs_skips_rows_another_transaction_holds(flow, db, other, now):
    held = add_job(db, run_at=now - secs(30), tenant="a")
    free = add_job(db, run_at=now - secs(10), tenant="a")
    other.execute("SELECT 1 FROM tock_jobs WHERE id = %s FOR UPDATE", (held,))
    with flow.transaction() as tx:
        assert [d.id for d in tx.claim_pairs(0, [("k", "default", "a", 5)], now)] == [free]


def test_the_walk_and_the_claim_use_the_fair_index_not_a_scan(flow, db, now):
    """With many rows of one tenant, finding the pairs stays a handful of index probes; and
    many dispatched rows of the kind (jobs in SQS) are not stepped over: the kinds' walk
    must not take tock_jobs_kind_idx, which holds them too (it did, and the walk took
    20 ms after 80,000 claims of a 1M backlog)."""
    _bulk(db, 40_000, now=now, tenant="big")
    _bulk(db, 3, now=now, tenant="small")
    _bulk(db, 3, now=now, tenant="small", kind="other")
    db.execute("ANALYZE tock_jobs")
    # Then half of big's are claimed (the statistics, as between two autovacuums, do not
    # know): they lead tock_jobs_kind_idx, in id order.
    db.execute("UPDATE tock_jobs SET state = 'dispatched' WHERE id IN ("
               "SELECT id FROM tock_jobs WHERE tenant = 'big' ORDER BY id LIMIT 20000)")
    params = {"level": "0", "after": "''", "per_kind": "10", "now": "now()",
              "skip_kinds": "'{}'", "skip_tenants": "'{}'", "skip_lane_kinds": "'{}'",
              "skip_lane_queues": "'{}'"}
    walk = flow_sql.DUE_PAIRS_FROM
    for name, value in params.items():
        walk = walk.replace(f"%({name})s", value)
    plan = "\n".join(r[0] for r in db.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + walk))
    assert "tock_jobs_fair_idx" in plan and "Seq Scan on tock_jobs" not in plan, plan
    assert "tock_jobs_kind_idx" not in plan, plan
    assert flow.due_pairs(0, 10, now=now) == [("k", "default", "big", 1),
                                              ("k", "default", "small", 1),
                                              ("other", "default", "small", 1)]
    claim = flow_sql.CLAIM_PAIRS
    for name, value in {"level": "0", "kinds": "'{k,k}'", "queues": "'{default,default}'",
                        "tenants": "'{big,small}'",
                        "quotas": "'{5,5}'", "unkeyed": "'{f,f}'", "now": "now()",
                        "floor_ats": "'{NULL,NULL}'", "floor_ids": "'{NULL,NULL}'"}.items():
        claim = claim.replace(f"%({name})s", value)
    claim_plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + claim))
    assert "tock_jobs_fair_idx" in claim_plan, claim_plan


def test_the_levels_and_the_walk_probe_rather_than_read_every_due_row(flow, db, now):
    """Statistics taken when few rows were due (between two autovacuums) once made the
    planner hash every due row of the level into a semi-join (4.5 ms at 5M pending
    rows), and a bare LIMIT 1 probe was planned as a sequential scan (0.7 s per empty
    level at 1M due rows, a size this test does not build: the benchmark's fair share
    phase does); each step is one index probe whatever the statistics say."""
    _bulk(db, 20_000, now=now, tenant=None, age=-3600)  # due in an hour
    db.execute("ANALYZE tock_jobs")
    _bulk(db, 5_000, now=now, tenant=None)
    values = {"level": "0", "after": "''", "per_kind": "10", "now": "now()",
              "skip_kinds": "'{}'", "skip_tenants": "'{}'", "skip_lane_kinds": "'{}'",
              "skip_lane_queues": "'{}'"}
    for template in (flow_sql.DUE_LEVELS, flow_sql.DUE_PAIRS_FROM):
        statement = template
        for name, value in values.items():
            statement = statement.replace(f"%({name})s", value)
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + statement))
        assert "Semi Join" not in plan and "Hash Join" not in plan, plan
        assert "Seq Scan on tock_jobs" not in plan, plan
    assert flow.due_levels(now) == [0]
    assert flow.due_pairs(0, 10, now=now) == [("k", "default", "", 1)]


def test_key_rooms_walk_the_keys_with_due_work_from_a_cursor(flow, db, now):
    for key, state in [("b", "scheduled"), ("a", "scheduled"), ("a", "retrying"),
                       ("c", "scheduled"), ("a", "running"), ("d", "running")]:
        add_job(db, run_at=now - secs(5), state=state, concurrency_key=key)
    add_job(db, run_at=now + secs(60), concurrency_key="e")  # keyed, not due yet
    add_job(db, run_at=now - secs(5), concurrency_key="f", tenant="t")  # another tenant
    add_job(db, run_at=now - secs(5), concurrency_key="g", priority=3)  # another level
    add_job(db, run_at=now - secs(5))  # no key
    add_job(db, run_at=now - secs(5), concurrency_key="h", queue="bulk")  # another queue
    d = "default"
    assert flow.key_rooms(0, ("k", d, ""), after="", walk=10, now=now) == [
        ("a", True, 1), ("b", True, 0), ("c", True, 0), ("e", False, None)]
    assert flow.key_rooms(0, ("k", d, ""), after="a", walk=2, now=now) == [
        ("b", True, 0), ("c", True, 0)]
    assert flow.key_rooms(0, ("k", d, "t"), after="", walk=10, now=now) == [("f", True, 0)]
    assert flow.key_rooms(3, ("k", d, ""), after="", walk=10, now=now) == [("g", True, 0)]
    assert flow.key_rooms(0, ("k", "bulk", ""), after="", walk=10, now=now) == [
        ("h", True, 0)]


def test_claim_keys_takes_each_keys_oldest_up_to_its_quota(flow, db, now):
    a_old = add_job(db, run_at=now - secs(30), concurrency_key="a")
    add_job(db, run_at=now - secs(10), concurrency_key="a")
    b_job = add_job(db, run_at=now - secs(10), concurrency_key="b")
    add_job(db, run_at=now - secs(40))  # no key: not for this claim
    add_job(db, run_at=now - secs(40), concurrency_key="a", tenant="t")  # other tenant
    with flow.transaction() as tx:
        got = tx.claim_keys(0, ("k", "default", ""), [("a", 1), ("b", 5)], now)
    assert sorted(d.id for d in got) == [a_old, b_job]
    assert {d.tenant_key for d in got} == {""}


def test_claim_pairs_of_a_keyed_kind_takes_only_the_jobs_without_a_key(flow, db, now):
    add_job(db, run_at=now - secs(30), concurrency_key="a")
    plain = add_job(db, run_at=now - secs(10))
    other = add_job(db, run_at=now - secs(30), kind="other", concurrency_key="a")
    with flow.transaction() as tx:
        got = tx.claim_pairs(0, [("k", "default", "", 5), ("other", "default", "", 5)], now,
                             unkeyed={"k"})
    assert sorted(d.id for d in got) == sorted([plain, other])


def test_the_key_walk_and_its_claim_use_the_key_index(flow, db, now):
    """A key with a big backlog costs the walk one probe, like any other key."""
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, concurrency_key)
        SELECT 'k', 'scheduled', %s - make_interval(secs => g * 0.001), '{}',
               CASE WHEN g <= 20000 THEN 'big' ELSE 'key-' || g END
        FROM generate_series(1, 20010) g
    """, (now,))
    db.execute("ANALYZE tock_jobs")
    values = {"level": "0", "kind": "'k'", "queue": "'default'", "tenant": "''",
              "after": "''", "walk": "64",
              "now": "now()", "keys": "'{big,key-20001}'", "quotas": "'{1,1}'"}
    for template in (flow_sql.KEY_ROOMS, flow_sql.CLAIM_KEYS):
        statement = template
        for name, value in values.items():
            statement = statement.replace(f"%({name})s", value)
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + statement))
        assert "tock_jobs_key_due_idx" in plan and "Seq Scan on tock_jobs" not in plan, plan
    rooms = flow.key_rooms(0, ("k", "default", ""), after="", walk=64, now=now)
    assert len(rooms) == 11 and rooms[0] == ("big", True, 0)


# --- limits --------------------------------------------------------------------------------


def test_in_sqs_counts_each_kinds_dispatched_jobs_up_to_the_cap(flow, db, now):
    _bulk(db, 30, now=now, tenant=None, state="dispatched")
    _bulk(db, 5, now=now, tenant="t", state="dispatched", kind="other")
    _bulk(db, 7, now=now, tenant=None, state="running", kind="busy")  # claimed: not in SQS
    _bulk(db, 50, now=now, tenant=None, kind="due")  # due, not sent
    db.execute("UPDATE tock_jobs SET dispatched_at = %s - make_interval(secs => id %% 2)",
               (now,))  # half of them sent a second before `now`, half at `now`
    d = "default"
    assert flow.in_sqs(100, 0.5, now) == {("k", d, ""): (30, 15),
                                          ("other", d, "t"): (5, 3)}  # ids 31-35
    assert flow.in_sqs(10, 0.5, now)[("k", d, "")][0] == 10
    assert flow.in_sqs(100, 5, now) == {("k", d, ""): (30, 0), ("other", d, "t"): (5, 0)}
    assert flow.kind_in_sqs("k", cap=100) == {"default": 30}
    assert flow.kind_in_sqs("due", cap=100) == {}
    db.execute("UPDATE tock_jobs SET queue = 'bulk' WHERE kind = 'k' AND id <= 12")
    assert flow.kind_in_sqs("k", cap=100) == {"default": 18, "bulk": 12}
    assert flow.in_sqs(100, 5, now) == {("k", d, ""): (18, 0), ("k", "bulk", ""): (12, 0),
                                        ("other", d, "t"): (5, 0)}


def test_the_window_count_reads_the_in_flight_rows_not_the_kinds_backlog(flow, db, now):
    """The count runs on a pass every WINDOW_RECOUNT_SECONDS: it must read the kind's jobs
    in flight (bounded by the window and the fleet's slots), never its due backlog, even
    on statistics taken when nothing was in flight."""
    _bulk(db, 40_000, now=now, tenant=None)
    db.execute("ANALYZE tock_jobs")
    db.execute("UPDATE tock_jobs SET state = 'dispatched' WHERE id IN ("
               "SELECT id FROM tock_jobs ORDER BY id LIMIT 300)")
    for statement in (flow_sql.IN_SQS, flow_sql.KIND_IN_SQS):
        text = statement.replace("%(cap)s", "1000").replace("%(kind)s", "'k'").replace(
            "%(age)s", "0.25").replace("%(now)s", "NULL")
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + text))
        assert "tock_jobs_in_flight_idx" in plan and "Seq Scan on tock_jobs" not in plan, plan
        assert "tock_jobs_kind_idx" not in plan and "tock_jobs_fair_idx" not in plan, plan
    assert flow.in_sqs(1000, 0.25)[("k", "default", "")][0] == 300


def test_limit_rooms_count_the_slots_held_and_the_tokens(flow, db, now):
    flow.set_limit("kind", "k", max_running=5, rate_per_second=None, burst=None, now=now)
    flow.set_limit("tenant", "acme", max_running=None, rate_per_second=2.0, burst=4,
                   now=now)
    flow.set_limit("tenant", "", max_running=3, rate_per_second=None, burst=None, now=now)
    for state in ("dispatched", "running", "running"):
        add_job(db, run_at=now - secs(5), state=state, tenant="acme")
    for state in ("scheduled", "retrying", "succeeded", "dead"):  # hold no slot
        add_job(db, run_at=now - secs(5), state=state)
    add_job(db, run_at=now - secs(5), state="running", kind="other")
    with flow.transaction() as tx:
        rooms = {(r.scope, r.key): r for r in tx.limit_rooms(now)}
    kind = rooms[("kind", "k")]
    assert (kind.in_flight, kind.room, kind.tokens) == (3, 2, None)
    assert rooms[("tenant", "")].in_flight == 1 and rooms[("tenant", "")].room == 2
    acme = rooms[("tenant", "acme")]
    assert (acme.tokens, acme.room) == (4.0, 4), "a new bucket starts full"


def test_tokens_are_spent_and_refill_at_the_rate_up_to_the_burst(flow, now):
    flow.set_limit("kind", "api", max_running=None, rate_per_second=2.0, burst=4, now=now)
    with flow.transaction() as tx:
        tx.take_tokens([("kind", "api", 3)], now)

    def tokens(at):
        with flow.transaction() as tx:
            return next(r.tokens for r in tx.limit_rooms(at) if r.key == "api")
    assert tokens(now) == pytest.approx(1.0)
    assert tokens(now + secs(0.5)) == pytest.approx(2.0)
    assert tokens(now + secs(60)) == pytest.approx(4.0), "never more than the burst"
    flow.set_limit("kind", "api", max_running=None, rate_per_second=2.0, burst=2,
                   now=now + secs(60))
    assert tokens(now + secs(60)) == pytest.approx(2.0), "a smaller burst caps them"


def test_a_limit_another_timer_is_claiming_for_has_no_room(flow, database, now):
    flow.set_limit("kind", "k", max_running=10, rate_per_second=None, burst=None, now=now)
    other = FlowStore(database)
    with flow.transaction() as tx:
        (mine,) = tx.limit_rooms(now)
        assert mine.mine and mine.room == 10
        with other.transaction() as tx2:
            (theirs,) = tx2.limit_rooms(now)
            assert not theirs.mine and theirs.room == 0
    with other.transaction() as tx2:
        assert tx2.limit_rooms(now)[0].mine, "the lock ends with the transaction"


def test_a_kind_key_limit_lists_its_keys_at_the_limit_and_one_keys_use(flow, db, now):
    flow.set_limit("kind_key", "k", max_running=1, rate_per_second=None, burst=None, now=now)
    for key in ("a", "b"):
        add_job(db, run_at=now - secs(5), state="running", concurrency_key=key)
    add_job(db, run_at=now - secs(5), state="running")  # no key: not counted
    for key in ("a", "a", "c"):
        add_job(db, run_at=now - secs(5), concurrency_key=key)
    with flow.transaction() as tx:
        (room,) = tx.limit_rooms(now)
    assert (room.scope, room.mine, room.in_flight) == ("kind_key", True, None)
    (info,) = flow.limits(now=now)
    assert (info.in_flight, info.keys_at_limit, info.waiting) == (2, 2, 3)
    one = flow.key_limit("k", "a", now=now)
    assert one is not None and (one.in_flight, one.waiting, one.max_running) == (1, 2, 1)
    assert one.concurrency_key == "a"
    assert flow.key_limit("other", "a", now=now) is None


def test_limits_list_with_use_waiting_and_remove(flow, db, now):
    flow.set_limit("kind", "k", max_running=2, rate_per_second=0.5, burst=1, now=now)
    add_job(db, run_at=now - secs(5), state="running")
    for _ in range(3):
        add_job(db, run_at=now - secs(5))
    add_job(db, run_at=now + secs(60))  # not due: not waiting
    (info,) = flow.limits(now=now)
    assert (info.scope, info.key, info.max_running, info.rate_per_second, info.burst) == (
        "kind", "k", 2, 0.5, 1)
    assert (info.in_flight, info.waiting, info.tokens) == (1, 3, 1.0)
    assert info.seconds_to_next_token == 0.0
    assert flow.limits("kind", "nope", now=now) == []
    assert flow.remove_limit("kind", "k") is True
    assert flow.remove_limit("kind", "k") is False
    assert flow.limits(now=now) == []


@pytest.mark.parametrize("scope, max_running, rate, burst", [
    ("kind", -1, None, None), ("kind", None, None, None), ("kind", None, 0.0, 1),
    ("kind", None, 1.0, None), ("kind", None, 1.0, 0), ("kind_key", None, 1.0, 1),
    ("kind_key", 1, 1.0, 1), ("queue", 1, None, None)])
def test_the_schema_refuses_limits_that_mean_nothing(flow, scope, max_running, rate, burst):
    with pytest.raises(DataRejected):
        flow.set_limit(scope, "k", max_running=max_running, rate_per_second=rate,
                       burst=burst)


# --- tenant weights ------------------------------------------------------------------------


def test_tenant_weights_set_replace_and_reset(flow):
    flow.set_tenant_weight("acme", 5)
    flow.set_tenant_weight("acme", 7)
    flow.set_tenant_weight("", 2)
    assert flow.tenant_weights() == {"": 2, "acme": 7}
    assert flow.reset_tenant_weight("acme") is True
    assert flow.reset_tenant_weight("acme") is False
    assert flow.tenant_weights() == {"": 2}


@pytest.mark.parametrize("weight", [0, 1001])
def test_tenant_weight_out_of_range_is_refused_by_the_schema(flow, weight):
    with pytest.raises(DataRejected):
        flow.set_tenant_weight("acme", weight)
