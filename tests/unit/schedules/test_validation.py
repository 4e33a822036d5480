"""Bad schedules are refused before anything is written, with a message naming the problem."""

from datetime import UTC, datetime, timedelta

import pytest

from shared.core.errors import InvalidInput, InvalidSchedule
from shared.schedules.spec import make_spec

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**kw):
    kw.setdefault("name", "nightly")
    kw.setdefault("kind", "report")
    if "every" not in kw and "cron" not in kw:
        kw["cron"] = "0 2 * * *"
    return make_spec(kw.pop("name"), kw.pop("kind"), kw.pop("payload", None), now=NOW, **kw)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "61 * * * *"}, "malformed"),
    ({"cron": "* * * *"}, "has 4 fields"),
    ({"cron": "daily"}, "cron 'daily' has 1 field; use 5 fields (minute hour day month "
                        "weekday) or 6 (second minute hour day month weekday)"),
    ({"cron": "0 0 30 2 *"}, "never fires"),
    ({"cron": "0 0 31 4 *"}, "never fires"),
    ({"cron": "0 0 15W * 1"}, "cron '0 0 15W * 1': W in the day-of-month field (15W) with "
                              "a day of the week (1) is not supported"),
    ({"cron": "0 0 0 30w * mon-fri"}, "day of the week would be ignored"),
    ({"cron": "0 0 1 * 5#3"}, "# in the day-of-week field (5#3) with a day of the month (1)"),
    ({"cron": "0 0 15 * fri#3"}, "fire only on days matching both rather than either"),
    ({"cron": "H * * * *"}, "spread="),
    ({"cron": ""}, "non-empty"),
    ({"cron": "*/99999999999999999999 * * * *"}, "step /99999999999999999999 of the minute "
                                                 "field is past its largest value (59)"),
    ({"cron": "0 0 */32 * *"}, "day-of-month field is past its largest value (31)"),
    ({"cron": "*/61 * * * * *"}, "second field"),
    ({"cron": "0 " * 600}, "at most 1000"),
    ({"cron": "0 2 * * *", "tz": "Europe/Berlinn"}, "did you mean 'Europe/Berlin'"),
    ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"every": timedelta(0)}, "must be positive"),
    ({"every": -5}, "must be positive"),
    ({"every": 0.5}, "at least 1 s"),
    ({"every": "10s"}, "timedelta or a number"),
    ({"every": 2.9999999}, "every must be a whole number of microseconds, got 2.9999999 s "
                           "(it would be stored as 3.0 s)"),
    ({"every": 1.0000001}, "whole number of microseconds"),
    ({"every": 10, "cron": "* * * * *"}, "exactly one"),
    ({"every": 10, "tz": "Europe/Berlin"}, "tz= applies to cron"),
    ({"every": 10, "tz": "UTC"}, "tz='UTC' is given with every=, but tz= applies to cron "
                                 "schedules only"),
    ({"every": 10, "tz": "Etc/UTC"}, "tz= applies to cron"),
    ({"every": 10, "tz": ""}, "tz must be an IANA time zone name"),
    ({"every": 10, "spread": 10}, "shorter than the interval"),
    ({"cron": "* * * * *", "spread": 86400}, "shortest gap between two fire times of cron "
                                             "'* * * * *' (60 s)"),
    ({"cron": "0 9,10 * * *", "spread": 3000, "jitter": 600}, "(3600 s)"),
    ({"cron": "*/15 * * * * *", "jitter": 15}, "(15 s)"),
    ({"every": 10, "start": datetime(2026, 1, 1)}, "timezone-aware"),
    ({"cron": "0 * * * *", "start": NOW}, "no anchor"),
    ({"every": 10, "misfire": "skipp"}, "did you mean 'skip'"),
    ({"every": 10, "overlap": "queue"}, "overlap must be one of"),
    ({"every": 10, "misfire": "all", "overlap": "skip"}, "misfire='all'"),
    ({"every": 10, "backfill_max": 0}, "backfill_max"),
    ({"every": 10, "name": "bad:name"}, "schedule name"),
    ({"every": 10, "name": ""}, "schedule name"),
    ({"every": 10, "kind": "no spaces"}, "not a valid kind"),
    ({"every": 10, "payload": {1, 2}}, "not JSON"),
    ({"every": 10, "priority": 10}, "priority"),
])
def test_invalid_definitions_say_what_is_wrong(kwargs, message):
    with pytest.raises(InvalidSchedule, match=None) as info:
        spec(**kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, InvalidInput)


def test_valid_definitions():
    s = spec(cron="*/15 * * * * *", tz="America/New_York", spread=10, jitter=4.9)
    assert s.timing.cron == "*/15 * * * * *"
    assert s.timing.tz == "America/New_York"
    leap = spec(cron="0 0 29 2 *", spread=3600)  # rare, but it fires
    assert spec(cron="0 2 * * *", spread=600, jitter=5).spread_seconds == 600
    assert leap.timing.cron == "0 0 29 2 *"
    every = spec(every=timedelta(minutes=5), start=NOW)
    assert every.timing.every == timedelta(minutes=5)
    assert every.timing.anchor == NOW
    # W and # alone, and L with a day of the week (fires on either), are read correctly
    for expr in ("0 0 30W * *", "0 0 ? * 5#3", "0 0 L * 1", "0 0 15W * ?"):
        assert spec(cron=expr).timing.cron == expr


@pytest.mark.parametrize(("cron", "fields"), [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"), (" @Daily ", "0 0 * * *"),
])
def test_a_cron_shortcut_is_refused_with_the_fields_it_stands_for(cron, fields):
    with pytest.raises(InvalidSchedule) as info:
        spec(cron=cron)
    word = cron.strip().lower()
    assert str(info.value) == (f"cron {cron!r}: @-shortcuts such as {word} are not "
                               f"supported; write the 5 fields it stands for: cron={fields!r}")
    assert spec(cron=fields).timing.cron == fields  # and the fix is accepted


@pytest.mark.parametrize(("cron", "says"), [
    ("@reboot", "@-shortcuts such as @reboot are not supported; use 5 fields (minute"),
    ("@every 5m", "@-shortcuts such as @every are not supported; for a fixed interval use "
                  "every= (seconds or a timedelta)"),
])
def test_other_at_words_are_refused_too(cron, says):
    with pytest.raises(InvalidSchedule, match=None) as info:
        spec(cron=cron)
    assert says in str(info.value)


def test_the_zone_defaults_to_utc_for_cron_and_is_none_of_every_business():
    """An interval has no zone: any tz= with every= is refused, "UTC" as much as
    "Europe/Berlin", and leaving it out stores UTC for both kinds, as before."""
    assert spec(cron="0 2 * * *").timing.tz == "UTC"
    assert spec(cron="0 2 * * *", tz=None).timing.tz == "UTC"
    assert spec(cron="0 2 * * *", tz="UTC").timing.tz == "UTC"
    assert spec(every=60).timing.tz == "UTC"
    assert spec(every=60, tz=None).timing.tz == "UTC"


def test_a_start_more_than_ten_years_ahead_is_refused():
    # Its slots would soon pass the year 9999, where no preview or timer could follow them.
    with pytest.raises(InvalidSchedule,
                       match=r"start must be at most 10 years \(3,650 days\) from now"):
        spec(every=3600, start=datetime(9999, 12, 31, tzinfo=UTC))
    later = NOW + timedelta(days=9 * 365)
    assert spec(every=3600, start=later).timing.anchor == later


@pytest.mark.parametrize("seconds", [1.1, 1.5, 2.000001, 86400.25, 31622399.999999])
def test_fractional_intervals_to_the_microsecond_are_kept_exactly(seconds):
    assert spec(every=seconds).timing.every.total_seconds() == seconds
