"""The dashboard guard: development mode only on loopback, the Host allow-list, and the
Origin of browser state changes judged by it (DNS rebinding)."""

from __future__ import annotations

import http.client
import json
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from dashboard.__main__ import main
from dashboard.app import create_app
from dashboard.auth import same_origin
from dashboard.settings import DEV_OPERATOR_TOKEN, DashboardSettings
from devstack.run import Stack, process_env
from shared.core.errors import ConfigError
from tests.infra.processes import load_settings
from tests.integration.dashboard.guard_helpers import REBOUND, bearer, client_for, jobs, login
from tests.support.dashboard import METRICS, OPERATOR


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



def test_session_state_changes_need_this_very_origin(anon, db):
    csrf = login(anon, OPERATOR)
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


@pytest.mark.parametrize(("name", "values"), [
    ("Authorization", [f"Bearer {OPERATOR}", "Bearer someone-else"]),
    ("Origin", ["http://127.0.0.1", "http://evil.example"]),
    ("Host", ["127.0.0.1", "tock.example.com"]),
    ("Content-Type", ["application/json", "text/plain"]),
])
def test_a_header_read_as_one_value_sent_twice_is_refused(live_server, db, name, values):
    """Which of two Authorization (or Origin, Host) headers a check reads is not what every
    proxy in front of the dashboard forwards or logs: refused, over a real HTTP server."""
    conn = http.client.HTTPConnection("127.0.0.1", live_server.port, timeout=10)
    conn.putrequest("POST", "/api/jobs", skip_host=True)
    if name != "Host":
        conn.putheader("Host", "127.0.0.1")
    if name != "Authorization":
        conn.putheader("Authorization", f"Bearer {OPERATOR}")
    if name != "Content-Type":
        conn.putheader("Content-Type", "application/json")
    for value in values:
        conn.putheader(name, value)
    body = b'{"kind": "email"}'
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    res = conn.getresponse()
    if name == "Host":
        # uvicorn's HTTP parser refuses two Host headers on its own and closes the
        # connection with the body unread, so the kernel may reset it before the
        # client reads the response body: the status line is the answer.
        assert res.status == 400
    else:
        text = res.read()
        assert res.status == 400, text
        assert json.loads(text)["detail"] == f"the {name} header was sent 2 times: send it once"
    conn.close()
    assert jobs(db) == 0
