"""A bound on how long a connection may wait for Postgres to answer.

libpq waits for a reply as long as TCP does: a lost network is noticed within about 10 s
(the keepalive and user timeout options of every tock connection), but a server or proxy
that hangs while keeping the connection open (a frozen host, a stopped process, a proxy
with a dead backend) holds the caller until it answers. For the producer client that is an
application request stuck for ever. The `Watchdog` ends such a wait: a connection it
watches that is still busy past its deadline has its socket shut down from the watchdog's
thread, so the blocked call fails at once with a lost connection.

Postgres's own `statement_timeout`, set just below, ends a statement the server is slow to
finish (a lock wait behind another transaction, say) with a clean error first; the
watchdog is for a server that cannot say anything at all.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

GRACE_SECONDS = 5.0
"""How long past the server's statement_timeout the watchdog lets a call wait: a server
that is alive cancels the statement itself within that."""


class Watchdog:
    """Cuts the connections of calls that wait past `seconds` (+ GRACE_SECONDS). One thread,
    started on first use, looks every quarter second."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._watched: dict[int, tuple[float, psycopg.Connection[Any]]] = {}
        self._fired: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    def close(self) -> None:
        """Stop the thread once no call is watched any more (a call still waiting now is
        still cut at its deadline): a closed pool leaves no thread behind."""
        with self._lock:
            self._closed = True

    @property
    def limit(self) -> float:
        """Seconds a watched call may take in all."""
        return self.seconds + GRACE_SECONDS

    @contextlib.contextmanager
    def watch(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Watch `conn` for the block: past `limit` seconds, its socket is shut down."""
        key = id(conn)
        with self._lock:
            self._start()
            self._watched[key] = (time.monotonic() + self.limit, conn)
            self._fired.discard(key)
        try:
            yield
        finally:
            with self._lock:
                self._watched.pop(key, None)

    def fired(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the watchdog cut `conn` (the error a call saw is then its doing)."""
        with self._lock:
            return id(conn) in self._fired

    def _start(self) -> None:
        # A forked child has the dict but not the thread.
        if self._thread is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="tock-db-watchdog",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                if self._closed and not self._watched:
                    self._thread = None
                    return
                late = [(key, conn) for key, (deadline, conn) in self._watched.items()
                        if deadline <= now and key not in self._fired]
                self._fired.update(key for key, _ in late)
                # Cut while holding the lock: a watched call's block cannot end meanwhile,
                # so its connection cannot have gone back to the pool and on to another
                # call (cutting that one instead). A cut is a few system calls.
                for _, conn in late:
                    cut(conn)


def cut(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down under whoever is waiting on it: its wait ends at
    once with a lost connection. The descriptor itself is left to its owner to close."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()
