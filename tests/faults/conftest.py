"""The fault suite's servers, owned by this module's tests (not the session's shared
Postgres and LocalStack: the faults stop, crash and kill them)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.services import Services


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault injection against real processes and "
                                       "servers (tests/faults)")


@pytest.fixture(scope="session")
def fault_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Process logs and run logs: kept after a session with a failure, for its report;
    removed after one without, so repeated runs do not fill /tmp."""
    path = Path(tempfile.mkdtemp(prefix="tock-faults-"))
    yield path
    if request.session.testsfailed:
        print(f"\nfault suite logs kept in {path}")
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def fault_services(fault_dir: Path) -> Iterator[Services]:
    services = Services.start(fault_dir / "services")
    yield services
    services.stop()
