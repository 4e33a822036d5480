"""A TCP proxy between the consumers and Postgres, to cut them off from the database.

    proxy = TcpProxy(upstream_port=pg.port).start()   # consumers connect to proxy.port
    proxy.partition()      # every open connection is dropped; new ones hang ...
    proxy.heal()           # ... until now, when they go through (or: new="refuse")

`partition(new="hang")` is the harsher, more realistic variant: a connection attempt made
during the partition is accepted but nothing gets through until `heal()`, as when SYNs
go unanswered (the client waits on its own connect timeout). `new="refuse"` closes the
listening socket instead, so connection attempts fail at once with ECONNREFUSED.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field
from typing import Literal

NewConnections = Literal["hang", "refuse"]


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class ProxyStats:
    accepted: int = 0
    dropped: int = 0
    """Open connections cut by `partition()`."""
    held: int = 0
    """Connection attempts made during a partition (mode "hang")."""
    upstream_failures: int = 0


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `upstream_host`:`upstream_port`, one thread pair per
    connection."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.stats = ProxyStats()
        self._cond = threading.Condition()
        self._pairs: set[_Pair] = set()
        self._partitioned = False
        self._closed = False
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def start(self) -> TcpProxy:
        self._listener = self._listen()
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"proxy-{self.port}")
        self._thread.start()
        return self

    def partition(self, new: NewConnections = "hang") -> int:
        """Drop every open connection; make new ones hang (until `heal`) or be refused.
        Returns how many connections were dropped."""
        with self._cond:
            self._partitioned = True
            pairs, self._pairs = list(self._pairs), set()
            if new == "refuse" and self._listener is not None:
                _close_listener(self._listener)
                self._listener = None
        for pair in pairs:
            pair.close()
        self.stats.dropped += len(pairs)
        return len(pairs)

    def heal(self) -> None:
        """Let connections through again (held ones go through now)."""
        with self._cond:
            if self._listener is None and not self._closed:
                self._listener = self._listen()
            self._partitioned = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pairs, self._pairs = list(self._pairs), set()
            if self._listener is not None:
                _close_listener(self._listener)
                self._listener = None
            self._cond.notify_all()
        for pair in pairs:
            pair.close()
        if self._thread is not None:
            self._thread.join(2)

    # --- internals ------------------------------------------------------------------------

    def _listen(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(256)
        sock.settimeout(0.2)
        return sock

    def _accept_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                listener = self._listener
                if listener is None:
                    self._cond.wait(0.2)
                    continue
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue  # timeout, or the listener was closed by partition(new="refuse")
            client.settimeout(None)
            self.stats.accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name=f"proxy-{self.port}-conn").start()

    def _serve(self, client: socket.socket) -> None:
        with self._cond:
            if self._partitioned:
                self.stats.held += 1
            while self._partitioned and not self._closed:
                self._cond.wait()
            if self._closed:
                client.close()
                return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            # Postgres itself is down: the client sees its connection closed.
            self.stats.upstream_failures += 1
            client.close()
            return
        upstream.settimeout(None)
        pair = _Pair(client, upstream)
        with self._cond:
            if self._partitioned or self._closed:
                late = True
            else:
                late = False
                self._pairs.add(pair)
        if late:
            pair.close()
            return
        threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True,
                         name=f"proxy-{self.port}-down").start()
        self._pump(client, upstream, pair)

    def _pump(self, src: socket.socket, dst: socket.socket, pair: _Pair) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            pair.close()
            with self._cond:
                self._pairs.discard(pair)


def _close_listener(sock: socket.socket) -> None:
    """Stop listening now: shutdown() wakes a thread blocked in accept() on Linux, and only
    then does the kernel stop completing handshakes (close alone waits for that thread)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
