"""What an operator changed through the CLI, as log lines: the events the dashboard writes
for the same actions (`job_enqueued`, `job_retried`, `job_cancelled`, `bulk_retry`,
`bulk_cancel`, `schedule_paused`, `schedule_resumed`, `schedule_deleted`, `limit_set`,
`limit_removed`, `tenant_weight_set`), with `via="cli"` and the OS user instead of a role.

They go to stderr, in `TOCK_LOG_FORMAT`, only when `TOCK_LOG_LEVEL` is set (INFO or DEBUG
shows them): by default a command prints what it did and nothing else, and a wrapper that
keeps an audit trail (a bastion's session log, a CI job) sets the variable."""

from __future__ import annotations

import getpass
import logging
import os
from typing import Any

from shared.core.errors import ConfigError
from shared.runtime.logs import configure, emit

log = logging.getLogger("tock.cli")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("json", "human")


def configure_from_environment() -> None:
    """Log to stderr if TOCK_LOG_LEVEL is set; ConfigError for a value it cannot be."""
    level = os.environ.get("TOCK_LOG_LEVEL")
    if level is None:
        return
    fmt = os.environ.get("TOCK_LOG_FORMAT", "json")
    if level.upper() not in LEVELS:
        raise ConfigError(f"TOCK_LOG_LEVEL must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ConfigError(f"TOCK_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {fmt!r}")
    configure(fmt, level.upper(), "cli")
    # The pool's reconnection warnings would repeat what the command's one error line says.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


def action(event: str, **fields: Any) -> None:
    """Log one change made by this command."""
    emit(log, event, logging.INFO, via="cli", user=_user(), **fields)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return f"uid {os.getuid()}"
