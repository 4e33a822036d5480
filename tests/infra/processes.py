"""Each process type's settings class, to check deployment environments against the
settings the processes actually read."""

from __future__ import annotations

import os
from typing import Any

import pytest

from dashboard.settings import DashboardSettings
from shared.runtime.settings import (
    ClientSettings,
    CommonSettings,
    ConsumerSettings,
    HealthSettings,
    TimerSettings,
)

SETTINGS: dict[str, type[CommonSettings]] = {
    "timer": TimerSettings,
    "consumer": ConsumerSettings,
    "dashboard": DashboardSettings,
    "migrate": CommonSettings,
    "producer": ClientSettings,
}


def unknown_tock_variables(process: str, env: dict[str, Any]) -> list[str]:
    """TOCK_* names in `env` that the process's settings do not read (typos, wrong process)."""
    fields = {f"TOCK_{name.upper()}" for name in SETTINGS[process].model_fields}
    if process in ("timer", "consumer"):
        fields |= {f"TOCK_HEALTH_{name.upper()}" for name in HealthSettings.model_fields}
    return sorted(k for k in env if k.startswith("TOCK_") and k not in fields)


def load_settings(process: str, env: dict[str, str],
                  monkeypatch: pytest.MonkeyPatch) -> CommonSettings:
    """Validate `env` exactly as the process would at start-up (raises ConfigError)."""
    with monkeypatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("TOCK_")]:
            patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        return SETTINGS[process].load()
