"""Dashboard fixtures (a pytest plugin, loaded by tests/conftest.py): the app against the
per-test database, HTTP clients with each role, a real uvicorn server on a free loopback
port for the browser, and Chromium from Debian's package for pytest-playwright."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from devstack.ports import free_port
from tests.support.wait import wait_for

OPERATOR = "operator-token-for-tests-0001"
VIEWER = "viewer-token-for-tests-00001"
METRICS = "metrics-token-for-tests-0001"
TEST_HOSTS = ["testserver", "127.0.0.1", "localhost"]
"""TestClient sends `Host: testserver`; the live server is reached at 127.0.0.1."""


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    # `playwright install` cannot download a browser here: use Debian's Chromium.
    return {**browser_type_launch_args, "executable_path": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run"]}


@pytest.fixture
def dashboard_settings(database_url: str) -> DashboardSettings:
    return DashboardSettings(database_url=database_url, dashboard_operator_token=OPERATOR,
                             dashboard_viewer_token=VIEWER, dashboard_metrics_token=METRICS,
                             dashboard_allowed_hosts=TEST_HOSTS,
                             dashboard_stats_ttl_seconds=0, dashboard_finished_ttl_seconds=0)


@pytest.fixture
def app(dashboard_settings: DashboardSettings) -> Any:
    return create_app(dashboard_settings)


@pytest.fixture
def anon(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def operator(app: Any) -> Iterator[TestClient]:
    with TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"}) as c:
        yield c


@pytest.fixture
def viewer(app: Any) -> Iterator[TestClient]:
    with TestClient(app, headers={"Authorization": f"Bearer {VIEWER}"}) as c:
        yield c


class LiveServer:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None,
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=20, message="uvicorn to start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_server(app: Any) -> Iterator[LiveServer]:
    server = LiveServer(app)
    server.start()
    yield server
    server.stop()


def make_dead(db, job_id: int, error: str = "boom") -> None:
    db.execute("UPDATE tock_jobs SET state = 'dead', attempt = 3, max_attempts = 3, "
               "finished_at = now(), last_error = %s WHERE id = %s", (error, job_id))
    db.execute("INSERT INTO tock_attempts (job_id, attempt, worker, started_at, finished_at, "
               "outcome, error) VALUES (%s, 3, 'w1', now() - interval '1 s', now(), 'failed', "
               "%s)", (job_id, error))


def run_to(db, job_id: int, state: str = "dead", error: str | None = "boom") -> None:
    """Take a job through a claim and its outcome with the real statements, so it leaves
    tock_jobs for the history as a consumer's outcome moves it (`make_dead` instead leaves
    it in tock_jobs, as jobs finished before migration 0007 are)."""
    from shared.core.states import AttemptOutcome, JobState
    from shared.store import JobStore
    from shared.store.rows import AttemptResult, Lease

    token = db.execute(
        "UPDATE tock_jobs SET state = 'running', attempt = attempt + 1, lease_owner = 'w1', "
        "lease_expires_at = now() + interval '1 min', dispatch_token = gen_random_uuid(), "
        "started_at = now() WHERE id = %s RETURNING dispatch_token", (job_id,)).fetchone()[0]
    attempt = db.execute("SELECT attempt FROM tock_jobs WHERE id = %s", (job_id,)).fetchone()[0]
    outcome = AttemptOutcome.SUCCEEDED if state == "succeeded" else AttemptOutcome.PERMANENT
    written = JobStore.on(db).finish_attempts([AttemptResult(
        Lease(job_id, attempt, token), JobState(state), outcome,
        error=None if state == "succeeded" else error)], "w1")
    assert written == {job_id}
