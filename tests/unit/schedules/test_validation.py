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
    ({"cron": "0 0 30 2 *"}, "never fires"),
    ({"cron": "0 0 31 4 *"}, "never fires"),
    ({"cron": "H * * * *"}, "spread="),
    ({"cron": ""}, "non-empty"),
    ({"cron": "0 2 * * *", "tz": "Europe/Berlinn"}, "did you mean 'Europe/Berlin'"),
    ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"every": timedelta(0)}, "must be positive"),
    ({"every": -5}, "must be positive"),
    ({"every": 0.5}, "at least 1 s"),
    ({"every": "10s"}, "timedelta or a number"),
    ({"every": 10, "cron": "* * * * *"}, "exactly one"),
    ({"every": 10, "tz": "Europe/Berlin"}, "tz= applies to cron"),
    ({"every": 10, "spread": 10}, "shorter than the interval"),
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
    s = spec(cron="*/15 * * * * *", tz="America/New_York", spread=30, jitter=5)
    assert s.timing.cron == "*/15 * * * * *"
    assert s.timing.tz == "America/New_York"
    leap = spec(cron="0 0 29 2 *")  # rare, but it fires
    assert leap.timing.cron == "0 0 29 2 *"
    every = spec(every=timedelta(minutes=5), start=NOW)
    assert every.timing.every == timedelta(minutes=5)
    assert every.timing.anchor == NOW
