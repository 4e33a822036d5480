"""The small fault profile (part of `make test`): every scenario with 60 jobs against
real timer and consumer processes and the suite's own Postgres and LocalStack. Each test
asserts every invariant of `tests.faults.invariants`, and that the jobs drain within 15 s
of the fault's end. On failure the process logs are printed (and kept on disk).

`TOCK_FAULT_SEED=<n>` replays a run's random choices (jobs, delays, kill schedule); every
summary prints its seed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.profiles import PROFILES
from tests.faults.runner import run_scenario
from tests.faults.scenarios import SCENARIOS
from tests.faults.services import Services

pytestmark = pytest.mark.faults

PROFILE = PROFILES["small"]
SEED = int(os.environ["TOCK_FAULT_SEED"]) if os.environ.get("TOCK_FAULT_SEED") else None


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault(name: str, fault_services: Services, fault_dir: Path) -> None:
    result = run_scenario(fault_services, SCENARIOS[name], PROFILE, fault_dir, SEED)
    print(result.summary())
    if not result.ok:
        print(result.logs)
    assert result.ok, result.summary(limit=10)
    assert result.drain_seconds is not None
    assert result.drain_seconds <= PROFILE.drain_bound

