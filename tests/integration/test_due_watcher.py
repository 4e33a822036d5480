"""The due watcher (timer_service/due_watcher.py) against a real Postgres and a real SQS
server: while a tenant is backlogged, its pass claims the work of every other pair at
once and none of the backlog's; it sleeps until the next job of a pair that is not
backlogged falls due; with nothing backlogged it claims nothing. Due times are pinned
through `now=` where a pass runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.integration.test_pipeline_fairness import _backlog, _dispatched, _timer
from timer_service.dispatcher import BACKLOGGED_AFTER_SECONDS, BACKLOGGED_FOR_SECONDS
from timer_service.due_watcher import LOOK_AGAIN_SECONDS
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
    assert watcher.seconds_to_sleep(skip) == LOOK_AGAIN_SECONDS  # nothing to fall due
    # big's own next job falls due first: the dispatch threads' work, not the watcher's.
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + interval '100 milliseconds', '{}', 'big')""")
    assert watcher.seconds_to_sleep(skip) == LOOK_AGAIN_SECONDS
    db.execute("DELETE FROM tock_jobs WHERE run_at > now()")
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + interval '150 milliseconds', '{}', 'other')""")
    assert 0 < watcher.seconds_to_sleep(skip) <= 0.15
    db.execute("UPDATE tock_jobs SET run_at = now() + interval '1 hour' WHERE tenant = 'other'")
    assert watcher.seconds_to_sleep(skip) == LOOK_AGAIN_SECONDS  # capped


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
