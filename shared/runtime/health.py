"""Probes for container platforms: a tiny HTTP server thread that the timer and consumer
start when `TOCK_HEALTH_PORT` is set.

    GET /healthz   liveness: 200 while every loop runs and none is stuck; restart it if not
    GET /readyz    readiness: 200 while the loops that gate it succeeded recently
    GET /metrics   this process's Prometheus metrics: its own, the ones both processes
                   increment, and the process and platform collectors, never the other
                   process's (shared.runtime.metrics.exported_by)

The probes are the process's `Supervisor.live` and `.ready` (shared.runtime.supervisor).
Liveness deliberately ignores Postgres and SQS: restarting a process does not fix an
outage, so an outage shows as "not ready" only. The server binds `TOCK_HEALTH_HOST`
(default 0.0.0.0, since the platform probes the container's own address) and answers
nothing else.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared.core.errors import ConfigError
from shared.runtime.logs import emit
from shared.runtime.metrics import exported_by
from shared.runtime.settings import HealthSettings

log = logging.getLogger("tock.health")

Probe = Callable[[], tuple[bool, str]]
"""Returns (ok, reason in words)."""


def _starting() -> tuple[bool, str]:
    return False, "starting"


def _alive_starting() -> tuple[bool, str]:
    # Live while it checks Postgres and SQS at start: that check ends within seconds
    # (the process goes on, or exits 3 to be restarted), and failing liveness for an
    # outage would only have the platform restart it over and over.
    return True, "starting"


def cannot_listen(exc: OSError, host: str, port: int, *, host_setting: str,
                  port_setting: str) -> ConfigError:
    """A failed bind as one line naming the setting to change: the host for a name that
    does not resolve or an address this machine does not have, else the port (taken,
    or privileged)."""
    host_at_fault = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
    setting = host_setting if host_at_fault else port_setting
    return ConfigError(f"{setting}: cannot listen on {host}:{port}: "
                       f"{exc.strerror or exc}")


class HealthServer:
    """Serves the probes on a daemon thread once started; `close()` stops it. `process`
    ("timer", "consumer") also chooses the metrics /metrics exports (any other name: all
    of them).

    Made, it already listens (`ConfigError`, naming TOCK_HEALTH_PORT or _HOST, if it
    cannot), so a process binds and starts it before it touches Postgres or SQS and sets
    `live` and `ready` once its loops exist; until then both answer "starting", live and
    not ready. A port that listens without answering would read as a hung process."""

    def __init__(self, port: int, *, live: Probe = _alive_starting, ready: Probe = _starting,
                 host: str | None = None, process: str = "tock") -> None:
        self.live, self.ready, self.process = live, ready, process
        self.metrics = exported_by(process)
        bind = host if host is not None else HealthSettings().host
        try:
            self._server = ThreadingHTTPServer((bind, port), self._handler())
        except OSError as exc:
            raise cannot_listen(exc, bind, port, host_setting="TOCK_HEALTH_HOST",
                                port_setting="TOCK_HEALTH_PORT") from None
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="tock-health", daemon=True)

    def start(self) -> HealthServer:
        if self._thread.is_alive():
            return self
        self._thread.start()
        emit(log, "health_server_started", process=self.process, port=self.port)
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever for a loop never run
            self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            head_only = False

            def do_HEAD(self) -> None:
                self.head_only = True
                self.do_GET()

            def _not_allowed(self) -> None:
                # Plain text like every other answer here, not http.server's HTML 501 page.
                self._send(405, f"{self.command} not allowed: GET (or HEAD) /healthz, "
                                "/readyz or /metrics\n".encode(), allow="GET, HEAD")

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server.metrics), CONTENT_TYPE_LATEST)
                    return
                probe = {"/healthz": server.live, "/readyz": server.ready}.get(path)
                if probe is None:
                    self._send(404, b"not found: try /healthz, /readyz or /metrics\n")
                    return
                try:
                    ok, reason = probe()
                except Exception as exc:  # a probe that fails is a failed probe
                    ok, reason = False, f"probe failed: {exc}"
                self._send(200 if ok else 503, f"{'ok' if ok else 'not ok'}: {reason}\n"
                           .encode())

            def _send(self, status: int, body: bytes,
                      content_type: str = "text/plain; charset=utf-8",
                      allow: str | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if allow:
                    self.send_header("Allow", allow)
                try:
                    self.end_headers()
                    if not self.head_only:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the prober gave up first (its timeout): nothing to tell it

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the structured logs

        return Handler
