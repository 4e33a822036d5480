"""tock's error vocabulary. Lower-library errors (psycopg, botocore) are translated once,
at their boundary (`shared.store`, `shared.transport`), into these; nothing above those
layers sees a raw psycopg or botocore exception.

    TockError
    ├── InvalidInput (ValueError)      bad argument to a public entry point; nothing written
    │   ├── InvalidSchedule            a recurring schedule that cannot be used
    │   └── InvalidMessage             an SQS message that is not a tock message
    ├── ConfigError                    settings that cannot work together
    ├── JobNotFound (LookupError)
    ├── ScheduleNotFound (LookupError)
    ├── InvalidTransition              the job is not in a state that allows the operation
    ├── FenceError                     a guarded transition matched no row
    │   ├── LeaseLost                  the worker no longer owns the job (expired, cancelled)
    │   └── StaleMessage               the message's dispatch token is not the job's current one
    ├── TransportError                 SQS answered with an error or could not be reached
    │   └── QueueMissing               the SQS queue does not exist (deleted, never created)
    └── DatabaseError                  a statement failed; the subclass says what to do
        ├── Retryable                  transient: the same work may succeed if run again
        │   ├── DatabaseUnavailable    connection lost or refused, server shutting down
        │   │   ├── ConnectionLost     lost while a statement was in flight: it may have
        │   │   │                      committed (a write's outcome is unknown)
        │   │   └── DatabaseReadOnly   the server is a standby, or a primary demoted by a
        │   │                          failover: nothing was written; reconnecting heals it
        │   └── LockTimeout            lock_timeout expired waiting for a row lock
        ├── DataRejected               Postgres refused a value (out of range, NUL, bad text)
        ├── DatabaseClosed             the pool (a Client) was closed and then used
        └── DatabaseBug                the statement itself is wrong: a bug in tock

Loops survive `Retryable` (they back off and go on) and `TransportError`; a `DataRejected`
is the input's fault and is handled where the input came from (a poison message is
dropped); `DatabaseBug` and anything else unexpected stop the process so its orchestrator
restarts it (`shared.runtime.supervisor`).

Handlers raise these to steer retries:

    Permanent                          do not retry: the job goes to `dead` now
    RetryAfter                         retry after the given delay (counts as an attempt;
                                       not a finite number >= 0: the usual backoff)
"""

from __future__ import annotations


class TockError(Exception):
    """Base of every error tock raises."""


class InvalidInput(TockError, ValueError):
    """An argument to a public entry point is not acceptable; nothing was written."""


class InvalidSchedule(InvalidInput):
    """A recurring schedule definition cannot be used."""


class InvalidMessage(InvalidInput):
    """An SQS message body is not a tock message."""


class ConfigError(TockError):
    """Settings are missing, malformed or inconsistent."""


class JobNotFound(TockError, LookupError):
    """No job with that id (or key)."""


class ScheduleNotFound(TockError, LookupError):
    """No schedule with that name."""


class InvalidTransition(TockError):
    """The job's current state does not allow the operation (e.g. retry a running job)."""


class FenceError(TockError):
    """A guarded state transition matched no row."""


class LeaseLost(FenceError):
    """The worker's lease is gone (expired and taken over, cancelled, or released)."""


class StaleMessage(FenceError):
    """An SQS message whose dispatch token is not the job's current one."""


class TransportError(TockError):
    """SQS returned an error or could not be reached."""


class QueueMissing(TransportError):
    """The SQS queue for a tock queue does not exist."""


class DatabaseError(TockError):
    """A database statement failed. `sqlstate` is Postgres' error code when it sent one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Retryable(DatabaseError):
    """A transient failure: deadlock, serialization failure, statement or lock timeout, too
    many connections, or the connection itself. Running the same work again may succeed."""


class DatabaseUnavailable(Retryable):
    """Postgres could not be reached, or the connection was lost."""


class ConnectionLost(DatabaseUnavailable):
    """The connection was lost after a statement was sent (a crash, a cut network): the
    statement may or may not have been committed. Unlike a connection that could not be
    had, this does not mean that nothing was written."""


class DatabaseReadOnly(DatabaseUnavailable):
    """The server refused a write as read-only (SQLSTATE 25006): a standby, or a primary
    demoted by a failover, reached through a stale DNS answer or an old connection. Nothing
    was written. The connection is dropped, so the next one goes where the URL leads now."""


class LockTimeout(Retryable):
    """A row lock was not granted within the statement's lock_timeout."""


class DataRejected(DatabaseError):
    """Postgres refused a value: out of range, invalid text, a NUL byte, a constraint."""


class DatabaseClosed(DatabaseError):
    """The pool (a `Client`) was closed and then used: not transient, make a new one."""


class DatabaseBug(DatabaseError):
    """The statement itself is wrong (syntax, an unknown column): a bug, not an outage."""


class GivingUp(TockError):
    """A loop found that its process cannot do its work again until it restarts (every
    handler slot held by a stuck thread, say), and stops it on purpose: exit non-zero for
    the orchestrator, logged as the reason it is, not as a crash with a traceback."""


class Permanent(Exception):
    """Raise from a handler for a failure that no retry can fix: the job goes dead now."""


class RetryAfter(Exception):
    """Raise from a handler to retry after `seconds` instead of the computed backoff.

    `seconds` is a finite number, 0 or more (at most 7 days are used). Anything else (None,
    a string, NaN, an infinity, a negative number) is not an error here: the attempt is
    retried with the usual backoff and its error text names the value given."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"retry requested in {seconds} s")
        self.seconds = seconds
