"""The dashboard guard: credentials before bodies, the body size cap, JSON depth, and
/metrics behind a token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.guard import MAX_JSON_DEPTH, json_depth_exceeds
from dashboard.settings import DashboardSettings
from shared.core.errors import ConfigError
from tests.integration.dashboard.guard_helpers import bearer, client_for, jobs, login
from tests.support.dashboard import METRICS, OPERATOR, VIEWER, LiveServer
from tests.support.wait import wait_for


class Body:
    """A streamed (chunked) request body that counts how much of it was pulled."""

    def __init__(self, chunks: int, size: int = 1024 * 1024) -> None:
        self.chunks, self.size, self.pulled = chunks, size, 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.pulled += 1
            yield b"[" * self.size


def test_api_without_credentials_is_refused_before_the_body_is_read(anon, db):
    body = Body(chunks=30)  # 30 MiB
    res = anon.post("/api/jobs", content=iter(body),
                    headers={"Content-Type": "application/json"})
    assert res.status_code == 401
    assert res.headers["www-authenticate"] == "Bearer"
    assert body.pulled == 0
    res = anon.post("/api/jobs", content=b"{not json", headers={"Content-Type":
                                                                  "application/json"})
    assert res.status_code == 401 and "authentication required" in res.json()["detail"]
    res = anon.post("/api/jobs", content=b"{not json", headers=bearer("wrong-token"))
    assert res.status_code == 401 and res.json()["detail"] == "invalid token"
    res = anon.post("/api/jobs", content=b"x" * (30 * 1024 * 1024))
    assert res.status_code == 401
    assert anon.post("/api/jobs/1/retry").status_code == 401
    assert anon.get("/api/schedules").status_code == 401
    assert jobs(db) == 0


def test_pages_probes_and_assets_stay_open(anon):
    assert anon.get("/healthz").status_code == 200
    assert anon.get("/readyz").status_code == 200
    assert anon.get("/login").status_code == 200
    assert anon.get("/static/app.js").status_code == 200
    assert anon.get("/openapi.json").status_code == 200
    assert anon.get("/", follow_redirects=False).headers["location"] == "/login"


def test_head_is_answered_as_get_without_a_body_through_uvicorn(live_server):
    # Load balancers and uptime checks may probe with HEAD; a 405 would read as "down".
    for path in ("/healthz", "/readyz", "/login"):
        got, head = (httpx.request(m, live_server.url + path, timeout=10)
                     for m in ("GET", "HEAD"))
        assert (head.status_code, head.content) == (200, b""), path
        assert head.headers["content-type"] == got.headers["content-type"]
        assert head.headers["content-length"] == got.headers["content-length"]
    # Through the guard and the route as the GET would go: credentials still needed.
    assert httpx.head(f"{live_server.url}/api/stats/overview", timeout=10).status_code == 401
    res = httpx.head(f"{live_server.url}/api/stats/overview", timeout=10,
                     headers=bearer(VIEWER))
    assert (res.status_code, res.content) == (200, b"")
    # A HEAD is never a write: the operator's POST routes answer it as 405, as a GET.
    res = httpx.head(f"{live_server.url}/api/jobs/1/retry", timeout=10,
                     headers=bearer(OPERATOR))
    assert res.status_code == 405


def test_a_session_cookie_passes_the_guard_and_a_forged_one_does_not(anon):
    login(anon, VIEWER)
    assert anon.get("/api/me").json()["role"] == "viewer"
    anon.cookies.set("tock_session", "forged.cookie")
    assert anon.get("/api/me").status_code == 401


LATIN1 = "\u00e9t\u00e9"
"""Text outside ASCII, as a client may send it in a cookie, a header or a form field
(HTTP headers arrive as Latin-1): a comparison of secrets refuses it, never fails on it."""


def test_secrets_sent_outside_ascii_are_refused_not_a_500(anon):
    def raw(name: str, value: str) -> list[tuple[bytes, bytes]]:
        return [(name.encode(), value.encode("latin-1"))]

    # A session cookie whose signature is not ASCII, on the API (the guard) and the page.
    res = anon.get("/api/me", headers=raw("cookie", f"tock_session=e30.{LATIN1}"))
    assert res.status_code == 401
    res = anon.get("/", headers=raw("cookie", f"tock_session=e30.{LATIN1}"),
                   follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/login"
    # The login form's CSRF token, in the form and in its cookie.
    anon.get("/login")
    res = anon.post("/login", data={"token": OPERATOR, "csrf_token": LATIN1})
    assert res.status_code == 403
    res = anon.post("/login", data={"token": OPERATOR, "csrf_token": "x"},
                    headers=raw("cookie", f"tock_login_csrf={LATIN1}"))
    assert res.status_code == 403
    res = anon.post("/login", data={"token": LATIN1 * 8,
                                    "csrf_token": anon.cookies["tock_login_csrf"]})
    assert res.status_code == 401
    # A session's CSRF token, on a state change and on logout.
    login(anon, OPERATOR)
    res = anon.post("/api/jobs", json={"kind": "email"}, headers=raw("x-csrf-token", LATIN1))
    assert res.status_code == 403 and "X-CSRF-Token" in res.json()["detail"]
    res = anon.post("/logout", data={"csrf_token": LATIN1}, follow_redirects=False)
    assert res.status_code == 403
    assert anon.get("/api/me").json()["role"] == "operator"
    # A bearer token outside ASCII, on the API and on /metrics.
    assert anon.get("/api/me", headers=raw("authorization", f"Bearer {LATIN1}")
                    ).status_code == 401
    assert anon.get("/metrics", headers=raw("authorization", f"Bearer {LATIN1}")
                    ).status_code == 401


# ------------------------------------------------------------------- body size, depth

@pytest.fixture
def small(dashboard_settings: DashboardSettings) -> Iterator[TestClient]:
    settings = dashboard_settings.model_copy(update={"dashboard_max_body_bytes": 4096})
    with client_for(settings, headers=bearer(OPERATOR)) as c:
        yield c


def test_bodies_over_the_limit_are_refused_by_content_length_unread(small, db):
    body = Body(chunks=4, size=2048)
    res = small.post("/api/jobs", content=iter(body),
                     headers={"Content-Length": "8192", "Content-Type": "application/json"})
    assert res.status_code == 413
    assert "4096 bytes" in res.json()["detail"]
    assert body.pulled == 0
    # Exactly the limit is fine.
    text = '{"kind": "email", "payload": "x"}'
    res = small.post("/api/jobs", content=text + " " * (4096 - len(text)),
                     headers={"Content-Type": "application/json"})
    assert res.status_code == 201, res.text
    res = small.post("/api/jobs", content=text + " " * (4097 - len(text)),
                     headers={"Content-Type": "application/json"})
    assert res.status_code == 413
    assert jobs(db) == 1


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(dashboard_settings, db):
    # At the ASGI level: TestClient hands a streamed body over in one piece.
    settings = dashboard_settings.model_copy(update={"dashboard_max_body_bytes": 4096})
    app = create_app(settings)
    pulled, sent = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b" " * 1024, "more_body": pulled < 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/jobs", "raw_path": b"/api/jobs",
             "query_string": b"", "http_version": "1.1", "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1), "root_path": "",
             "headers": [(b"host", b"testserver"), (b"transfer-encoding", b"chunked"),
                         (b"authorization", f"Bearer {OPERATOR}".encode()),
                         (b"content-type", b"application/json")]}
    # In a thread of its own: Playwright's sync API may hold this thread's event loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(anyio.run, app, scope, receive, send).result(timeout=30)
    assert sent[0]["status"] == 413
    assert pulled == 5  # 4096 bytes, and the chunk that went over
    assert jobs(db) == 0


def test_the_default_limit_is_one_mebibyte(operator, db):
    assert DashboardSettings(dashboard_operator_token=OPERATOR).dashboard_max_body_bytes \
        == 1048576
    res = operator.post("/api/jobs", content=iter(Body(chunks=2)),
                        headers={"Content-Type": "application/json"})
    assert res.status_code == 413
    assert "1048576 bytes" in res.json()["detail"]


def test_a_chunked_body_over_the_limit_through_uvicorn(dashboard_settings, db):
    settings = dashboard_settings.model_copy(update={"dashboard_max_body_bytes": 4096})
    server = LiveServer(create_app(settings))
    server.start()
    try:
        def chunks() -> Iterator[bytes]:
            yield b'{"kind": "email", "payload": "'
            for _ in range(8):
                yield b"x" * 1024
            yield b'"}'

        res = httpx.post(f"{server.url}/api/jobs", content=chunks(), timeout=10,
                         headers={**bearer(OPERATOR), "Content-Type": "application/json"})
        assert res.status_code == 413
        assert res.headers.get("transfer-encoding") is None
        assert res.json()["detail"].startswith("request body is larger than 4096")
        res = httpx.post(f"{server.url}/api/jobs", json={"kind": "email"}, timeout=10,
                         headers=bearer(OPERATOR))
        assert res.status_code == 201
    finally:
        server.stop()
    assert jobs(db) == 1


@pytest.mark.parametrize("depth", [50000, 2000, 990, MAX_JSON_DEPTH + 1])
@pytest.mark.parametrize("kind", ['"kind":"a",', ""])
def test_deeply_nested_json_is_a_clear_400_never_a_500(operator, db, depth, kind):
    body = '{' + kind + '"payload":' + "[" * depth + "]" * depth + "}"
    res = operator.post("/api/jobs", content=body, headers={"Content-Type":
                                                            "application/json"})
    assert res.status_code == 400
    assert res.json()["detail"] == f"request body is JSON nested deeper than " \
                                   f"{MAX_JSON_DEPTH} levels"
    assert jobs(db) == 0


def test_json_depth_counts_brackets_outside_strings_only(operator):
    assert not json_depth_exceeds(b"[" * 10 + b"]" * 10, limit=10)
    assert json_depth_exceeds(b"[" * 11 + b"]" * 11, limit=10)
    assert json_depth_exceeds(b'{"a":' * 11 + b"1" + b"}" * 11, limit=10)
    text = '"' + "[" * 500 + '\\"{' * 100 + '"'
    assert not json_depth_exceeds(('{"a": [' + text + "]}").encode(), limit=10)
    # Linear: an unterminated string of escaped quotes once took minutes (a regex retried
    # at every quote). A megabyte is scanned well within a second.
    started = time.perf_counter()
    assert not json_depth_exceeds(b"[]" * 60 + b'"' + b'\\"' * 500_000)
    assert not json_depth_exceeds(b"[]" * 60 + b'"\\' * 500_000)
    assert time.perf_counter() - started < 1.0
    res = operator.post("/api/jobs", json={"kind": "email", "payload": {"s": "[{" * 500}})
    assert res.status_code == 201
    assert res.json()["payload"] == {"s": "[{" * 500}


# ---------------------------------------------------------------------------- /metrics

def test_metrics_need_a_token(anon, dashboard_settings):
    res = anon.get("/metrics")
    assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer"
    assert "TOCK_DASHBOARD_METRICS_TOKEN" in res.json()["detail"]
    assert anon.get("/metrics", headers=bearer("not-a-token-at-all")).status_code == 401
    for token in (METRICS, OPERATOR, VIEWER):
        res = anon.get("/metrics", headers=bearer(token))
        assert res.status_code == 200 and "tock_cluster_stats_up" in res.text
    # The metrics token reads /metrics and nothing else.
    assert anon.get("/api/jobs", headers=bearer(METRICS)).status_code == 401
    assert anon.get("/healthz").status_code == 200 and anon.get("/readyz").status_code == 200
    public = dashboard_settings.model_copy(update={"dashboard_metrics_public": True})
    with client_for(public) as c:
        assert "tock_cluster_stats_up" in c.get("/metrics").text


def test_metrics_settings(database_url, monkeypatch):
    monkeypatch.setenv("TOCK_DASHBOARD_METRICS_PUBLIC", "1")
    monkeypatch.setenv("TOCK_DASHBOARD_METRICS_TOKEN", METRICS)
    settings = DashboardSettings.load(database_url=database_url,
                                      dashboard_operator_token=OPERATOR)
    assert settings.dashboard_metrics_public and settings.dashboard_metrics_token == METRICS
    with pytest.raises(ConfigError, match="TOCK_DASHBOARD_METRICS_TOKEN must be at least"):
        DashboardSettings.load(database_url=database_url, dashboard_operator_token=OPERATOR,
                               dashboard_metrics_token="short")
    with pytest.raises(ConfigError, match="TOCK_DASHBOARD_METRICS_TOKEN must differ"):
        DashboardSettings.load(database_url=database_url, dashboard_operator_token=OPERATOR,
                               dashboard_metrics_token=OPERATOR)


def test_a_client_that_hangs_up_mid_body_leaves_no_error_in_the_log(app, db, caplog):
    """Found by hand: each aborted upload logged an ERROR with some 40 lines of traceback
    ("No response returned"), so any caller could flood the log and page someone."""
    import socket

    server = LiveServer(app)
    server.start()
    try:
        caplog.set_level("INFO")
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Authorization: Bearer " + OPERATOR.encode() + b"\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                      b'{"kind":')
            wait_for(lambda: server.server.server_state.tasks, timeout=10,
                     message="the request being handled")
        wait_for(lambda: not server.server.server_state.tasks, timeout=10,
                 message="the aborted request handled to its end")
        errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
        assert not errors, [r.getMessage() for r in errors]
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        server.stop()
