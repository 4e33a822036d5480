"""The retention loop's arithmetic of days (timer_service/retention.py), and its settings:
a day partition is dropped once the whole day ended more than its state's retention ago,
so a job is kept at least the retention and at most a day longer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from shared.core.errors import ConfigError
from shared.core.states import JobState
from shared.runtime.settings import TimerSettings
from timer_service.retention import Retention

HOURS = {JobState.SUCCEEDED: 168, JobState.DEAD: 720, JobState.CANCELLED: 1}


def loop() -> Retention:
    return Retention(None, retention_hours=HOURS, workers_hours=24,  # type: ignore[arg-type]
                     audit_hours=720, batch_size=10, interval_seconds=60)


@pytest.mark.parametrize(("at", "state", "kept_from"), [
    (datetime(2026, 12, 9, 0, 30, tzinfo=UTC), JobState.SUCCEEDED, datetime(2026, 12, 2)),
    (datetime(2026, 12, 9, 23, 59, tzinfo=UTC), JobState.SUCCEEDED, datetime(2026, 12, 2)),
    (datetime(2026, 12, 31, 12, 0, tzinfo=UTC), JobState.DEAD, datetime(2026, 12, 1)),
    (datetime(2026, 12, 2, 0, 30, tzinfo=UTC), JobState.CANCELLED, datetime(2026, 12, 1)),
    # An offset clock is read in UTC: 01:30+02:00 is 23:30 the day before.
    (datetime(2026, 12, 9, 1, 30, tzinfo=timezone(timedelta(hours=2))), JobState.SUCCEEDED,
     datetime(2026, 12, 1)),
])
def test_a_day_is_kept_until_it_ended_a_retention_ago(at, state, kept_from):
    assert loop().keep_from(state, at) == kept_from.replace(tzinfo=UTC)


def test_every_finished_job_is_kept_at_least_its_retention_and_at_most_a_day_more():
    retention = loop()
    for minutes in range(0, 3 * 24 * 60, 37):
        at = datetime(2026, 12, 9, tzinfo=UTC) + timedelta(minutes=minutes)
        finished = at - timedelta(hours=168)
        day_start = finished.replace(hour=0, minute=0, second=0, microsecond=0)
        assert retention.keep_from(JobState.SUCCEEDED, at) == day_start


def test_settings_read_the_retention_variables(monkeypatch):
    monkeypatch.setenv("TOCK_RETENTION_DEAD_HOURS", "48")
    monkeypatch.setenv("TOCK_RETENTION_INTERVAL_SECONDS", "5")
    settings = TimerSettings.load()
    assert settings.retention_hours == {JobState.SUCCEEDED: 168, JobState.DEAD: 48,
                                        JobState.CANCELLED: 168}
    assert (settings.retention_workers_hours, settings.retention_audit_hours,
            settings.retention_interval_seconds, settings.retention_batch_size) == (
        24, 720, 5, 1000)


@pytest.mark.parametrize("variable", ["TOCK_RETENTION_SUCCEEDED_HOURS",
                                      "TOCK_RETENTION_WORKERS_HOURS",
                                      "TOCK_RETENTION_BATCH_SIZE"])
def test_bad_retention_settings_name_their_variable(monkeypatch, variable):
    monkeypatch.setenv(variable, "0")
    with pytest.raises(ConfigError, match=variable):
        TimerSettings.load()
