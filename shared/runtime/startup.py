"""Checks a process makes before it starts its loops, so that a wrong setting stops it
within seconds with a message naming the variable and the cause, instead of a traceback
or a loop that fails forever."""

from __future__ import annotations

import logging
import os

from shared.core.errors import QueueMissing, TransportError
from shared.runtime.logs import emit
from shared.runtime.settings import unknown_variables
from shared.store.database import probe, redacted, server_refusal, url_refused
from shared.store.migrate import missing_migrations
from shared.transport.base import Transport

log = logging.getLogger("tock.startup")

EXIT_CONFIG, EXIT_UNAVAILABLE = 2, 3

def database_problem(url: str) -> tuple[int, str] | None:
    """(exit code, message) if the process cannot use the database at `url`, else None."""
    reason = probe(url, timeout=5.0)
    if reason is not None:
        refusal = server_refusal(reason)
        if refusal is not None:  # the URL is right: the server is full or read-only
            return EXIT_UNAVAILABLE, (f"cannot use the database at {redacted(url)}: {reason} "
                                      f"({refusal})")
        if url_refused(reason):  # a wrong option, user or password: retrying will not help
            return EXIT_CONFIG, (f"TOCK_DATABASE_URL: the database at {redacted(url)} refuses "
                                 f"what the URL asks for: {reason}")
        return EXIT_UNAVAILABLE, f"TOCK_DATABASE_URL: cannot use {redacted(url)}: {reason}"
    pending = missing_migrations(url)
    if pending:
        return EXIT_CONFIG, (f"TOCK_DATABASE_URL: the database at {redacted(url)} lacks "
                             f"migration(s) {', '.join(pending)}: run `tock migrate` first")
    return None


def report_missing_queues(transport: Transport, queues: list[str]) -> None:
    """Say once, clearly, which SQS queues are missing at start (the loops keep retrying,
    so a queue created later is used at once). A transport made with `create_missing`
    creates them here instead."""
    for queue in queues:
        try:
            transport.check(queue)
        except QueueMissing as exc:
            emit(log, "queue_missing", logging.ERROR, queue=queue, error=str(exc),
                 detail="create it (infra/ templates), or set TOCK_CREATE_QUEUES=1 for a "
                        "local stack; receiving is retried until it exists")
        except TransportError as exc:
            emit(log, "sqs_unavailable", logging.ERROR, queue=queue, error=str(exc),
                 detail="check AWS_ENDPOINT_URL_SQS / credentials; retried until it answers")


def warn_unknown_settings() -> None:
    """Log each TOCK_* environment variable no tock process reads: a mistyped setting is
    otherwise silent, and its default stays in force."""
    for name, near in unknown_variables(os.environ):
        emit(log, "unknown_setting", logging.WARNING, variable=name,
             detail=(f"no tock process reads it; did you mean {near}?" if near else
                     "no tock process reads it; see the README's Configuration"))
