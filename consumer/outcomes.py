"""What a handler's return or exception means for its job.

Every outcome is storable: error texts and tracebacks are made safe for Postgres (NUL
bytes, lone surrogates) and bounded including any suffix, and a `RetryAfter` delay is
checked (a finite number, 0 or more, capped at MAX_RETRY_AFTER_SECONDS; anything else is
noted in the error and the usual backoff applies), so no handler can produce an outcome
the completer cannot write.
"""

from __future__ import annotations

import math
import traceback as tb
from dataclasses import dataclass
from typing import Any

from consumer.inflight import InFlight
from consumer.tasks import Abandon
from shared.core.backoff import backoff_seconds
from shared.core.errors import Permanent, RetryAfter
from shared.core.states import AttemptOutcome, JobState
from shared.core.text import bounded, describe
from shared.store.rows import AttemptResult

MAX_ERROR_CHARS = 2000
MAX_TRACEBACK_CHARS = 20000
MAX_RETRY_AFTER_SECONDS = 7 * 86400.0
"""The longest delay a handler may ask for with `RetryAfter`; longer requests are capped."""


@dataclass(frozen=True)
class Finished:
    """An attempt's result (fenced on the item's lease), waiting to be written and its
    message deleted."""

    item: InFlight
    result: AttemptResult
    run_seconds: float = 0.0


@dataclass(frozen=True)
class Raised:
    """What a handler raised, as plain data. It is judged the same way wherever the handler
    ran: in a thread, on the event loop, or in a handler process (whence it crossed a pipe,
    so it holds no exception object)."""

    text: str
    """`Type: message`."""
    traceback: str | None = None
    permanent: bool = False
    abandon: bool = False
    retry_after: bool = False
    delay: float | None = None
    """The delay a `RetryAfter` asked for, when that was a usable number (finite, 0 or
    more; capped)."""
    asked: str = ""
    """What a `RetryAfter` was given (its repr, cut to 40 characters), for the error text."""

    @classmethod
    def of(cls, exc: BaseException) -> Raised:
        if not isinstance(exc, RetryAfter):
            return cls(describe(exc), _traceback(exc), permanent=isinstance(exc, Permanent),
                       abandon=isinstance(exc, Abandon))
        try:
            asked = f"{exc.seconds!r:.40}"
        except BaseException:  # a broken __repr__ of the handler's own object
            asked = f"<{type(exc.seconds).__name__}>"
        return cls(describe(exc), _traceback(exc), retry_after=True,
                   delay=retry_after_seconds(exc.seconds), asked=asked)


@dataclass(frozen=True)
class Backoff:
    """How retries are spaced: exponential from `base_seconds`, at most `cap_seconds`;
    an unknown kind waits from `unknown_kind_seconds` (a rolling deploy takes minutes)."""

    base_seconds: float
    cap_seconds: float
    unknown_kind_seconds: float


def _finished(item: InFlight, state: JobState, outcome: AttemptOutcome, *,
              run_seconds: float = 0.0, error: str | None = None, traceback: str | None = None,
              **result: Any) -> Finished:
    return Finished(item, AttemptResult(
        item.lease, state, outcome,
        error=None if error is None else bounded(error, MAX_ERROR_CHARS),
        traceback=None if traceback is None else bounded(traceback, MAX_TRACEBACK_CHARS,
                                                         keep="tail"),
        **result), run_seconds)


def succeeded(item: InFlight, run_seconds: float) -> Finished:
    return _finished(item, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, run_seconds=run_seconds)


def no_handler(item: InFlight, known: list[str], backoff: Backoff) -> Finished:
    """No handler for the kind here: retried with backoff (another consumer may have it,
    e.g. during a rolling deploy), dead after the last attempt."""
    ctx = item.context
    text = (f"no handler for kind {ctx.kind!r} in this consumer (it knows: "
            f"{', '.join(known) or 'nothing'}); check --tasks and the job's queue")
    if ctx.attempt >= ctx.max_attempts:
        return _finished(item, JobState.DEAD, AttemptOutcome.NO_HANDLER,
                         error=bounded(text, MAX_ERROR_CHARS, _giving_up(item)))
    delay = backoff_seconds(ctx.attempt, base=backoff.unknown_kind_seconds,
                            cap=max(backoff.cap_seconds, backoff.unknown_kind_seconds))
    return _finished(item, JobState.RETRYING, AttemptOutcome.NO_HANDLER, delay_seconds=delay,
                     error=text)


def released(item: InFlight) -> Finished:
    """Shutdown before the handler finished: due again at once, attempt given back."""
    state = JobState.RETRYING if item.attempt > 1 else JobState.SCHEDULED
    return _finished(item, state, AttemptOutcome.RELEASED, refund=True)


def outcome_of(item: InFlight, raised: Raised | None, run_seconds: float, backoff: Backoff
               ) -> Finished:
    """The outcome of a handler that returned (`raised` None) or raised."""
    if raised is not None:
        return failure(item, raised, run_seconds, backoff)
    if item.timed_out:
        return failed(item, TimedOut("returned after its deadline"), run_seconds, backoff)
    return succeeded(item, run_seconds)


def failed(item: InFlight, exc: BaseException, run_seconds: float, backoff: Backoff
           ) -> Finished:
    """A raised exception (or a timeout) -> retrying with backoff, or dead."""
    return failure(item, Raised.of(exc), run_seconds, backoff)


def failure(item: InFlight, raised: Raised, run_seconds: float, backoff: Backoff) -> Finished:
    """What a handler raised -> retrying with backoff, or dead."""
    ctx = item.context
    text = raised.text
    trace = raised.traceback
    if raised.permanent:
        return _finished(item, JobState.DEAD, AttemptOutcome.PERMANENT, error=text,
                         traceback=trace, run_seconds=run_seconds)
    outcome = AttemptOutcome.FAILED
    if item.timed_out:
        outcome = AttemptOutcome.TIMED_OUT
        text = f"timed out after {item.timeout_seconds:g} s ({text})"
    if ctx.attempt >= ctx.max_attempts:
        return _finished(item, JobState.DEAD, outcome,
                         error=bounded(text, MAX_ERROR_CHARS, _giving_up(item)),
                         traceback=trace, run_seconds=run_seconds)
    delay = backoff_seconds(ctx.attempt, base=backoff.base_seconds, cap=backoff.cap_seconds)
    if raised.retry_after:
        if raised.delay is None:
            text = bounded(text, MAX_ERROR_CHARS,
                           f" [RetryAfter needs a number of seconds (finite, 0 or more), got "
                           f"{raised.asked}; retrying with the usual backoff]")
        else:
            delay = raised.delay
    return _finished(item, JobState.RETRYING, outcome, delay_seconds=delay, error=text,
                     traceback=trace, run_seconds=run_seconds)


def retry_after_seconds(value: object) -> float | None:
    """The delay a `RetryAfter` asks for, at most MAX_RETRY_AFTER_SECONDS; None when it is
    not a finite number of 0 or more (a string, None, NaN, an infinity, a negative delay):
    then the usual backoff applies and the error says what was asked."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float: finite, so capped if positive
        return None if value < 0 else MAX_RETRY_AFTER_SECONDS
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _giving_up(item: InFlight) -> str:
    return f" [attempt {item.context.attempt} of {item.context.max_attempts}, giving up]"


def _traceback(exc: BaseException) -> str:
    try:
        return "".join(tb.format_exception(exc))
    except BaseException:
        # Formatting calls the exception's own code, which may raise anything (SystemExit
        # included): the frames, then its name.
        try:
            return "".join(tb.format_tb(exc.__traceback__)) + describe(exc)
        except BaseException:
            return describe(exc)


class TimedOut(Exception):
    """Stands for a handler that returned only after its deadline."""
