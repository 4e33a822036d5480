"""The batch split between tenants (timer_service.fair_share): pure arithmetic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from timer_service.fair_share import quotas, round_from


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


def test_round_from_continues_after_the_cursor_then_wraps():
    after = [("m", 1), ("z", 1)]
    wrapped = [("a", 1), ("m", 1), ("n", 2), ("z", 1)]
    assert round_from(after, wrapped, "l", 10) == [("m", 1), ("z", 1), ("a", 1)]
    assert round_from(after, wrapped, "l", 2) == [("m", 1), ("z", 1)]
    assert round_from([], wrapped, None, 10) == wrapped
