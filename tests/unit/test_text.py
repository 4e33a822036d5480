"""Text bound for a database column: storable (no NUL, no lone surrogates) and bounded
including its suffix."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.iso_time import formatted
from shared.core.limits import LimitSpec, rate_text
from shared.core.text import (
    ELLIPSIS,
    LostNumber,
    bounded,
    decimal_integer,
    describe,
    json_float,
    storable,
)

# st.text() leaves out surrogates; mix in what handlers really put in exceptions.
nasty = st.text(alphabet=st.one_of(st.characters(),
                                   st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80"])))


def is_storable(text: str) -> bool:
    text.encode("utf-8")  # raises for a lone surrogate
    return "\x00" not in text


def test_storable_escapes_nul_and_lone_surrogates():
    assert storable("a\x00b") == "a\\x00b"
    assert storable("\x00\x00") == "\\x00\\x00"
    assert storable("x\ud800y") == "x\\ud800y"
    assert storable("\udfff") == "\\udfff"
    assert storable("nul \x00 and \udc80") == "nul \\x00 and \\udc80"


def test_storable_leaves_normal_text_alone():
    for text in ["", "plain", "héllo wörld", "日本語 ✓ 🎉", "tab\tnew\nline", "back\\slash"]:
        assert storable(text) == text


@given(nasty)
def test_storable_is_always_storable(text):
    assert is_storable(storable(text))


@given(nasty, st.integers(min_value=10, max_value=300), st.text(max_size=50))
def test_bounded_never_exceeds_the_limit(text, limit, suffix):
    out = bounded(text, limit, suffix)
    assert len(out) <= limit
    assert is_storable(out)
    tail = bounded(text, limit, suffix, keep="tail")
    assert len(tail) <= limit
    assert is_storable(tail)


@given(st.text(), st.integers(min_value=10, max_value=300), st.text(max_size=50))
@example("x" * 20, 10, "abcdefgh")  # room for the suffix but not for the ellipsis too
@example("x" * 20, 10, "abcdefghij")  # the suffix alone fills the limit
def test_bounded_keeps_the_whole_suffix_when_the_limit_allows(text, limit, suffix):
    kept = storable(suffix)  # the suffix is made storable too
    for keep in ("head", "tail"):
        out = bounded(text, limit, suffix, keep=keep)
        if len(kept) <= limit:
            assert out.endswith(kept), (keep, out)


@given(nasty, st.integers(min_value=10, max_value=300), st.text(max_size=50))
def test_bounded_result_is_storable_even_with_a_nasty_suffix(text, limit, suffix):
    assert is_storable(bounded(text, limit, suffix + "\x00\ud800"))


@given(st.text(), st.integers(min_value=10, max_value=300), st.text(max_size=50))
def test_bounded_text_that_fits_is_unchanged(text, limit, suffix):
    whole = storable(text) + storable(suffix)
    if len(whole) <= limit:
        assert bounded(text, limit, suffix) == whole
        assert bounded(text, limit, suffix, keep="tail") == whole


def test_bounded_marks_a_cut_with_the_ellipsis():
    text = "".join(str(i % 10) for i in range(1000))
    out = bounded(text, 100)
    assert len(out) == 100
    assert out == text[:100 - len(ELLIPSIS)] + ELLIPSIS
    with_suffix = bounded(text, 100, " [giving up]")
    assert len(with_suffix) == 100
    assert with_suffix.endswith(ELLIPSIS + " [giving up]")
    assert with_suffix.startswith(text[:50])


def test_bounded_keep_tail_keeps_the_end():
    text = "start " + "x" * 1000 + " the innermost frame"
    out = bounded(text, 100, keep="tail")
    assert len(out) == 100
    assert out.startswith(ELLIPSIS)
    assert out.endswith(" the innermost frame")
    assert "start" not in out
    assert bounded(text, 100, "!", keep="tail").endswith(" the innermost frame!")


def test_bounded_counts_escapes_against_the_limit():
    out = bounded("\x00" * 100, 50)
    assert len(out) <= 50
    assert "\x00" not in out
    assert out.startswith("\\x00")


def test_bounded_keeps_a_long_suffix_that_just_fits():
    suffix = " [attempt 3 of 3, giving up]"
    out = bounded("e" * 100, len(suffix) + 2, suffix)
    assert out.endswith(suffix)
    assert len(out) <= len(suffix) + 2


def test_describe_names_the_type_and_message():
    assert describe(ValueError("bad value")) == "ValueError: bad value"
    assert describe(KeyError()) == "KeyError"
    assert describe(RuntimeError("")) == "RuntimeError"


def test_describe_survives_a_broken_str():
    class Broken(Exception):
        def __str__(self):
            raise ValueError("no text for you")

    text = describe(Broken())
    assert text.startswith("Broken")
    assert "ValueError" in text


@given(st.integers(-10**30, 10**30))
def test_decimal_integer_reads_what_str_writes(n):
    assert decimal_integer(str(n)) == n
    assert decimal_integer(f"+{abs(n)}") == abs(n)


@pytest.mark.parametrize("text", [" 5", "5 ", "1_000", "\u0665", "", "-", "+", "0x10",
                                  "1e3", "9" * 4301])
def test_decimal_integer_refuses_what_int_would_bend(text):
    with pytest.raises(ValueError, match="not a plain integer"):
        decimal_integer(text)


def test_an_out_of_range_count_is_not_echoed_digit_by_digit():
    with pytest.raises(InvalidInput, match=r"got an integer of about 201 digits$"):
        LimitSpec.of("kind", "email", max_running=10**200)


def test_times_are_shown_with_four_digit_years():
    # The C library's %Y writes year 1 as "1": "run at 1-01-01" in `tock show`.
    assert formatted(datetime(1, 1, 1, tzinfo=UTC), "%Y-%m-%d %H:%M:%S %Z") == \
        "0001-01-01 00:00:00 UTC"
    assert formatted(datetime(2027, 3, 4, 5, 6, 7, tzinfo=UTC), "%Y-%m-%dT%H:%M:%S%z") == \
        "2027-03-04T05:06:07+0000"


@pytest.mark.parametrize(("per_second", "shown_as"), [
    (5, "5/s"), (2.5, "2.5/s"), (1, "1/s"), (0.5, "30/min"), (1 / 60, "1/min"),
    (1 / 3600, "1/h"), (2 / 86400, "0.0833/h")])
def test_rates_read_as_they_were_set(per_second, shown_as):
    assert rate_text(per_second) == shown_as


@pytest.mark.parametrize(("text", "becomes"), [
    ("1e-400", "0"), ("-1E-330", "0"), ("0.000000000000000000001e-310", "0"),
    ("1e400", "infinity"), ("-1.8e308", "infinity"),
])
def test_a_json_number_a_float_would_not_keep_is_refused(text, becomes):
    with pytest.raises(LostNumber, match=rf"it would be read as {becomes}\): send it as a "
                                         "string"):
        json.loads(f'{{"x": {text}}}', parse_float=json_float)


@pytest.mark.parametrize(("text", "becomes"), [
    ("1.00000000000000000001", "1.0"), ("9007199254740993.0", "9007199254740992.0"),
    ("3.141592653589793238", "3.141592653589793"), ("1." + "0" * 1000 + "1", "1.0"),
])
def test_a_json_number_with_more_digits_than_a_float_keeps_is_refused(text, becomes):
    """"Stored exactly as given or refused": a walkthrough's 1.00000000000000000001 was
    stored as 1.0."""
    with pytest.raises(LostNumber, match=rf"has more digits than a float keeps \(it would be "
                                         rf"read as {re.escape(becomes)}\)"):
        json.loads(f'{{"x": {text}}}', parse_float=json_float)


@pytest.mark.parametrize("text", ["0.0", "-0.0", "0e5", "0.000e-999", "5e-324", "1.5",
                                  "1.7976931348623157e308", "0.1", "2.50", "1E2",
                                  "0.30000000000000004", "1.0000000000000000"])
def test_json_numbers_a_float_keeps_are_read_as_json_reads_them(text):
    assert json.loads(text, parse_float=json_float) == json.loads(text)
