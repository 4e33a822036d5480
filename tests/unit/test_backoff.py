"""Retry delays with equal jitter: uniform in [c/2, c], c = min(cap, base * 2^(n-1))."""

from __future__ import annotations

import random

import pytest

from shared.core.backoff import backoff_ceiling, backoff_seconds


class Fixed:
    """A `random.Random` stand-in whose uniform(a, b) always returns one end."""

    def __init__(self, end: str) -> None:
        self.end = end

    def uniform(self, a: float, b: float) -> float:
        return a if self.end == "low" else b


@pytest.mark.parametrize(("base", "cap"), [(1.0, 60.0), (0.5, 10.0), (2.0, 3600.0),
                                           (5.0, 5.0), (10.0, 1.0), (0.001, 0.002)])
def test_delays_stay_within_half_the_step_and_the_step(base, cap):
    rand = random.Random(1234)
    for attempt in range(1, 30):
        step = min(cap, base * 2 ** (attempt - 1))
        assert backoff_ceiling(attempt, base=base, cap=cap) == step
        delays = [backoff_seconds(attempt, base=base, cap=cap, rand=rand) for _ in range(200)]
        assert min(delays) >= step / 2
        assert max(delays) <= step
        assert max(delays) <= cap
        if step > 0.01:  # and they are spread out, not all the same
            assert max(delays) - min(delays) > step / 10


def test_the_ends_of_the_range():
    for attempt, step in [(1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (100, 60.0)]:
        assert backoff_seconds(attempt, base=1.0, cap=60.0, rand=Fixed("low")) == step / 2
        assert backoff_seconds(attempt, base=1.0, cap=60.0, rand=Fixed("high")) == step


def test_the_first_retry_is_never_at_once():
    # Full jitter (uniform in [0, c]) could return 0.0 here; equal jitter never goes below c/2.
    assert backoff_seconds(1, base=1.0, cap=60.0, rand=Fixed("low")) == 0.5
    rand = random.Random(0)
    assert min(backoff_seconds(1, base=2.0, cap=60.0, rand=rand) for _ in range(1000)) >= 1.0


def test_it_works_without_a_seeded_random():
    for _ in range(100):
        assert 1.0 <= backoff_seconds(2, base=1.0, cap=60.0) <= 2.0


@pytest.mark.parametrize("attempt", [63, 64, 1000, 10**6, 10**18])
def test_huge_attempt_numbers_are_capped_without_overflow(attempt):
    assert backoff_ceiling(attempt, base=1.0, cap=60.0) == 60.0
    assert 30.0 <= backoff_seconds(attempt, base=1.0, cap=60.0, rand=random.Random(1)) <= 60.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempt_numbers_below_one_count_as_the_first(attempt):
    assert backoff_ceiling(attempt, base=3.0, cap=60.0) == 3.0
    assert 1.5 <= backoff_seconds(attempt, base=3.0, cap=60.0, rand=random.Random(1)) <= 3.0
