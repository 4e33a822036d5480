"""The connection pool's warnings, once per pool and kind per 30 s. While Postgres is down
psycopg's pool warns on every reconnection attempt of every pool, several lines each,
several times a second: in tock's processes and in an application using the client
alike. Every `Database` installs the filter, so it holds wherever tock is used."""

from __future__ import annotations

import logging


class Repeats(logging.Filter):
    """Pass a record only if none with the same template and first argument (for the
    connection pool: the pool's name) passed within `seconds`. While Postgres is down, the
    pool warns on every reconnection attempt of every pool, several lines each, several
    times a second; the first says why, and the loops' own `loop_failed` lines go on
    saying that it still fails."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        first = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        # A pool's name is text; a connection ("discarding closed connection: %s") is
        # another object each time, which would make every line news.
        key = (str(record.msg), first if isinstance(first, str) else type(first).__name__)
        now = record.created
        if now - self._last.get(key, -self.seconds) < self.seconds:
            return False
        self._last[key] = now
        return True



REPEAT_SECONDS = 30.0


def hush_pool_repeats() -> None:
    """Install `Repeats` on psycopg's pool logger, once."""
    pool = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, Repeats) for f in pool.filters):
        pool.addFilter(Repeats(REPEAT_SECONDS))
