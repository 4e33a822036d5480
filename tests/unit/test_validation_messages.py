"""Messages of the shared input validation (client, CLI and API): values shown as a user
would write them, never as Python reprs; a missing value said to be missing; text that is
not UTF-8 (a stray byte in a command-line argument) said to be that."""

from __future__ import annotations

from datetime import datetime, time, timedelta, tzinfo
from decimal import Decimal

import pytest

from shared.core import validation
from shared.core.errors import InvalidInput
from shared.core.text import shown, utf8_problem

# Python reprs that a message must not show.
REPRS = ("datetime.", "None", "Decimal(", "<object", "timedelta(")


def _message(check, *args) -> str:
    with pytest.raises(InvalidInput) as info:
        check(*args)
    message = str(info.value)
    assert not any(r in message for r in REPRS), message
    return message


@pytest.mark.parametrize(("value", "text"), [
    (None, "null"), (True, "True"), (False, "False"), (7, "7"), (0.5, "0.5"),
    (float("nan"), "nan"), ("acme", "'acme'"), ("x" * 100, "'" + "x" * 60 + "...'"),
    ("a\udcffb", "'a\\udcffb'"), (datetime(2027, 1, 1), "2027-01-01T00:00:00"),
    (time(9, 30), "09:30:00"), (timedelta(seconds=-5), "-5 s"),
    (Decimal("1.5"), "a value of type Decimal"), ([1], "a value of type list"),
    (10 ** 5000, "an integer of about 5001 digits"),
], ids=lambda v: type(v).__name__)
def test_shown(value, text):
    assert shown(value) == text


def test_utf8_problem_names_the_byte_or_the_surrogate():
    assert utf8_problem("fine, ünïcode ✓") is None
    assert utf8_problem("ab\udcff") == ("the byte 0xFF at character 3 is not UTF-8 (is the "
                                        "text in another encoding?)")
    assert utf8_problem("\ud800") == "at character 1 is an unpaired UTF-16 surrogate (\\ud800)"


def test_a_naive_time_is_shown_in_iso_8601_with_a_fix():
    message = _message(validation.aware, "at", datetime(2027, 1, 1))
    assert message == ("at must be timezone-aware: 2027-01-01T00:00:00 has no timezone, so it "
                       "is ambiguous; add one, e.g. 2027-01-01T00:00:00+00:00 for UTC")
    assert datetime.fromisoformat("2027-01-01T00:00:00+00:00").tzinfo is not None


@pytest.mark.parametrize(("check", "args", "says"), [
    (validation.kind, (None,), "kind is missing: it must be a non-empty string"),
    (validation.queue, (None,), "queue is missing: it must be a queue name"),
    (validation.aware, ("at", None), "at is missing"),
    (validation.priority, (None,), "priority is missing: it must be an integer"),
    (validation.tenant_weight, (None,), "weight is missing"),
    (validation.job_id, (None,), "job id is missing"),
    (validation.finite_number, ("delay", None), "delay is missing: it must be a number"),
])
def test_a_missing_value_is_called_missing(check, args, says):
    assert _message(check, *args).startswith(says)


@pytest.mark.parametrize(("check", "args", "says"), [
    (validation.kind, (5,), "kind must be a non-empty string, got 5"),
    (validation.kind, ("",), "kind must be a non-empty string, got ''"),
    (validation.aware, ("at", "2027-01-01"), "at must be a timezone-aware datetime, got "
                                             "'2027-01-01'"),
    (validation.priority, (Decimal(3),), "got a value of type Decimal"),
    (validation.delay_seconds, (timedelta(seconds=-5),), "got -5 s"),
    (validation.timeout_seconds, (timedelta(days=1),), "got 86400 s"),
    (validation.optional_text, ("tenant", object(), 10), "got a value of type object"),
    (validation.payload, ({1: "a"}, 100), "payload key 1 at $ is not a string"),
    (validation.spec_fields, ({"kind": "a", "prio": 1},), "unknown job field(s) prio; known: "),
    (validation.spec_fields, ({},), "kind is missing"),
])
def test_wrong_values_are_shown_as_written(check, args, says):
    assert says in _message(check, *args)


@pytest.mark.parametrize("value", ["\udcff", "acme\udce9", "\ud800"])
def test_text_that_is_not_utf8_is_called_that(value):
    message = _message(validation.optional_text, "tenant", value, 128)
    assert message.startswith("tenant is not valid UTF-8 text: ")
    assert "lone surrogate" not in message
    message = _message(validation.payload, {"s": value}, 1000)
    assert message.startswith("payload text at $.s is not valid UTF-8 text: ")


def test_a_boolean_is_shown_as_python_writes_it():
    """The checks behind these messages guard Python calls (the HTTP API's strict models
    refuse a JSON true before them)."""
    assert _message(validation.delay_seconds, True) == "delay must be a number, got True"
    assert _message(validation.priority, False) == "priority must be an integer, got False"


def _deep(depth: int, leaf: object = None) -> object:
    value: object = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_a_too_deep_payload_names_a_path_cut_between_steps():
    message = _message(validation.payload, _deep(70), 10_000)
    assert message == ("payload is nested deeper than 64 levels (at $" + "[0]" * 23
                       + "[...][0])")
    validation.payload(_deep(64), 10_000)  # 64 levels are fine


def test_a_long_path_keeps_its_first_steps_and_its_last():
    deep: dict[str, object] = {}
    level = deep
    for i in range(70):
        key = f"key{i}" + "_" * (i % 30)
        level[key] = {}
        level = level[key]  # type: ignore[assignment]
    message = _message(validation.payload, deep, 10**6)
    assert message == ("payload is nested deeper than 64 levels (at $.key0.key1_.key2__"
                       ".key3___.key4____.key5_____.key6______[...].key64____)")


@pytest.mark.parametrize(("payload", "says"), [
    ({"to": {"name": "a\x00b"}}, "payload text at $.to.name contains a NUL character"),
    ({"a b": "\x00"}, "payload text at $['a b'] contains a NUL"),
    ({"x": ["ok", "\x00"]}, "payload text at $.x[1] contains a NUL"),
    ({"k\udcff": 1}, "payload text at $['k\\udcff'] is not valid UTF-8 text"),
    ({"n": [1.5, float("inf")]}, "payload number at $.n[1] is infinite (or past 1.8e308"),
    ({"n": float("nan")}, "payload number at $.n is NaN, which is not JSON"),
    ({"v": (1, 2)}, "payload value at $.v is a tuple"),
])
def test_payload_paths_name_keys_and_indexes(payload, says):
    assert _message(validation.payload, payload, 10_000).startswith(says)


class _OffsetOver24h(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(hours=30)


class _OffsetNotATimedelta(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return "+01:00"  # type: ignore[return-value]


@pytest.mark.parametrize("zone", [_OffsetOver24h(), _OffsetNotATimedelta()],
                         ids=lambda z: type(z).__name__)
def test_a_time_whose_timezone_gives_no_usable_offset_is_refused_by_name(zone):
    message = _message(validation.aware, "at", datetime(2030, 1, 1, tzinfo=zone))
    assert message.startswith(f"at has a timezone ({type(zone).__name__}) whose UTC offset "
                              "cannot be used: ")


def test_a_wall_time_the_clocks_skip_is_refused_naming_the_zone():
    from datetime import datetime
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    for fold in (0, 1):  # two different instants, neither the time written
        with pytest.raises(InvalidInput) as info:
            validation.aware("at", datetime(2027, 3, 28, 2, 30, fold=fold, tzinfo=berlin))
        assert str(info.value) == ("at 2027-03-28T02:30:00 does not exist in Europe/Berlin: "
                                   "the clocks skip it (a DST gap); give a time that exists, "
                                   "e.g. " + ("2027-03-28T03:30:00+02:00" if fold == 0
                                              else "2027-03-28T01:30:00+01:00"))
    # The fall's repeated hour exists twice: fold chooses which, as Python documents.
    first = validation.aware("at", datetime(2027, 10, 31, 2, 30, tzinfo=berlin))
    second = validation.aware("at", datetime(2027, 10, 31, 2, 30, fold=1, tzinfo=berlin))
    assert (second - first).total_seconds() == 3600


@pytest.mark.parametrize(("rate", "shown_as"), [(1_000_001, "1,000,001"),
                                                (1_000_000.5, "1,000,000.5")])
def test_a_rate_just_over_the_limit_is_shown_as_given(rate, shown_as):
    """It read "got 1e+06", which looks like the limit itself (a bad-input walkthrough)."""
    from shared.core.limits import LimitSpec

    with pytest.raises(InvalidInput, match=f"at most 1,000,000 per second, got {shown_as}$"):
        LimitSpec.of("kind", "k", rate=rate)
