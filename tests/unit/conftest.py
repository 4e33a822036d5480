"""Fixtures of the Supervisor tests (`test_supervisor_*.py`): `stop_afterwards` stops the
Supervisors a test started, whatever happened."""

from __future__ import annotations

import pytest

from shared.runtime.supervisor import Supervisor


@pytest.fixture
def stop_afterwards():
    """Supervisors to stop at the end of the test, whatever happened."""
    started: list[Supervisor] = []
    yield started.append
    for sup in started:
        sup.stop(timeout=5)
