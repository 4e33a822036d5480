"""The due watcher (timer_service/due_watcher.py) against a real Postgres and a real SQS
server: while a tenant is backlogged, its pass claims the work of every other pair at
once and none of the backlog's; it sleeps until the next job of a pair that is not
backlogged falls due; with nothing backlogged it claims nothing. Due times are pinned
through `now=` where a pass runs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.integration.test_pipeline_fairness import _backlog, _dispatched, _timer
from timer_service.dispatcher import (
    BACKLOGGED_AFTER_SECONDS,
    BACKLOGGED_FOR_SECONDS,
    HOLD_BUDGET,
    HOLD_WINDOW_SECONDS,
)
from timer_service.due_watcher import LEAD_SECONDS, LOOK_AGAIN_SECONDS
from timer_service.service import Timer


@pytest.fixture
def timer(timer_settings, transport) -> Iterator[Timer]:
    """A timer with batches of 50 (its loops are driven by hand). Nothing consumes what it
    sends and `now` is moved by hand, so the dispatch window's age is off: it would hold a
    tenant whenever a pass happens to recount it (every 20 ms)."""
    made = _timer(timer_settings.model_copy(update={"dispatch_window_seconds": 0}),
                  transport, batch=50)
    yield made
    made.close()


class _Ticks:
    """The dispatcher's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        # From 0, where steps of BACKLOGGED_AFTER_SECONDS add up exactly: from the real
        # clock's reading, `last - since` of one step could come out a hair under it.
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def _backlogged(timer, passes: int, now) -> None:
    """`passes` full batches, BACKLOGGED_AFTER_SECONDS apart on the dispatcher's clock."""
    if not isinstance(timer.dispatcher.monotonic, _Ticks):
        timer.dispatcher.monotonic = _Ticks()
    for _ in range(passes):
        assert timer.run_once(now).dispatched == timer.settings.batch_size
        timer.dispatcher.monotonic.at += BACKLOGGED_AFTER_SECONDS


def test_a_pass_claims_everything_due_but_the_backlogged_pairs(db, timer, clock):
    now = clock.now
    _backlog(db, 5_000, "big", now=now, age=3600)
    _backlogged(timer, 1, now)
    assert timer.dispatcher.backlogged() == frozenset(), "one full batch is no backlog"
    _backlogged(timer, 1, now)
    assert timer.dispatcher.backlogged() == {(0, "k", "big")}
    _backlog(db, 30, "new", now=now, age=1)
    _backlog(db, 5, None, now=now, age=1)
    timer.due_watcher.run_once(now)
    # Every job of the pairs that were not backlogged, in one pass; none of big's.
    assert _dispatched(db) == Counter({"big": 100, "new": 30, "": 5})
    timer.due_watcher.run_once(now)
    assert _dispatched(db) == Counter({"big": 100, "new": 30, "": 5})


def test_with_nothing_backlogged_the_watcher_leaves_the_work_to_the_dispatch_threads(
        db, timer, clock):
    now = clock.now
    _backlog(db, 30, "a", now=now, age=1)
    assert timer.dispatcher.backlogged() == frozenset()
    timer.due_watcher.run_once(now)
    assert _dispatched(db) == Counter()
    assert timer.run_once(now).dispatched == 30  # not a full batch: nothing backlogged
    assert timer.dispatcher.backlogged() == frozenset()


def test_it_sleeps_until_the_next_job_of_a_pair_not_backlogged_falls_due(db, timer, clock):
    now = clock.now
    _backlog(db, 500, "big", now=now, age=3600)
    _backlogged(timer, 2, now)
    skip = timer.dispatcher.backlogged()
    assert skip
    watcher = timer.due_watcher
    assert watcher.seconds_to_sleep(skip) == (LOOK_AGAIN_SECONDS, False)  # nothing due
    # big's own next job falls due first: the dispatch threads' work, not the watcher's.
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + interval '100 milliseconds', '{}', 'big')""")
    assert watcher.seconds_to_sleep(skip) == (LOOK_AGAIN_SECONDS, False)
    db.execute("DELETE FROM tock_jobs WHERE run_at > now()")
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + interval '150 milliseconds', '{}', 'other')""")
    seconds, falls_due = watcher.seconds_to_sleep(skip)
    assert 0 < seconds <= 0.15 and falls_due
    db.execute("UPDATE tock_jobs SET run_at = now() + interval '1 hour' WHERE tenant = 'other'")
    assert watcher.seconds_to_sleep(skip) == (LOOK_AGAIN_SECONDS, False)  # capped


def test_a_backlogged_pair_stops_counting_once_its_batches_are_not_full(db, timer, clock):
    now = clock.now
    _backlog(db, 110, "big", now=now, age=3600)
    _backlogged(timer, 2, now)
    assert timer.dispatcher.backlogged() == {(0, "k", "big")}
    timer.run_once(now)  # the last 10: not a full batch, nothing refreshed
    assert timer.dispatcher.backlogged() == {(0, "k", "big")}, "kept for a while"
    timer.dispatcher.monotonic.at += BACKLOGGED_FOR_SECONDS + 0.1
    assert timer.dispatcher.backlogged() == frozenset()


def test_a_newcomer_served_in_full_batches_is_not_backlogged_at_once(db, timer, clock):
    """A tenant whose jobs take a pass or two filled its share of a full batch, but not for
    long: the watcher still takes the rest of its jobs."""
    now = clock.now
    _backlog(db, 5_000, "big", now=now, age=3600)
    _backlogged(timer, 2, now)
    _backlog(db, 40, "new", now=now, age=1)
    timer.run_once(now)  # a full batch: 25 each, both filled their share
    assert (0, "k", "new") not in timer.dispatcher.backlogged()
    timer.due_watcher.run_once(now)
    assert _dispatched(db)["new"] == 40


def test_woken_early_for_a_job_it_claims_it_when_it_falls_due_not_before(db, timer, clock):
    """The watcher wakes LEAD_SECONDS before a newcomer's job falls due (holding the
    backlog's new passes meanwhile), then claims it at its time: not early, and not a
    pass later."""
    _backlog(db, 500, "big", now=clock.now, age=3600)
    _backlogged(timer, 2, clock.now)
    skip = timer.dispatcher.backlogged()
    watcher = timer.due_watcher
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + make_interval(secs => %s), '{}', 'other')""",
               (LEAD_SECONDS,))
    seconds, falls_due = watcher.seconds_to_sleep(skip)
    assert falls_due and 0 < seconds <= LEAD_SECONDS
    watcher._due_at = time.monotonic() + seconds  # what idle() sets, then sleeps short of
    watcher.run_once()
    row = db.execute("SELECT state::text, dispatched_at >= run_at FROM tock_jobs "
                     "WHERE tenant = 'other'").fetchone()
    assert row == ("dispatched", True)
    assert timer.dispatcher._gate.is_set(), "the backlog's passes are let go after it"


def test_the_backlog_is_held_for_at_most_its_budget_of_the_time(timer):
    """Holds add up over a window: past HOLD_BUDGET of it, the watcher's passes run beside
    the backlog's instead of before them, so a tenant with jobs falling due all the time
    cannot stall the backlog."""
    dispatcher = timer.dispatcher
    ticks = dispatcher.monotonic = _Ticks()
    step = HOLD_BUDGET * HOLD_WINDOW_SECONDS / 4
    for _ in range(4):
        with dispatcher.priority_pass() as held:
            assert held and not dispatcher._gate.is_set()
            ticks.at += step
        assert dispatcher._gate.is_set()
    with dispatcher.priority_pass() as held:
        assert not held and dispatcher._gate.is_set()
    ticks.at += HOLD_WINDOW_SECONDS  # the window moved past the holds
    with dispatcher.priority_pass() as held:
        assert held


def test_a_held_backlog_pass_waits_for_the_watchers_pass(db, timer, clock):
    """A dispatch thread that starts a pass while the watcher's runs waits for it to end
    (at most HOLD_MAX_SECONDS), then claims as usual."""
    _backlog(db, 200, "big", now=clock.now, age=3600)
    done = threading.Event()
    sent: list[int] = []

    def backlog_pass() -> None:
        sent.append(timer.dispatcher.run_once())
        done.set()

    with timer.dispatcher.priority_pass():
        thread = threading.Thread(target=backlog_pass)
        thread.start()
        ran_while_held = done.wait(0.02)
    thread.join(10)
    assert not ran_while_held and sent == [timer.settings.batch_size]


def test_a_watcher_pass_that_fails_lets_the_backlog_go(timer):
    """Postgres gone mid-pass (or anything else raised in it): the gate opens again, so
    the dispatch threads are never left waiting on a pass that ended in an error."""
    with pytest.raises(RuntimeError), timer.dispatcher.priority_pass() as held:
        assert held and not timer.dispatcher._gate.is_set()
        raise RuntimeError("the database went away")
    assert timer.dispatcher._gate.is_set()
