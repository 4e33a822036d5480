"""Settings are checked at start-up, with messages that name the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dashboard.settings import DashboardSettings
from shared.core.errors import ConfigError
from shared.runtime.settings import (
    ClientSettings,
    CommonSettings,
    ConsumerSettings,
    TimerSettings,
)


def test_defaults_are_consistent():
    ConsumerSettings.load()
    TimerSettings.load()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"heartbeat_seconds": 20, "lease_seconds": 30}, "under half of lease_seconds"),
    ({"visibility_timeout_seconds": 10, "lease_seconds": 30}, "must be >= lease_seconds"),
    ({"queues": ["ok", "not ok"]}, "queue names must match"),
    ({"concurrency": 0}, "TOCK_CONCURRENCY"),
    ({"backoff_base_seconds": 10, "backoff_cap_seconds": 1}, "backoff_cap_seconds"),
    ({"isolation": "process", "kill_grace_seconds": 5, "lease_seconds": 3,
      "heartbeat_seconds": 1}, "kill_grace_seconds .* must be under lease_seconds"),
    ({"isolation": "fork"}, "TOCK_ISOLATION"),
])
def test_inconsistent_consumer_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ConsumerSettings.load(**overrides)


def test_isolation_comes_from_the_environment_and_a_long_grace_is_fine_with_threads(
        monkeypatch):
    monkeypatch.setenv("TOCK_ISOLATION", "process")
    assert ConsumerSettings.load().isolation == "process"
    monkeypatch.delenv("TOCK_ISOLATION")
    ConsumerSettings.load(kill_grace_seconds=60, lease_seconds=3, heartbeat_seconds=1)


def test_environment_values_are_validated(monkeypatch):
    monkeypatch.setenv("TOCK_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigError, match="TOCK_LEASE_SECONDS"):
        ConsumerSettings.load()


def test_processes_refuse_bad_settings_with_exit_code_2():
    env = {"TOCK_HEARTBEAT_SECONDS": "50", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "consumer", "--tasks", "demo.tasks"],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "heartbeat_seconds" in result.stderr
    result = subprocess.run([sys.executable, "-m", "timer_service"],
                            env={**env, "TOCK_BATCH_SIZE": "0"}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "TOCK_BATCH_SIZE" in result.stderr


def test_consumer_refuses_an_unimportable_task_module():
    result = subprocess.run([sys.executable, "-m", "consumer", "--tasks", "no.such.module"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "cannot import task module 'no.such.module'" in result.stderr


def _float_settings() -> list[tuple[type[CommonSettings], str]]:
    found = []
    for cls in (TimerSettings, ConsumerSettings, ClientSettings, DashboardSettings):
        for name, field in cls.model_fields.items():
            if field.annotation in (float, float | None):
                found.append((cls, name))
    return found


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_a_float_setting_must_be_finite(monkeypatch, value):
    monkeypatch.setenv("TOCK_RETENTION_SUCCEEDED_HOURS", value)
    with pytest.raises(ConfigError) as caught:
        TimerSettings.load()
    assert str(caught.value) == ("invalid settings:\n  TOCK_RETENTION_SUCCEEDED_HOURS: must "
                                 f"be a finite number, not {value!r}")


@pytest.mark.parametrize(("cls", "name"), _float_settings(),
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_every_float_setting_refuses_nan_and_infinity(monkeypatch, cls, name):
    # The dashboard needs its tokens first: the development ones.
    overrides = {"dashboard_dev": True} if cls is DashboardSettings else {}
    for value in ("nan", "inf"):
        monkeypatch.setenv(f"TOCK_{name.upper()}", value)
        with pytest.raises(ConfigError, match=f"TOCK_{name.upper()}: must be a finite number"):
            cls.load(**overrides)


@pytest.mark.parametrize(("cls", "variable", "value"), [
    # A job would be given a deadline, or a retry a run_at, past the year 9999 that Python
    # (and so every read of the job) cannot hold, or Postgres refuse the outcome outright.
    (ConsumerSettings, "TOCK_DEFAULT_TIMEOUT_SECONDS", "1e12"),
    (ConsumerSettings, "TOCK_BACKOFF_BASE_SECONDS", "1e12"),
    (ConsumerSettings, "TOCK_BACKOFF_CAP_SECONDS", "1e300"),
    (TimerSettings, "TOCK_BACKOFF_CAP_SECONDS", "1e300"),
    (TimerSettings, "TOCK_DISPATCH_TIMEOUT_SECONDS", "1e300"),
    # Loaded, then an OverflowError traceback at SIGTERM, nothing released.
    (ConsumerSettings, "TOCK_SHUTDOWN_GRACE_SECONDS", "1e10"),
], ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_a_duration_too_long_to_use_is_refused_at_start(monkeypatch, cls, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}: Input should be less than or equal"):
        cls.load()


def test_the_longest_durations_allowed_still_load(monkeypatch):
    ConsumerSettings.load(default_timeout_seconds=12 * 3600, backoff_base_seconds=1,
                          backoff_cap_seconds=10 * 365 * 86400, shutdown_grace_seconds=86400)
    TimerSettings.load(backoff_cap_seconds=10 * 365 * 86400, dispatch_timeout_seconds=7 * 86400)


def test_the_float_scan_finds_them():
    names = {name for _, name in _float_settings()}
    assert {"retention_succeeded_hours", "schedule_lookahead_seconds", "lease_seconds",
            "sqs_call_timeout_seconds", "dashboard_session_hours"} <= names


@pytest.mark.parametrize("value", ["", "  "], ids=repr)
def test_an_empty_database_url_is_refused_not_read_as_libpq_defaults(monkeypatch, value):
    # An unset secret rendered as "" would otherwise connect to a local socket as the OS
    # user, and fail later as "cannot use : ...".
    monkeypatch.setenv("TOCK_DATABASE_URL", value)
    for cls in (ClientSettings, TimerSettings, ConsumerSettings):
        with pytest.raises(ConfigError, match="TOCK_DATABASE_URL: is empty; give a URL"):
            cls.load()


PASSWORD = "s3cr3tpw"


@pytest.mark.parametrize(("url", "port"), [
    ("host=x port=abc", "'abc'"), ("postgresql://me@db:0/tock", "'0'"),
    ("postgresql://me@db/tock?port=70000", "'70000'"), ("host=a,b port=5432,x", "'x'"),
])
def test_a_database_url_with_a_bad_port_is_bad_input_not_an_outage(url, port):
    # libpq reads the port only when connecting: unchecked, a typo looked like Postgres away
    with pytest.raises(ConfigError, match=f"TOCK_DATABASE_URL: has port {port}; a port is"):
        ClientSettings(database_url=url)
    assert ClientSettings(database_url="host=a,b port=5432,").database_url


@pytest.mark.parametrize("url", [
    f"postgresql://me:{PASSWORD}@[db/tock",  # libpq quotes the whole URL
    f"postgresql://me:{PASSWORD}%zz@db/tock",  # ... or the token it could not decode
    f"postgresql://me@db/tock?password={PASSWORD}%zz",
])
def test_a_malformed_database_url_is_refused_without_its_password(monkeypatch, url):
    monkeypatch.setenv("TOCK_DATABASE_URL", url)
    with pytest.raises(ConfigError) as from_env:
        ClientSettings.load()
    with pytest.raises(ConfigError) as from_code:  # not a pydantic ValidationError
        ClientSettings(database_url=url)
    for refused in (from_env.value, from_code.value):
        assert "TOCK_DATABASE_URL: is not a Postgres connection URL" in str(refused)
        assert PASSWORD not in str(refused) and "***" in str(refused)
        assert refused.__suppress_context__  # no chained error repeats it either


@pytest.mark.parametrize(("given", "says"), [
    ({"databse_url": "postgresql://me@elsewhere/db"},
     "databse_url: not a setting of ClientSettings (did you mean database_url?)"),
    ({"bogus": 1}, "bogus: not a setting of ClientSettings"),
])
def test_a_keyword_that_is_not_a_setting_is_refused(given, says):
    with pytest.raises(ConfigError) as refused:
        ClientSettings(**given)
    assert says in str(refused.value)


def test_unknown_tock_variables_in_the_environment_are_harmless(monkeypatch):
    monkeypatch.setenv("TOCK_BOGUS", "1")
    monkeypatch.setenv("TOCK_DATABSE_URL", "postgresql://me@elsewhere/db")
    assert ClientSettings().database_url == ClientSettings.model_fields["database_url"].default
    ConsumerSettings.load()
    TimerSettings.load()


def test_bad_queue_names_name_the_queues_variable(monkeypatch):
    monkeypatch.setenv("TOCK_QUEUES", "a b")
    with pytest.raises(ConfigError) as refused:
        ConsumerSettings.load()
    assert "TOCK_QUEUES: queue names must match" in str(refused.value)
    assert "TOCK_* settings" not in str(refused.value)


@pytest.mark.parametrize("value", ["a,,b", "a,", ",a"])
def test_an_empty_queue_name_in_the_queues_variable_is_refused(monkeypatch, value):
    # As --queues: a stray comma is a typo, not a queue fewer.
    monkeypatch.setenv("TOCK_QUEUES", value)
    with pytest.raises(ConfigError) as refused:
        ConsumerSettings.load()
    assert f"TOCK_QUEUES: empty queue name in {value!r}" in str(refused.value)


def test_queue_names_in_the_queues_variable_may_have_blanks_around_them(monkeypatch):
    monkeypatch.setenv("TOCK_QUEUES", " default , reports ")
    assert ConsumerSettings.load().queues == ["default", "reports"]


@pytest.mark.parametrize("value", ["0.5", "0.001"])
def test_a_fire_cap_under_one_per_second_is_refused_not_rounded_up(monkeypatch, value):
    monkeypatch.setenv("TOCK_SCHEDULE_MAX_FIRES_PER_SECOND", value)
    with pytest.raises(ConfigError, match="TOCK_SCHEDULE_MAX_FIRES_PER_SECOND: .* must be 0 "
                                          r"\(no cap\) or at least 1"):
        TimerSettings.load()


def test_a_fire_cap_of_zero_or_one_and_up_loads(monkeypatch):
    for value in ("0", "1", "2.5"):
        monkeypatch.setenv("TOCK_SCHEDULE_MAX_FIRES_PER_SECOND", value)
        TimerSettings.load()


@pytest.mark.parametrize(("level", "fmt"), [("debug", "HUMAN"), (" Warning ", "Json")])
def test_the_log_level_and_format_take_any_case(monkeypatch, level, fmt):
    monkeypatch.setenv("TOCK_LOG_LEVEL", level)
    monkeypatch.setenv("TOCK_LOG_FORMAT", fmt)
    settings = TimerSettings.load()
    assert (settings.log_level, settings.log_format) == (level.strip().upper(),
                                                         fmt.lower())
    monkeypatch.setenv("TOCK_LOG_LEVEL", "verbose")
    with pytest.raises(ConfigError, match="TOCK_LOG_LEVEL"):
        TimerSettings.load()


@pytest.mark.parametrize("value", ["a\nb", "a\u200bb", "a\u00a0b"])
def test_a_worker_id_that_would_show_as_another_is_refused(monkeypatch, value):
    """`tock workers` showed TOCK_WORKER_ID="a\\nb" as "a b" (a bad-input walkthrough)."""
    monkeypatch.setenv("TOCK_WORKER_ID", value)
    with pytest.raises(ConfigError, match="TOCK_WORKER_ID: worker id contains U\\+"):
        ConsumerSettings.load()
    monkeypatch.setenv("TOCK_WORKER_ID", "web-1 a")
    assert ConsumerSettings.load().worker_id == "web-1 a"
