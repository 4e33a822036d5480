"""`python -m dashboard`: serve the dashboard and the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from shared.core.errors import ConfigError
from shared.runtime.logs import configure
from shared.runtime.startup import database_problem


def _drop_color_message(record: logging.LogRecord) -> bool:
    # uvicorn attaches an ANSI-coloured copy of each message; structured logs want one.
    record.__dict__.pop("color_message", None)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard",
        description="Serve tock's dashboard, HTTP API, /metrics, /healthz and /readyz. "
                    "Settings come from TOCK_* environment variables "
                    "(TOCK_DASHBOARD_HOST, _PORT, _OPERATOR_TOKEN, _VIEWER_TOKEN, "
                    "_SECRET_KEY, _ALLOWED_HOSTS, _MAX_BODY_BYTES, _METRICS_TOKEN, "
                    "_METRICS_PUBLIC).")
    parser.add_argument("--host", help="default TOCK_DASHBOARD_HOST or 127.0.0.1")
    parser.add_argument("--port", type=int, help="default TOCK_DASHBOARD_PORT or 8080")
    args = parser.parse_args(argv)
    from dashboard.settings import DashboardSettings

    overrides: dict[str, object] = {}
    if args.host:
        overrides["dashboard_host"] = args.host
    if args.port is not None:
        overrides["dashboard_port"] = args.port
    try:
        settings = DashboardSettings.load(**overrides)
    except ConfigError as exc:
        print(f"tock dashboard: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level, "dashboard")
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
    uvicorn.run(app, host=settings.dashboard_host, port=settings.dashboard_port,
                log_config=None, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
