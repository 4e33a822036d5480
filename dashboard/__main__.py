"""`python -m dashboard`: serve the dashboard and the HTTP API with uvicorn.

A setting that cannot work, the listening address included (a port taken, a host that
does not resolve), stops it at once with one line (exit 2); an unusable database with
exit 3 (2 for missing migrations)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from dashboard.settings import DashboardSettings
from shared.core.errors import ConfigError
from shared.core.text import decimal_integer
from shared.runtime.command_line import Parser
from shared.runtime.health import cannot_listen
from shared.runtime.logs import configure, emit
from shared.runtime.startup import EXIT_CONFIG, database_problem, warn_unknown_settings

log = logging.getLogger("tock.dashboard")


def _drop_color_message(record: logging.LogRecord) -> bool:
    # uvicorn attaches an ANSI-coloured copy of each message; structured logs want one.
    record.__dict__.pop("color_message", None)
    return True


def port_number(value: str) -> int:
    """`--port`: a TCP port, 1-65535 (0 would listen on a port nobody is told of)."""
    try:
        port = decimal_integer(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound as uvicorn binds one (which, on failure, logs a traceback's worth
    and exits 3, the code for "Postgres unavailable"); uvicorn listens on it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None, prog: str = "python -m dashboard") -> int:
    parser = Parser(
        prog=prog,
        description="Serve tock's dashboard, HTTP API, /metrics, /healthz and /readyz. "
                    "Settings come from TOCK_* environment variables "
                    "(TOCK_DASHBOARD_HOST, _PORT, _OPERATOR_TOKEN, _VIEWER_TOKEN, "
                    "_SECRET_KEY, _ALLOWED_HOSTS, _MAX_BODY_BYTES, _METRICS_TOKEN, "
                    "_METRICS_PUBLIC).")
    parser.add_argument("--host", help="default TOCK_DASHBOARD_HOST or 127.0.0.1")
    parser.add_argument("--port", type=port_number,
                        help="default TOCK_DASHBOARD_PORT or 8080")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {}
    if args.host:
        overrides["dashboard_host"] = args.host
    if args.port is not None:
        overrides["dashboard_port"] = args.port
    try:
        settings = DashboardSettings.load(**overrides)
    except ConfigError as exc:
        print(f"tock dashboard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure(settings.log_format, settings.log_level, "dashboard")
    warn_unknown_settings()
    host, port = settings.dashboard_host, settings.dashboard_port
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        refusal = cannot_listen(exc, host, port, host_setting=(
            "--host" if args.host else "TOCK_DASHBOARD_HOST"), port_setting=(
            "--port" if args.port is not None else "TOCK_DASHBOARD_PORT"))
        print(f"tock dashboard: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    with sock:
        return _serve(settings, sock)


def _serve(settings: DashboardSettings, sock: socket.socket) -> int:
    problem = database_problem(settings.database_url)
    if problem:
        print(f"tock dashboard: {problem[1]}", file=sys.stderr)
        return problem[0]
    logging.getLogger("uvicorn.error").addFilter(_drop_color_message)
    import uvicorn

    from dashboard.app import create_app

    app = create_app(settings)
    if not settings.loopback_only:
        print(f"tock dashboard: listening on {settings.dashboard_host}, not only loopback: "
              "put TLS in front and set TOCK_DASHBOARD_SECURE_COOKIES=1; answering to "
              f"Host {', '.join(settings.dashboard_allowed_hosts or [])} "
              "(TOCK_DASHBOARD_ALLOWED_HOSTS)", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    emit(log, "dashboard_listening", host=settings.dashboard_host,
         port=sock.getsockname()[1])
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
