"""What the dashboard guard tests share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.settings import DashboardSettings

REBOUND = "rebind.attacker.example"

def jobs(db: Any) -> int:
    count: int = db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0]
    return count


@contextmanager
def client_for(settings: DashboardSettings, **kwargs: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings), **kwargs) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}



def login(client: TestClient, token: str) -> str:
    client.get("/login")
    res = client.post("/login", data={"token": token,
                                      "csrf_token": client.cookies["tock_login_csrf"]},
                      follow_redirects=False)
    assert res.status_code == 303, res.text
    csrf: str = client.get("/api/me").json()["csrf_token"]
    return csrf
