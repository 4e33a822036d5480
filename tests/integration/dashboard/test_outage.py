"""The dashboard while Postgres is away: every call answers 503 within the dashboard's
short pool wait (not the producer client's 30 s, which a page polling every second would
pile up behind), and answers again once Postgres is back. Its own throwaway Postgres server,
stopped for real (the session's is shared by other tests)."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from dashboard.app import POOL_TIMEOUT_SECONDS, create_app
from dashboard.settings import DashboardSettings
from tests.support.dashboard import OPERATOR, TEST_HOSTS
from tests.support.wait import wait_for


def _timed(client: TestClient, method: str, path: str) -> tuple[int, float]:
    started = time.monotonic()
    status = client.request(method, path).status_code
    return status, time.monotonic() - started


def test_every_call_answers_503_soon_while_postgres_is_down_and_recovers(server):
    settings = DashboardSettings(database_url=server.url(), dashboard_operator_token=OPERATOR,
                                 dashboard_allowed_hosts=TEST_HOSTS)
    with TestClient(create_app(settings),
                    headers={"Authorization": f"Bearer {OPERATOR}"}) as c:
        job = c.post("/api/jobs", json={"kind": "email", "delay": 3600}).json()["id"]
        assert c.get(f"/api/jobs/{job}").status_code == 200  # both pools hold a connection
        assert c.get("/api/jobs").status_code == 200
        server.stop("immediate")
        bound = 3 * POOL_TIMEOUT_SECONDS  # far under the 30 s it took
        # The job's page, the schedules page and the job's buttons go through the client's
        # pool, the lists and counts through the dashboard's own: each answers soon.
        for method, path in [("GET", f"/api/jobs/{job}"), ("GET", "/api/schedules"),
                             ("GET", "/api/limits"), ("POST", f"/api/jobs/{job}/cancel"),
                             ("GET", "/api/jobs"), ("GET", "/api/stats/overview")]:
            status, took = _timed(c, method, path)
            assert status == 503, (method, path, status)
            assert took < bound, f"{method} {path} took {took:.1f} s to answer 503"
        # The dashboard's setting, not the Python client's (which it uses inside), and why:
        # the lists and counts said only "couldn't get a connection after 3.00 sec".
        for path in (f"/api/jobs/{job}", "/api/jobs", "/api/stats/overview"):
            detail = c.get(path).json()["detail"]
            assert "cannot use the database at" in detail, (path, detail)
            assert "the dashboard's TOCK_DATABASE_URL" in detail, (path, detail)
            assert "ClientSettings" not in detail, (path, detail)
        server.start()
        wait_for(lambda: c.get(f"/api/jobs/{job}").status_code == 200, timeout=20,
                 message="the job's page to answer again")
        assert c.get("/api/jobs").status_code == 200


def test_readiness_failing_for_one_reason_is_logged_once_not_per_probe(server, caplog):
    """A chaos walkthrough's minute of outage, probed every second: 61 not_ready lines."""
    settings = DashboardSettings(database_url=server.url(), dashboard_operator_token=OPERATOR,
                                 dashboard_allowed_hosts=TEST_HOSTS)
    with TestClient(create_app(settings)) as c:
        assert c.get("/readyz").status_code == 200
        server.stop("immediate")
        with caplog.at_level("WARNING", logger="tock.dashboard"):
            for _ in range(5):
                assert c.get("/readyz").status_code == 503
        said = [r for r in caplog.records if getattr(r, "event", "") == "not_ready"]
        assert len(said) == 1, [r.fields for r in said]
        server.start()
        wait_for(lambda: c.get("/readyz").status_code == 200, timeout=20,
                 message="ready again")
