"""Structured logs: every line carries a stable `event` key plus fields such as job_id,
attempt and worker. JSON for machines (the default); a one-line human format for `make run`.

    from shared.runtime.logs import emit
    emit(log, "job_succeeded", job_id=12, kind="email", attempt=1, seconds=0.004)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from shared.store.pool_log import hush_pool_repeats

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def emit(logger: logging.Logger, event: str, level: int = logging.INFO, *,
         exc_info: bool = False, **fields: Any) -> None:
    """Log one event. The message is the event name; the fields travel as structured data."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "fields": fields}, exc_info=exc_info)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = dict(getattr(record, "fields", {}) or {})
    if hasattr(record, "event"):
        return fields  # emit() put everything in `fields`
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key not in ("fields", "event"):
            fields[key] = value
    return fields


@functools.lru_cache(maxsize=4)
def _second(whole: int) -> str:
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _timestamp(created: float) -> str:
    """ISO 8601 UTC to the millisecond; the date and time are formatted once a second."""
    whole = int(created)
    return f"{_second(whole)}.{int((created - whole) * 1000):03d}+00:00"


_ENCODER = json.JSONEncoder(default=str)
"""One encoder: `json.dumps` with an argument builds a new one per line."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
        }
        if not getattr(record, "event", None):
            out["message"] = record.getMessage()
        out.update(_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(out)


class HumanFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]  # noqa: DTZ006
        event = getattr(record, "event", None) or record.getMessage()
        if "\n" in event:  # libpq's hints come on lines of their own: one entry, one line
            event = " ".join(event.split())
        fields = " ".join(f"{k}={_short(v, whole=k == 'detail')}"
                          for k, v in _fields(record).items())
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        line = f"{ts} {self.process_name:<10} {level}{event:<22} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _short(value: Any, *, whole: bool = False) -> str:
    """A field's value on one line, cut at 120 characters unless `whole` (a `detail`,
    which says what to do, and is no use cut short)."""
    text = str(value)
    if not text or any(c.isspace() for c in text):
        text = json.dumps(text)
    return text if whole or len(text) <= 120 else text[:117] + "..."



_held = threading.local()


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler whose lines a thread can hold while it logs a batch (`one_write`)
    and then write with one call. A consumer logs a line per finished job; a write per
    line is a system call each, and in a busy process a thread switch each."""

    def emit(self, record: logging.LogRecord) -> None:
        held: list[tuple[LineHandler, str, logging.LogRecord]] | None = getattr(
            _held, "lines", None)
        if held is None:
            super().emit(record)
            return
        try:
            held.append((self, self.format(record), record))
        except Exception:  # what logging does with a record it cannot format
            self.handleError(record)

    def write_lines(self, lines: list[str], first: logging.LogRecord) -> None:
        """Write `lines` with one write and one flush; a stream that fails is reported as
        logging reports it (`handleError`), never raised into the caller."""
        self.acquire()
        try:
            self.stream.write(self.terminator.join(lines) + self.terminator)
            self.flush()
        except Exception:
            self.handleError(first)
        finally:
            self.release()


@contextlib.contextmanager
def one_write() -> Iterator[None]:
    """Hold this thread's log lines (of `LineHandler`s) until the block ends, then write
    them at once: for a loop that logs a line per item of a batch. The lines are held for
    as long as the block runs, so keep it to the logging of one batch."""
    if getattr(_held, "lines", None) is not None:
        yield  # nested: the outer block writes
        return
    held: list[tuple[LineHandler, str, logging.LogRecord]] = []
    _held.lines = held
    try:
        yield
    finally:
        _held.lines = None
        by_handler: dict[LineHandler, tuple[list[str], logging.LogRecord]] = {}
        for handler, line, record in held:
            by_handler.setdefault(handler, ([], record))[0].append(line)
        for handler, (lines, first) in by_handler.items():
            handler.write_lines(lines, first)


def line_handler(stream: TextIO, fmt: str, process_name: str) -> LineHandler:
    """A `LineHandler` on `stream` with the formatter of `fmt`."""
    handler = LineHandler(stream)
    handler.setFormatter(formatter(fmt, process_name))
    return handler


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
    handler = line_handler(sys.stderr, fmt, process_name)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    hush_pool_repeats()
    # asyncio says which selector it uses at DEBUG, once per event loop: not tock's news.
    logging.getLogger("asyncio").setLevel(logging.INFO)
