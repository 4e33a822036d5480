"""Structured logs: every line carries a stable `event` key plus fields such as job_id,
attempt and worker. JSON for machines (the default); a one-line human format for `make run`.

    from shared.runtime.logs import emit
    emit(log, "job_succeeded", job_id=12, kind="email", attempt=1, seconds=0.004)
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def emit(logger: logging.Logger, event: str, level: int = logging.INFO, *,
         exc_info: bool = False, **fields: Any) -> None:
    """Log one event. The message is the event name; the fields travel as structured data."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "fields": fields}, exc_info=exc_info)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = dict(getattr(record, "fields", {}) or {})
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key not in ("fields", "event"):
            fields[key] = value
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
        }
        if not getattr(record, "event", None):
            out["message"] = record.getMessage()
        out.update(_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class HumanFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]  # noqa: DTZ006
        event = getattr(record, "event", None) or record.getMessage()
        fields = " ".join(f"{k}={_short(v)}" for k, v in _fields(record).items())
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        line = f"{ts} {self.process_name:<10} {level}{event:<22} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _short(value: Any) -> str:
    text = str(value)
    if " " in text or not text:
        text = json.dumps(text)
    return text if len(text) <= 120 else text[:117] + "..."


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
        key = (str(record.msg), str(first))
        now = record.created
        if now - self._last.get(key, -self.seconds) < self.seconds:
            return False
        self._last[key] = now
        return True


REPEAT_SECONDS = 30.0


def formatter(fmt: str, process_name: str) -> logging.Formatter:
    """The formatter of `TOCK_LOG_FORMAT` (json or human)."""
    name = os.environ.get("TOCK_PROCESS_NAME", process_name)
    return JsonFormatter() if fmt == "json" else HumanFormatter(name)


def lean_records() -> None:
    """Skip what every log record would otherwise look up and no tock line prints: the
    caller's file and line (a walk up the stack), the thread and process names (the
    logging HOWTO's "Optimization" settings). A consumer logs a line per finished job."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure(fmt: str, level: str, process_name: str) -> None:
    """Send every tock log line to stderr in the chosen format."""
    lean_records()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, process_name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    pool = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, Repeats) for f in pool.filters):
        pool.addFilter(Repeats(REPEAT_SECONDS))
    # asyncio says which selector it uses at DEBUG, once per event loop: not tock's news.
    logging.getLogger("asyncio").setLevel(logging.INFO)
