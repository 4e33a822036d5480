"""While Postgres is down the connection pool warns on every reconnection attempt: the
processes pass the first warning of each kind per pool, then one per 30 s."""

from __future__ import annotations

import logging

from shared.store.pool_log import Repeats


def _record(msg: str, *args: object, at: float) -> logging.LogRecord:
    record = logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, msg, args, None)
    record.created = at
    return record


def test_one_warning_per_pool_and_template_per_window():
    repeats = Repeats(30.0)
    connecting = "error connecting in %r: %s"
    passed = [repeats.filter(_record(connecting, pool, reason, at=at)) for pool, reason, at in [
        ("tock-timer", "connection refused", 100.0),  # first: passes, with its reason
        ("tock-timer", "connection refused", 100.5),
        ("tock-timer", "timeout expired", 110.0),     # same template, same pool: held
        ("tock-claim", "connection refused", 110.0),  # another pool: passes
        ("tock-timer", "connection refused", 130.0),  # a window later: passes again
    ]]
    assert passed == [True, False, False, True, True]
    other = repeats.filter(_record("reconnection attempt in pool %r failed after %s sec",
                                   "tock-timer", 1.0, at=100.6))
    assert other, "another template is news"


def test_discarded_connections_are_one_line_per_window_not_one_each():
    # psycopg names the connection itself, a different object every time: 22 lines in an
    # application's stderr for 5 Postgres restarts in 25 s.
    repeats = Repeats(30.0)

    class Connection:
        pass

    passed = [repeats.filter(_record("discarding closed connection: %s", Connection(),
                                     at=100.0 + i)) for i in range(5)]
    assert passed == [True, False, False, False, False]
