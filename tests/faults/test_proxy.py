"""The partition proxy against a local echo server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.proxy import TcpProxy
from tests.faults.waiting import wait_until

pytestmark = pytest.mark.faults


class Echo:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)


@pytest.fixture
def proxy() -> Iterator[tuple[TcpProxy, Echo]]:
    echo = Echo()
    p = TcpProxy(echo.port).start()
    yield p, echo
    p.close()
    echo.sock.close()


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    return sock.recv(1024)


def test_forwards_then_drops_open_connections_and_holds_new_ones(proxy):
    p, echo = proxy
    old = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    assert roundtrip(old) == b"ping"
    assert p.partition("hang") == 1
    assert old.recv(1024) == b"", "the open connection is cut"
    new = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    new.sendall(b"held")
    wait_until(lambda: p.stats.held == 1, 5, "the new connection to be held")
    assert echo.accepted == 1, "nothing reached the server during the partition"
    p.heal()
    assert new.recv(1024) == b"held", "the held connection goes through after heal"
    assert roundtrip(socket.create_connection(("127.0.0.1", p.port), timeout=5)) == b"ping"


def test_refuse_mode_refuses_until_healed(proxy):
    p, _ = proxy
    p.partition("refuse")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", p.port), timeout=5)
    p.heal()
    assert roundtrip(socket.create_connection(("127.0.0.1", p.port), timeout=5)) == b"ping"
