"""The batch split between tenants (timer_service.fair_share): pure arithmetic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from timer_service.fair_share import per_key, plan, quotas, round_from


def test_equal_weights_split_evenly_and_the_remainder_goes_somewhere():
    assert quotas([("a", 1), ("b", 1)], 100) == [("a", 50), ("b", 50)]
    assert sorted(n for _, n in quotas([("a", 1), ("b", 1), ("c", 1)], 100)) == [33, 33, 34]


def test_weights_are_honoured_and_everyone_gets_one():
    assert quotas([("a", 3), ("b", 1)], 100) == [("a", 75), ("b", 25)]
    assert dict(quotas([("big", 1000), ("small", 1)], 10)) == {"big": 9, "small": 1}


def test_more_tenants_than_slots_serves_the_first_ones_one_each():
    assert quotas([(str(i), 1) for i in range(5)], 3) == [("0", 1), ("1", 1), ("2", 1)]
    assert quotas([], 10) == []


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=50), st.integers(1, 500))
def test_quotas_use_exactly_the_capacity(weights, capacity):
    tenants = [(f"t{i}", w) for i, w in enumerate(weights)]
    split = quotas(tenants, capacity)
    assert sum(n for _, n in split) == capacity
    assert all(n >= 1 for _, n in split)
    assert len(split) == min(len(tenants), capacity)


def test_jobs_waiting_in_sqs_level_the_shares_like_water():
    assert quotas([("a", 1), ("b", 1)], 100, {"a": 30}) == [("a", 35), ("b", 65)]
    assert quotas([("a", 1), ("b", 1)], 100, {"a": 500}) == [("a", 1), ("b", 99)], \
        "a tenant far ahead in SQS keeps the one slot every tenant gets"
    assert quotas([("a", 3), ("b", 1)], 100, {"a": 150, "b": 10}) == [("a", 45), ("b", 55)]
    assert quotas([("a", 1), ("b", 1)], 100, {}) == quotas([("a", 1), ("b", 1)], 100)


@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 5000)), min_size=1,
                max_size=50), st.integers(1, 500))
def test_levelled_quotas_still_use_exactly_the_capacity(tenants, capacity):
    waiting = {f"t{i}": n for i, (_, n) in enumerate(tenants)}
    split = quotas([(f"t{i}", w) for i, (w, _) in enumerate(tenants)], capacity, waiting)
    assert sum(n for _, n in split) == capacity
    assert all(n >= 1 for _, n in split)


@given(st.lists(st.integers(0, 300), min_size=2, max_size=20), st.integers(1, 300))
def test_of_equal_weights_the_one_with_fewer_waiting_never_gets_fewer_slots(waiting, capacity):
    names = [f"t{i}" for i in range(len(waiting))]
    got = dict(quotas([(t, 1) for t in names], capacity, dict(zip(names, waiting,
                                                                   strict=True))))
    for t, wt in zip(names, waiting, strict=True):
        for u, wu in zip(names, waiting, strict=True):
            if t in got and u in got and wt < wu:
                assert got[t] >= got[u] - 1, "(one slot of rounding)"


def test_round_from_continues_after_the_cursor_then_wraps():
    after = [("k", "q", "m", 1), ("k", "q", "z", 1), ("j", "q", "m", 1)]
    wrapped = [("k", "q", "a", 1), ("k", "q", "m", 1), ("k", "q", "n", 2), ("k", "q", "z", 1)]
    assert round_from(after, wrapped, "l", 10) == [
        ("k", "q", "m", 1), ("j", "q", "m", 1), ("k", "q", "z", 1), ("k", "q", "a", 1)]
    assert [p[2] for p in round_from(after, wrapped, "l", 2)] == ["m", "m", "z"]
    assert round_from([], wrapped, None, 10) == wrapped


def test_round_from_keeps_one_kinds_lanes_apart():
    after = [("k", "bulk", "t", 1), ("k", "default", "t", 1)]
    assert round_from(after, [], None, 10) == after


def _slots(quota_list):
    return {(k, t): n for k, _, t, n in quota_list}


def _pairs(*pairs):
    """(kind, tenant, weight) on the queue "q"."""
    return [(k, "q", t, w) for k, t, w in pairs]


def test_plan_shares_by_tenant_weight_and_spreads_a_tenant_over_its_kinds():
    pairs = _pairs(("a", "t1", 3), ("b", "t1", 3), ("a", "t2", 1))
    got = _slots(plan(pairs, 100, kind_room={}, tenant_room={}))
    assert got == {("a", "t1"): 38, ("b", "t1"): 37, ("a", "t2"): 25}


def test_plan_levels_over_each_tenants_jobs_in_sqs_of_the_kinds_due():
    pairs = _pairs(("a", "busy", 1), ("b", "busy", 1), ("a", "new", 1))
    in_sqs = {("a", "q", "busy"): 20, ("b", "q", "busy"): 20, ("c", "q", "new"): 500}
    got = _slots(plan(pairs, 100, kind_room={}, tenant_room={}, in_sqs=in_sqs))
    assert got[("a", "new")] == 70, "busy holds 40 in SQS; new's kind c is not due here"
    assert got[("a", "busy")] + got[("b", "busy")] == 30


def test_plan_never_passes_a_kinds_or_a_tenants_room():
    pairs = _pairs(("limited", "t1", 1), ("limited", "t2", 1), ("free", "t2", 1))
    got = _slots(plan(pairs, 100, kind_room={"limited": 3}, tenant_room={"t2": 10}))
    assert got[("limited", "t1")] + got[("limited", "t2")] == 3
    assert got[("limited", "t2")] + got[("free", "t2")] == 10
    assert plan(pairs, 100, kind_room={"limited": 0, "free": 0}, tenant_room={}) == []


def test_plan_fills_a_kinds_other_lane_when_one_is_full_and_shares_the_kinds_room():
    pairs = [("k", "bulk", "t", 1), ("k", "default", "t", 1)]
    got = plan(pairs, 10, kind_room={}, tenant_room={}, lane_room={("k", "bulk"): 0})
    assert got == [("k", "default", "t", 10)]
    got = plan(pairs, 10, kind_room={"k": 4}, tenant_room={}, lane_room={("k", "bulk"): 1})
    assert sorted(got) == [("k", "bulk", "t", 1), ("k", "default", "t", 3)]


def test_plan_turns_who_goes_first_round_a_limit_with_room_for_one():
    pairs = _pairs(("one", "t1", 1), ("one", "t2", 1), ("one", "t3", 1))
    firsts = {plan(pairs, 10, kind_room={"one": 1}, tenant_room={}, turn=turn)[0][2]
              for turn in range(3)}
    assert firsts == {"t1", "t2", "t3"}


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("uv"),
                          st.sampled_from("xyz"), st.integers(1, 5)), min_size=1, max_size=9,
                unique_by=lambda p: (p[0], p[1], p[2])),
       st.integers(1, 200), st.dictionaries(st.sampled_from("abc"), st.integers(0, 50)),
       st.dictionaries(st.sampled_from("xyz"), st.integers(0, 50)),
       st.dictionaries(st.tuples(st.sampled_from("abc"), st.sampled_from("uv")),
                       st.integers(0, 50)), st.integers(0, 5))
def test_plan_never_exceeds_capacity_or_rooms(pairs, capacity, kind_room, tenant_room,
                                              lane_room, turn):
    weights = {t: w for _, _, t, w in pairs}  # one weight per tenant, as the walk gives
    pairs = [(k, q, t, weights[t]) for k, q, t, _ in pairs]
    got = plan(pairs, capacity, kind_room=kind_room, tenant_room=tenant_room,
               lane_room=lane_room, turn=turn)
    assert sum(n for *_, n in got) <= capacity
    for kind, room in kind_room.items():
        assert sum(n for k, _, _, n in got if k == kind) <= room
    for tenant, room in tenant_room.items():
        assert sum(n for _, _, t, n in got if t == tenant) <= room
    for lane, room in lane_room.items():
        assert sum(n for k, q, _, n in got if (k, q) == lane) <= room
    assert all(n > 0 for *_, n in got)
    if not kind_room and not tenant_room and not lane_room:
        assert sum(n for *_, n in got) == capacity, "unbounded: the batch is filled"


def test_a_held_tenant_gets_nothing_and_its_share_goes_to_no_one():
    """The dispatch window holds A (consumers are behind on its jobs in SQS): B, which the
    window lets through, sends up to A's level, not the whole batch because A is held, so
    the two tenants' jobs in SQS, handed out in about the order they were sent, stay in
    the weights' proportion."""
    pairs = _pairs(("k", "A", 1), ("k", "B", 1))
    held = {("k", "q", "A")}
    fresh = plan(pairs, 10, kind_room={}, tenant_room={}, in_sqs={("k", "q", "A"): 40},
                 held=held)
    assert fresh == [("k", "q", "B", 10)], "B is far under A's 40: a whole batch"
    near = plan(pairs, 10, kind_room={}, tenant_room={},
                in_sqs={("k", "q", "A"): 40, ("k", "q", "B"): 35}, held=held)
    assert near == [("k", "q", "B", 7)], "(10 + 75) / 2 = 42.5: B tops up to the level only"
    over = plan(pairs, 10, kind_room={}, tenant_room={},
                in_sqs={("k", "q", "A"): 40, ("k", "q", "B"): 60}, held=held)
    assert over == [], "B is past A's level: no slot kept for it"
    assert plan(pairs, 10, kind_room={}, tenant_room={}, held=held | {("k", "q", "B")}) == []


def test_beside_a_held_tenant_the_weights_still_set_the_level():
    pairs = _pairs(("k", "W1", 1), ("k", "W10", 10))
    held = {("k", "q", "W10")}
    in_sqs = {("k", "q", "W10"): 400, ("k", "q", "W1"): 99}
    assert plan(pairs, 100, kind_room={}, tenant_room={}, in_sqs=in_sqs, held=held) == [], \
        "W1 holds 99 beside W10's 400 at ten times its weight: it waits"
    in_sqs[("k", "q", "W1")] = 20
    got = plan(pairs, 100, kind_room={}, tenant_room={}, in_sqs=in_sqs, held=held)
    assert got == [("k", "q", "W1", 27)], "up to (100 + 420) / 11 = 47.3 per weight: 27 more"


@given(st.lists(st.tuples(st.sampled_from("uv"), st.sampled_from("wxyz"), st.integers(1, 9),
                          st.integers(0, 300), st.booleans()),
                min_size=1, max_size=8, unique_by=lambda p: (p[0], p[1])),
       st.integers(1, 200))
def test_held_pairs_get_nothing_and_the_rest_never_pass_capacity(rows, capacity):
    weights = {t: w for _, t, w, _, _ in rows}
    pairs = [("k", q, t, weights[t]) for q, t, _, _, _ in rows]
    in_sqs = {("k", q, t): n for q, t, _, n, _ in rows}
    held = {("k", q, t) for q, t, _, _, h in rows if h}
    got = plan(pairs, capacity, kind_room={}, tenant_room={}, in_sqs=in_sqs, held=held)
    assert sum(n for *_, n in got) <= capacity
    assert all(n > 0 and (k, q, t) not in held for k, q, t, n in got)
    if not held:
        assert sum(n for *_, n in got) == capacity


def test_per_key_gives_one_job_per_key_in_turn_within_each_room():
    assert per_key([("a", 3), ("b", 0), ("c", 1), ("d", 2)], 5) == [("a", 2), ("c", 1),
                                                                      ("d", 2)]
    assert per_key([("a", 3), ("b", 3)], 3) == [("a", 2), ("b", 1)]
    assert per_key([("a", -1)], 5) == [], "a key past its limit (it was lowered) gets none"


@given(st.lists(st.integers(-2, 5), max_size=12), st.integers(0, 40))
def test_per_key_never_passes_a_room_or_the_capacity(rooms, capacity):
    keyed = [(f"k{i}", room) for i, room in enumerate(rooms)]
    given_out = dict(per_key(keyed, capacity))
    assert sum(given_out.values()) == min(capacity, sum(max(r, 0) for r in rooms))
    assert all(0 < given_out[k] <= room for k, room in keyed if k in given_out)


def test_a_paced_tenant_gets_no_more_than_its_room_and_the_rest_goes_to_the_others():
    pairs = [("k", "q", "A", 1), ("k", "q", "B", 1)]
    got = {t: n for _, _, t, n in plan(pairs, 100, kind_room={}, tenant_room={},
                                        pair_room={("k", "q", "A"): 7})}
    assert got["A"] == 7
    assert got["B"] == 50, "B's share is its own; A's unused share waits for a top-up round"
