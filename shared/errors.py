"""tock's error vocabulary. Lower-library errors (psycopg, botocore) are translated once,
at the adapter boundary, into these.

    TockError
    ├── InvalidInput (ValueError)      bad argument to a public entry point; nothing written
    │   ├── InvalidSchedule            a recurring schedule that cannot be used
    │   └── InvalidMessage             an SQS message that is not a tock message
    ├── ConfigError                    settings that cannot work together
    ├── JobNotFound (LookupError)
    ├── InvalidTransition              the job is not in a state that allows the operation
    ├── FenceError                     a guarded transition matched no row
    │   ├── LeaseLost                  the worker no longer owns the job (expired, cancelled)
    │   └── StaleMessage               the message's dispatch token is not the job's current one
    ├── TransportError                 SQS answered with an error or could not be reached
    └── DatabaseUnavailable            Postgres could not be reached

Handlers raise these to steer retries:

    Permanent                          do not retry: the job goes to `dead` now
    RetryAfter                         retry after the given delay (counts as an attempt)
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


class DatabaseUnavailable(TockError):
    """Postgres could not be reached."""


class Permanent(Exception):
    """Raise from a handler for a failure that no retry can fix: the job goes dead now."""


class RetryAfter(Exception):
    """Raise from a handler to retry after `seconds` instead of the computed backoff."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"retry requested in {seconds} s")
        self.seconds = seconds
