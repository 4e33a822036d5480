"""The claim floor: while a (kind, queue, tenant) drains a backlog, each claim of it starts
after the last job the timer claimed of it, not at its oldest due row behind the index
entries of every job claimed since the last VACUUM. A job due before the floor (enqueued
with a time already past, or left by a pass that rolled back) waits at most
FLOOR_RESET_SECONDS more. Real timer code, real Postgres and LocalStack; due times pinned
through `now=`, the floor's age through the dispatcher's monotonic clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from timer_service.dispatcher import FLOOR_RESET_SECONDS
from timer_service.service import Timer


def _backlog(db, n: int, *, now, age: float = 3600) -> list[int]:
    """`n` due jobs of tenant A, oldest first, the first `age` seconds overdue."""
    return [r[0] for r in db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, tenant)
        SELECT 'k', 'scheduled', %s - make_interval(secs => %s - g * 0.001), '{}', 'A'
        FROM generate_series(1, %s) g
        ORDER BY g
        RETURNING id""", (now, age, n)).fetchall()]


def _dispatched(db) -> set[int]:
    return {r[0] for r in db.execute("SELECT id FROM tock_jobs WHERE state = 'dispatched'")}


@pytest.fixture
def timer(timer_settings, transport):
    timer = Timer(timer_settings.model_copy(update={"batch_size": 100}), transport)
    clock = [1000.0]
    timer.dispatcher.monotonic = lambda: clock[0]
    timer.clock = clock  # the test moves it
    try:
        yield timer
    finally:
        timer.close()


def test_a_backlogs_claims_go_on_from_the_last_job_claimed(db, timer, clock):
    now = clock.now
    backlog = _backlog(db, 300, now=now)
    assert timer.run_once(now).dispatched == 100
    assert _dispatched(db) == set(backlog[:100])
    [straggler] = _backlog(db, 1, now=now, age=7200)  # older than the whole backlog
    assert timer.run_once(now).dispatched == 100
    assert _dispatched(db) == set(backlog[:200]), "the scan started past the floor"
    timer.clock[0] += FLOOR_RESET_SECONDS
    assert timer.run_once(now).dispatched == 100
    assert straggler in _dispatched(db), "the floor lasts FLOOR_RESET_SECONDS at most"
    assert _dispatched(db) == {straggler, *backlog[:299]}


def test_a_pair_drained_past_its_floor_is_scanned_from_its_oldest_again(db, timer, clock):
    now = clock.now
    backlog = _backlog(db, 150, now=now)
    assert timer.run_once(now).dispatched == 100
    assert timer.run_once(now).dispatched == 50  # less than its quota: the floor goes
    [straggler] = _backlog(db, 1, now=now, age=7200)
    assert timer.run_once(now).dispatched == 1, "no wait for the floor to expire"
    assert _dispatched(db) == {straggler, *backlog}


class _FailingOnce:
    """SQS that fails one SendMessageBatch with an error nothing handles: the pass raises
    and its transaction rolls back, as after a crash between the claim and the commit."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.fail = False

    def send_batch(self, queue, entries):
        if self.fail:
            self.fail = False
            raise RuntimeError("injected: the pass dies before its commit")
        return self.inner.send_batch(queue, entries)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_pass_that_rolls_back_leaves_the_floor_where_it_was(db, timer_settings, transport,
                                                              clock):
    now = clock.now
    backlog = _backlog(db, 300, now=now)
    failing = _FailingOnce(transport)
    timer = Timer(timer_settings.model_copy(update={"batch_size": 100}), failing)
    timer.dispatcher.monotonic = lambda: 1000.0  # no reset: only the floor decides
    try:
        assert timer.run_once(now).dispatched == 100
        failing.fail = True
        with pytest.raises(RuntimeError, match="injected"):
            timer.run_once(now + timedelta(milliseconds=1))
        assert _dispatched(db) == set(backlog[:100]), "the failed pass's claim rolled back"
        assert timer.run_once(now).dispatched == 100
        assert _dispatched(db) == set(backlog[:200]), \
            "the next pass claims the jobs the failed one had: its floor was not kept"
    finally:
        timer.close()
