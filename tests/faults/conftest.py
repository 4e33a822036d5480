"""The fault suite's servers, owned by this module's tests (not the session's shared
Postgres and LocalStack: the faults stop, crash and kill them)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.services import Services


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault injection against real processes and "
                                       "servers (tests/faults)")


@pytest.fixture(scope="session")
def fault_dir() -> Path:
    """Process logs and run logs; kept after the run for failure reports."""
    return Path(tempfile.mkdtemp(prefix="tock-faults-"))


@pytest.fixture(scope="module")
def fault_services(fault_dir: Path) -> Iterator[Services]:
    services = Services.start(fault_dir / "services")
    yield services
    services.stop()
