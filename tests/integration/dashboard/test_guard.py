"""What every request passes before FastAPI sees it (dashboard.guard), and the settings
behind it: dev mode only on loopback, the Host allow-list (DNS rebinding), credentials
before the body is read, the body size cap, the JSON depth limit, and /metrics behind a
token. Against the per-test Postgres, through TestClient or a real uvicorn server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from dashboard.__main__ import main
from dashboard.app import create_app
from dashboard.auth import same_origin
from dashboard.guard import MAX_JSON_DEPTH, json_depth_exceeds
from dashboard.settings import DEV_OPERATOR_TOKEN, DashboardSettings
from devstack.run import Stack, process_env
from shared.core.errors import ConfigError
from tests.infra.processes import load_settings
from tests.support.dashboard import METRICS, OPERATOR, VIEWER, LiveServer

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


# ------------------------------------------------------------------ dev mode and hosts

@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "tock.example.com"])
def test_dev_mode_is_refused_unless_the_dashboard_listens_on_loopback(database_url, host):
    with pytest.raises(ConfigError) as refused:
        DashboardSettings.load(database_url=database_url, dashboard_dev=True,
                               dashboard_host=host)
    assert "TOCK_DASHBOARD_DEV" in str(refused.value)
    assert "TOCK_DASHBOARD_HOST" in str(refused.value)
    for loopback in ("127.0.0.1", "::1", "localhost"):
        assert DashboardSettings.load(database_url=database_url, dashboard_dev=True,
                                      dashboard_host=loopback).dashboard_dev


def test_dev_mode_on_all_interfaces_stops_python_m_dashboard(database_url, monkeypatch,
                                                               capsys):
    monkeypatch.setenv("TOCK_DATABASE_URL", database_url)
    monkeypatch.setenv("TOCK_DASHBOARD_DEV", "1")
    monkeypatch.setenv("TOCK_DASHBOARD_HOST", "0.0.0.0")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "TOCK_DASHBOARD_DEV" in err and "TOCK_DASHBOARD_HOST" in err
    monkeypatch.delenv("TOCK_DASHBOARD_HOST")
    assert main(["--host", "0.0.0.0"]) == 2


def test_make_run_starts_the_dashboard_in_dev_mode_on_loopback(database_url, monkeypatch):
    monkeypatch.setenv("TOCK_DASHBOARD_HOST", "0.0.0.0")  # left over in a developer's shell
    env = process_env(Stack(sqs=SimpleNamespace(env=dict)), database_url)
    settings = load_settings("dashboard", {k: v for k, v in env.items()
                                           if k.startswith("TOCK_")}, monkeypatch)
    assert isinstance(settings, DashboardSettings)
    assert settings.dashboard_dev and settings.loopback_only


@pytest.mark.parametrize(("host", "allowed"), [
    ("127.0.0.1", ["127.0.0.1", "localhost"]),
    ("0.0.0.0", ["localhost", "127.0.0.1"]),
    ("::", ["localhost", "127.0.0.1"]),
    ("10.0.0.5", ["10.0.0.5", "localhost", "127.0.0.1"]),
    ("::1", ["::1", "localhost", "127.0.0.1"]),
])
def test_allowed_hosts_default_to_the_bind_address_and_loopback(database_url, host, allowed):
    settings = DashboardSettings.load(database_url=database_url, dashboard_host=host,
                                      dashboard_operator_token=OPERATOR)
    assert settings.dashboard_allowed_hosts == allowed


def test_allowed_hosts_come_comma_separated_from_the_environment(database_url, monkeypatch):
    monkeypatch.setenv("TOCK_DASHBOARD_ALLOWED_HOSTS", " Tock.Example.com, 10.0.0.5,[::1],")
    settings = DashboardSettings.load(database_url=database_url,
                                      dashboard_operator_token=OPERATOR)
    assert settings.dashboard_allowed_hosts == ["tock.example.com", "10.0.0.5", "::1"]
    assert settings.host_allowed("TOCK.example.com.") and not settings.host_allowed("x.com")
    monkeypatch.setenv("TOCK_DASHBOARD_ALLOWED_HOSTS", "*")
    anything = DashboardSettings.load(database_url=database_url,
                                      dashboard_operator_token=OPERATOR)
    assert anything.host_allowed(REBOUND)


@pytest.mark.parametrize("value", ["https://tock.example.com", "tock.example.com:443",
                                   "tock.example.com/", "", " , "])
def test_allowed_hosts_refuse_what_is_not_a_host_name(database_url, monkeypatch, value):
    monkeypatch.setenv("TOCK_DASHBOARD_ALLOWED_HOSTS", value)
    with pytest.raises(ConfigError, match="TOCK_DASHBOARD_ALLOWED_HOSTS"):
        DashboardSettings.load(database_url=database_url, dashboard_operator_token=OPERATOR)


@pytest.mark.parametrize("path", ["/api/jobs", "/api/me", "/login", "/", "/static/app.js",
                                  "/openapi.json", "/metrics"])
def test_a_host_not_on_the_allow_list_is_refused_first(operator, path):
    res = operator.get(path, headers={"Host": REBOUND})
    assert res.status_code == 400
    assert res.json()["detail"].startswith("host not allowed")
    res = operator.get(path, headers={"Host": f"{REBOUND}:8080"})
    assert res.status_code == 400


def test_allowed_hosts_match_without_port_case_or_trailing_dot(operator):
    for host in ("127.0.0.1:8080", "LOCALHOST", "localhost.", "testserver:80"):
        assert operator.get("/api/me", headers={"Host": host}).status_code == 200, host
    for host in ("", "127.0.0.1:notaport", "localhost.evil.example", "127.0.0.1.evil"):
        assert operator.get("/api/me", headers={"Host": host}).status_code == 400, host


def test_probes_answer_any_host_as_kubelets_and_load_balancers_ask_by_ip(anon):
    # They change nothing and show no data; a kubelet sends Host: <pod ip>:<port>.
    assert anon.get("/healthz", headers={"Host": "10.1.2.3:8080"}).text == "ok\n"
    assert anon.get("/readyz", headers={"Host": "10.1.2.3:8080"}).status_code == 200
    assert anon.get("/metrics", headers={"Host": "10.1.2.3:8080",
                                         **bearer(METRICS)}).status_code == 400


def test_dns_rebinding_with_the_public_dev_token_writes_nothing(database_url, db):
    """A page on rebind.attacker.example, its name pointed at 127.0.0.1 after loading,
    sends the dev tokens everyone knows: every way in is refused."""
    settings = DashboardSettings.load(database_url=database_url, dashboard_dev=True)
    origin = {"Origin": f"http://{REBOUND}"}
    with client_for(settings, base_url=f"http://{REBOUND}") as page:
        res = page.post("/api/jobs", json={"kind": "email"},
                        headers={**origin, **bearer(DEV_OPERATOR_TOKEN)})
        assert res.status_code == 400 and "host not allowed" in res.text
        assert page.get("/login").status_code == 400
        res = page.post("/login", data={"token": DEV_OPERATOR_TOKEN, "csrf_token": "x"},
                        headers=origin)
        assert res.status_code == 400
        assert page.get("/api/jobs", headers=bearer(DEV_OPERATOR_TOKEN)).status_code == 400
    assert jobs(db) == 0
    # The same calls from the dashboard's own address work.
    with client_for(settings, base_url="http://127.0.0.1:8080") as local:
        res = local.post("/api/jobs", json={"kind": "email"},
                         headers={"Origin": "http://127.0.0.1:8080",
                                  **bearer(DEV_OPERATOR_TOKEN)})
        assert res.status_code == 201
    assert jobs(db) == 1


def _request(app: Any, host: str, origin: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/api/jobs", "app": app,
                    "headers": [(b"host", host.encode()), (b"origin", origin.encode())]})


def test_origin_is_judged_by_the_allow_list_not_by_the_host_header(app):
    """Were the Host check ever bypassed, Origin == Host would still not be enough."""
    assert not same_origin(_request(app, REBOUND, f"http://{REBOUND}"))
    assert not same_origin(_request(app, f"{REBOUND}:8080", f"http://{REBOUND}:8080"))
    assert same_origin(_request(app, "testserver", "http://testserver"))
    assert same_origin(_request(app, "127.0.0.1:8080", "http://127.0.0.1:8080"))
    # Another port or scheme of an allowed host is another origin.
    assert not same_origin(_request(app, "127.0.0.1:8080", "http://127.0.0.1:9090"))
    assert not same_origin(_request(app, "127.0.0.1:8080", "http://localhost:8080"))
    assert not same_origin(_request(app, "testserver:80", "https://testserver"))
    assert not same_origin(_request(app, "testserver:443", "http://testserver"))
    assert same_origin(_request(app, "testserver:443", "https://testserver"))
    # Behind a TLS proxy that passes Host on, the page is https and Host has no port.
    assert same_origin(_request(app, "testserver", "https://testserver"))
    for bad in ("null", "http://", "ftp://testserver", "http://testserver:99999",
                "http://user@testserver", "http://testserver/path"):
        assert not same_origin(_request(app, "testserver", bad)), bad


def test_secure_cookies_want_an_https_origin(dashboard_settings):
    secure = dashboard_settings.model_copy(update={"dashboard_secure_cookies": True})
    app = create_app(secure)
    assert same_origin(_request(app, "testserver", "https://testserver"))
    assert not same_origin(_request(app, "testserver:80", "http://testserver"))


def _login(client: TestClient, token: str) -> str:
    client.get("/login")
    res = client.post("/login", data={"token": token,
                                      "csrf_token": client.cookies["tock_login_csrf"]},
                      follow_redirects=False)
    assert res.status_code == 303, res.text
    csrf: str = client.get("/api/me").json()["csrf_token"]
    return csrf


def test_session_state_changes_need_this_very_origin(anon, db):
    csrf = _login(anon, OPERATOR)
    for origin in ("http://testserver:8080", "https://testserver:8443", "http://localhost",
                   f"http://{REBOUND}"):
        res = anon.post("/api/jobs", json={"kind": "email"},
                        headers={"X-CSRF-Token": csrf, "Origin": origin})
        assert res.status_code == 403 and "cross-site" in res.json()["detail"], origin
    assert jobs(db) == 0
    res = anon.post("/api/jobs", json={"kind": "email"},
                    headers={"X-CSRF-Token": csrf, "Origin": "http://testserver"})
    assert res.status_code == 201
    assert jobs(db) == 1


# ------------------------------------------------------------ credentials before the body

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


def test_a_session_cookie_passes_the_guard_and_a_forged_one_does_not(anon):
    _login(anon, VIEWER)
    assert anon.get("/api/me").json()["role"] == "viewer"
    anon.cookies.set("tock_session", "forged.cookie")
    assert anon.get("/api/me").status_code == 401


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

