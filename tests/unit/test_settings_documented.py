"""Every variable tock reads is in the README, by name: each field of the settings
classes, and each `TOCK_*` name the processes read themselves."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from dashboard import settings as dashboard_settings
from shared.runtime import settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SOURCES = ["shared", "timer_service", "consumer", "dashboard", "cli",
           # make run and the local SQS: a user sets these too (TOCK_LOCALSTACK_VENV, and
           # TOCK_DLQ_MAX_RECEIVE_COUNT of localstack/init/ready.d/create_queues.py).
           "devstack", "localstack"]
LITERAL = re.compile(r"""["'](TOCK_[A-Z0-9_]*[A-Z0-9])["']""")


def from_settings() -> set[str]:
    names = set()
    for module in (settings, dashboard_settings):
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and issubclass(cls, BaseSettings)
                    and cls.__module__ == module.__name__):
                continue
            prefix = str(cls.model_config.get("env_prefix", "")).upper()
            names.update(prefix + field.upper() for field in cls.model_fields)
    return names


def from_sources() -> set[str]:
    return {name for folder in SOURCES for path in (ROOT / folder).rglob("*.py")
            for name in LITERAL.findall(path.read_text())}


VARIABLES = sorted(from_settings() | from_sources())


def test_the_scan_finds_both_kinds() -> None:
    assert "TOCK_LEASE_SECONDS" in VARIABLES and "TOCK_DASHBOARD_OPERATOR_TOKEN" in VARIABLES


def test_the_scan_covers_make_run_and_localstack() -> None:
    assert {"TOCK_LOCALSTACK_VENV", "TOCK_DLQ_MAX_RECEIVE_COUNT"} <= set(VARIABLES)


@pytest.mark.parametrize("variable", VARIABLES)
def test_variable_is_documented(variable: str) -> None:
    assert f"`{variable}`" in README, f"{variable} is read but README.md never names it"


def test_the_processes_know_every_variable_tock_reads() -> None:
    # Else a process would warn of a real setting as unknown (or miss a typo).
    assert settings.known_variables() == set(VARIABLES)


def test_an_unknown_variable_is_named_with_the_closest_known_one() -> None:
    environ = {"TOCK_CONCURENCY": "4", "TOCK_LEASE_SECONDS": "30", "TOCK_XYZZY": "1",
               "PATH": "/bin"}
    assert settings.unknown_variables(environ) == [("TOCK_CONCURENCY", "TOCK_CONCURRENCY"),
                                                   ("TOCK_XYZZY", None)]
