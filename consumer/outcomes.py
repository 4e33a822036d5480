"""What a handler's return or exception means for its job."""

from __future__ import annotations

import traceback as tb
from dataclasses import dataclass
from typing import Any

from consumer.inflight import InFlight
from shared.core.backoff import backoff_seconds
from shared.core.errors import Permanent, RetryAfter
from shared.core.states import AttemptOutcome, JobState
from shared.store.rows import AttemptResult

MAX_ERROR_CHARS = 2000
MAX_TRACEBACK_CHARS = 20000


@dataclass(frozen=True)
class Finished:
    """An attempt's result (fenced on the item's lease), waiting to be written and its
    message deleted."""

    item: InFlight
    result: AttemptResult
    run_seconds: float = 0.0


def _finished(item: InFlight, state: JobState, outcome: AttemptOutcome, *,
              run_seconds: float = 0.0, **result: Any) -> Finished:
    return Finished(item, AttemptResult(item.lease, state, outcome, **result), run_seconds)


def succeeded(item: InFlight, run_seconds: float) -> Finished:
    return _finished(item, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, run_seconds=run_seconds)


def no_handler(item: InFlight, known: list[str]) -> Finished:
    return _finished(
        item, JobState.DEAD, AttemptOutcome.NO_HANDLER,
        error=f"no handler for kind {item.context.kind!r} in this consumer "
              f"(it knows: {', '.join(known) or 'nothing'}); check --tasks and the job's queue",
    )


def released(item: InFlight) -> Finished:
    """Shutdown before the handler finished: due again at once, attempt given back."""
    state = JobState.RETRYING if item.attempt > 1 else JobState.SCHEDULED
    return _finished(item, state, AttemptOutcome.RELEASED, error=None, refund=True)


def failed(item: InFlight, exc: BaseException, run_seconds: float, *, base: float,
           cap: float) -> Finished:
    """A raised exception (or a timeout) -> retrying with backoff, or dead."""
    ctx = item.context
    text = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    trace = "".join(tb.format_exception(exc))[-MAX_TRACEBACK_CHARS:]
    if isinstance(exc, Permanent):
        return _finished(item, JobState.DEAD, AttemptOutcome.PERMANENT, error=text,
                        traceback=trace, run_seconds=run_seconds)
    outcome = AttemptOutcome.FAILED
    if item.timed_out:
        outcome = AttemptOutcome.TIMED_OUT
        text = f"timed out after {item.timeout_seconds:g} s ({text})"[:MAX_ERROR_CHARS]
    if ctx.attempt >= ctx.max_attempts:
        return _finished(item, JobState.DEAD, outcome,
                        error=f"{text} [attempt {ctx.attempt} of {ctx.max_attempts}, giving up]",
                        traceback=trace, run_seconds=run_seconds)
    if isinstance(exc, RetryAfter):
        delay = max(float(exc.seconds), 0.0)
    else:
        delay = backoff_seconds(ctx.attempt, base=base, cap=cap)
    return _finished(item, JobState.RETRYING, outcome, delay_seconds=delay, error=text,
                    traceback=trace, run_seconds=run_seconds)


class TimedOut(Exception):
    """Stands for a handler that returned only after its deadline."""
