"""What a handler's return or exception means for its job: every outcome is storable
(bounded, no NUL, no lone surrogates) and every delay is a sane number."""

from __future__ import annotations

import pickle
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from consumer.inflight import InFlight
from consumer.outcomes import (
    MAX_ERROR_CHARS,
    MAX_RETRY_AFTER_SECONDS,
    MAX_TRACEBACK_CHARS,
    Backoff,
    Raised,
    failed,
    failure,
    no_handler,
    released,
    retry_after_seconds,
    succeeded,
)
from consumer.tasks import TaskContext
from shared.core.errors import Permanent, RetryAfter
from shared.core.states import AttemptOutcome, JobState
from shared.core.text import ELLIPSIS
from shared.store.rows import Lease

BACKOFF = Backoff(base_seconds=2.0, cap_seconds=60.0, unknown_kind_seconds=30.0)
MAX_ATTEMPTS = 5


def item(attempt=1, max_attempts=MAX_ATTEMPTS, kind="email", timed_out=False):
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    ctx = TaskContext(job_id=17, kind=kind, queue="default", attempt=attempt,
                      max_attempts=max_attempts, scheduled_at=now,
                      deadline=now + timedelta(seconds=30), tenant=None, key=None,
                      cancelled=threading.Event())
    return InFlight(Lease(17, attempt, uuid.uuid4()), "default", "receipt-1", ctx,
                    timeout_seconds=30.0, timed_out=timed_out)


def raised(exc):
    """`exc` with a traceback, as the executor sees it."""
    try:
        raise exc
    except BaseException as caught:  # KeyboardInterrupt and SystemExit too, on purpose
        return caught


def ceiling(attempt, base=BACKOFF.base_seconds, cap=BACKOFF.cap_seconds):
    return min(cap, base * 2 ** (attempt - 1))


def giving_up(attempt, max_attempts=MAX_ATTEMPTS):
    return f" [attempt {attempt} of {max_attempts}, giving up]"


def assert_storable(result):
    for text in (result.error, result.traceback):
        if text is not None:
            text.encode("utf-8")
            assert "\x00" not in text
    assert result.error is None or len(result.error) <= MAX_ERROR_CHARS
    assert result.traceback is None or len(result.traceback) <= MAX_TRACEBACK_CHARS


def test_success():
    it = item()
    done = succeeded(it, 0.25)
    assert done.item is it
    assert done.run_seconds == 0.25
    assert done.result.lease is it.lease
    assert done.result.state is JobState.SUCCEEDED
    assert done.result.outcome is AttemptOutcome.SUCCEEDED
    assert done.result.error is None


@pytest.mark.parametrize("attempt", [1, 2, 3, 4])
def test_a_failure_with_attempts_left_retries_within_the_backoff_bounds(attempt):
    for _ in range(50):
        done = failed(item(attempt), raised(ValueError("bad input")), 1.5, BACKOFF)
        result = done.result
        assert result.state is JobState.RETRYING
        assert result.outcome is AttemptOutcome.FAILED
        assert ceiling(attempt) / 2 <= result.delay_seconds <= ceiling(attempt)
        assert result.error == "ValueError: bad input"
        assert "Traceback (most recent call last)" in result.traceback
        assert result.traceback.rstrip().endswith("ValueError: bad input")
        assert done.run_seconds == 1.5
        assert not result.refund


def test_the_first_retry_never_comes_at_once():
    delays = [failed(item(1), raised(ValueError("x")), 0, BACKOFF).result.delay_seconds
              for _ in range(200)]
    assert min(delays) >= BACKOFF.base_seconds / 2


def test_the_last_attempt_goes_dead_giving_up():
    result = failed(item(MAX_ATTEMPTS), raised(ValueError("bad input")), 0, BACKOFF).result
    assert result.state is JobState.DEAD
    assert result.outcome is AttemptOutcome.FAILED
    assert result.error == "ValueError: bad input" + giving_up(MAX_ATTEMPTS)


def test_a_huge_message_on_the_last_attempt_keeps_the_giving_up_suffix():
    result = failed(item(MAX_ATTEMPTS), raised(ValueError("m" * 10_000)), 0, BACKOFF).result
    assert result.state is JobState.DEAD
    assert len(result.error) <= MAX_ERROR_CHARS
    assert result.error.startswith("ValueError: mmm")
    assert result.error.endswith(ELLIPSIS + giving_up(MAX_ATTEMPTS))
    assert_storable(result)


def test_a_huge_message_with_attempts_left_is_cut():
    result = failed(item(1), raised(ValueError("m" * 10_000)), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert len(result.error) <= MAX_ERROR_CHARS
    assert result.error.endswith(ELLIPSIS)
    assert_storable(result)


def test_a_timeout_says_so():
    it = item(2, timed_out=True)
    result = failed(it, raised(TimeoutError()), 30.0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.outcome is AttemptOutcome.TIMED_OUT
    assert result.error == "timed out after 30 s (TimeoutError)"
    last = failed(item(MAX_ATTEMPTS, timed_out=True), raised(TimeoutError()), 30.0,
                  BACKOFF).result
    assert last.state is JobState.DEAD
    assert last.outcome is AttemptOutcome.TIMED_OUT
    assert last.error.endswith(giving_up(MAX_ATTEMPTS))


@pytest.mark.parametrize("attempt", [1, MAX_ATTEMPTS])
def test_permanent_goes_dead_at_once(attempt):
    result = failed(item(attempt), raised(Permanent("card declined")), 0, BACKOFF).result
    assert result.state is JobState.DEAD
    assert result.outcome is AttemptOutcome.PERMANENT
    assert result.error == "Permanent: card declined"
    assert "Permanent: card declined" in result.traceback


def test_retry_after_sets_the_delay():
    result = failed(item(2), raised(RetryAfter(12)), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.outcome is AttemptOutcome.FAILED
    assert result.delay_seconds == 12.0
    assert result.error == "RetryAfter: retry requested in 12 s"


def test_retry_after_on_the_last_attempt_still_goes_dead():
    result = failed(item(MAX_ATTEMPTS), raised(RetryAfter(12)), 0, BACKOFF).result
    assert result.state is JobState.DEAD
    assert result.error.endswith(giving_up(MAX_ATTEMPTS))


@pytest.mark.parametrize(("seconds", "named"), [
    ("soon", "'soon'"), (float("nan"), "nan"), (None, "None"), (True, "True"), ([1], "[1]"),
    ({"s": 1}, "{'s': 1}"),
    # Not a delay either: in the past, or never. Like None, not "retry at once".
    (-1, "-1"), (-0.5, "-0.5"), (-1e300, "-1e+300"), (float("-inf"), "-inf"),
    (-(10**400), "-1" + "0" * 38), (float("inf"), "inf"),
], ids=repr)
def test_retry_after_without_a_usable_number_uses_the_backoff_and_says_so(seconds, named):
    result = failed(item(3), raised(RetryAfter(seconds)), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert ceiling(3) / 2 <= result.delay_seconds <= ceiling(3)
    assert (f" [RetryAfter needs a number of seconds (finite, 0 or more), got {named}; "
            "retrying with the usual backoff]") in result.error, result.error
    assert_storable(result)


@pytest.mark.parametrize("seconds", [1e300, 10**400, MAX_RETRY_AFTER_SECONDS + 1],
                         ids=["1e300", "10**400", "just over"])
def test_retry_after_too_far_away_is_capped(seconds):
    result = failed(item(2), raised(RetryAfter(seconds)), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.delay_seconds == MAX_RETRY_AFTER_SECONDS
    assert "RetryAfter needs a number" not in result.error
    assert_storable(result)


@pytest.mark.parametrize("seconds", [0, 0.0, -0.0], ids=repr)
def test_retry_after_zero_is_now(seconds):
    result = failed(item(2), raised(RetryAfter(seconds)), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.delay_seconds == 0.0
    assert "RetryAfter needs a number" not in result.error


def test_retry_after_seconds_checks_the_value():
    assert retry_after_seconds(0) == 0.0
    assert retry_after_seconds(2.5) == 2.5
    assert retry_after_seconds(MAX_RETRY_AFTER_SECONDS) == MAX_RETRY_AFTER_SECONDS
    assert retry_after_seconds(10**400) == MAX_RETRY_AFTER_SECONDS
    for unusable in ("12", False, float("nan"), float("inf"), float("-inf"), -1, -0.001,
                     -(10**400)):
        assert retry_after_seconds(unusable) is None, unusable


def test_an_exception_whose_str_raises_is_still_recorded():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("str is broken")

    result = failed(item(1), raised(Unprintable()), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.outcome is AttemptOutcome.FAILED
    assert result.error.startswith("Unprintable")
    assert "Unprintable" in result.traceback
    assert_storable(result)


def test_an_exception_whose_traceback_cannot_be_formatted_is_still_recorded():
    class Nameless(Exception):
        def __str__(self):
            raise RuntimeError("str is broken")

        @property
        def __notes__(self):
            raise RuntimeError("notes are broken too")

    result = failed(item(1), raised(Nameless()), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert "Nameless" in result.error
    # The fallback: the frames, then the name.
    assert result.traceback.endswith("Nameless: <str() raised RuntimeError>")
    assert "in raised" in result.traceback
    assert_storable(result)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()],
                         ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit"])
def test_base_exceptions_are_failures_not_reraised(exc):
    result = failed(item(1), raised(exc), 0, BACKOFF).result
    assert result.state is JobState.RETRYING
    assert result.outcome is AttemptOutcome.FAILED
    assert result.error.startswith(type(exc).__name__)
    assert type(exc).__name__ in result.traceback


def test_nul_bytes_and_lone_surrogates_are_escaped():
    exc = raised(ValueError("nul \x00 here, surrogate \ud800 there"))
    for attempt in (1, MAX_ATTEMPTS):
        result = failed(item(attempt), exc, 0, BACKOFF).result
        assert_storable(result)
        assert "nul \\x00 here, surrogate \\ud800 there" in result.error
        assert "nul \\x00 here, surrogate \\ud800 there" in result.traceback


def test_a_nasty_permanent_and_retry_after_are_escaped_too():
    for exc in (Permanent("\x00\udfff"), RetryAfter("\x00\udfff", "\x00\udfff")):
        result = failed(item(1), raised(exc), 0, BACKOFF).result
        assert_storable(result)
        assert "\\x00\\udfff" in result.error


def test_a_huge_traceback_keeps_its_tail():
    result = failed(item(1), raised(ValueError("t" * 50_000 + " THE END")), 0, BACKOFF).result
    assert len(result.traceback) <= MAX_TRACEBACK_CHARS
    assert result.traceback.startswith(ELLIPSIS)
    assert result.traceback.rstrip().endswith("t THE END")
    assert_storable(result)


def test_a_deep_traceback_keeps_the_innermost_frames():
    def recurse(n):
        if n == 0:
            raise ValueError("innermost " + "y" * 30_000)
        return recurse(n - 1) + 1

    try:
        recurse(50)
    except ValueError as exc:
        caught = exc
    result = failed(item(1), caught, 0, BACKOFF).result
    assert len(result.traceback) <= MAX_TRACEBACK_CHARS
    assert result.traceback.rstrip().endswith("y")


def test_no_handler_retries_with_the_unknown_kind_backoff():
    for _ in range(50):
        result = no_handler(item(1, kind="mystery"), ["email", "sms"], BACKOFF).result
        assert result.state is JobState.RETRYING
        assert result.outcome is AttemptOutcome.NO_HANDLER
        assert (BACKOFF.unknown_kind_seconds / 2 <= result.delay_seconds
                <= BACKOFF.unknown_kind_seconds)
        assert "'mystery'" in result.error
        assert "email, sms" in result.error
        assert "giving up" not in result.error


def test_no_handler_waits_from_unknown_kind_seconds_even_above_the_cap():
    backoff = Backoff(base_seconds=1.0, cap_seconds=5.0, unknown_kind_seconds=120.0)
    result = no_handler(item(1), [], backoff).result
    assert 60.0 <= result.delay_seconds <= 120.0
    assert "nothing" in result.error


def test_no_handler_on_the_last_attempt_goes_dead():
    result = no_handler(item(MAX_ATTEMPTS, kind="mystery"), ["email"], BACKOFF).result
    assert result.state is JobState.DEAD
    assert result.outcome is AttemptOutcome.NO_HANDLER
    assert result.error.endswith(giving_up(MAX_ATTEMPTS))
    assert_storable(result)


def test_no_handler_with_a_huge_list_of_kinds_keeps_the_suffix():
    known = [f"kind_{i:05d}" for i in range(2000)]
    for attempt in (1, MAX_ATTEMPTS):
        result = no_handler(item(attempt, kind="mystery"), known, BACKOFF).result
        assert_storable(result)
    assert result.error.endswith(giving_up(MAX_ATTEMPTS))


def test_released_gives_the_attempt_back():
    first = released(item(1)).result
    assert first.state is JobState.SCHEDULED
    assert first.outcome is AttemptOutcome.RELEASED
    assert first.refund
    assert first.error is None
    later = released(item(3)).result
    assert later.state is JobState.RETRYING
    assert later.outcome is AttemptOutcome.RELEASED
    assert later.refund



@pytest.mark.parametrize("exc", [
    RuntimeError("boom"), Permanent("no"), RetryAfter(12), RetryAfter("soon"),  # type: ignore[arg-type]
    SystemExit(3), ValueError("a\x00b"),
], ids=["error", "permanent", "retry-after", "retry-after-text", "system-exit", "nul"])
def test_what_crosses_from_a_handler_process_is_judged_like_the_exception(exc):
    """A handler process sends `Raised` (plain data, pickled), not the exception."""
    exc = raised(exc)
    crossed = pickle.loads(pickle.dumps(Raised.of(exc)))
    direct = failed(item(2), exc, 0, BACKOFF).result
    remote = failure(item(2), crossed, 0, BACKOFF).result
    assert (remote.state, remote.outcome, remote.error) == \
        (direct.state, direct.outcome, direct.error)
    assert remote.traceback == direct.traceback
    if isinstance(exc, RetryAfter) and exc.seconds == 12:
        assert remote.delay_seconds == direct.delay_seconds == 12
