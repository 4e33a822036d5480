"""The image: Dockerfile shape, the entrypoint's process dispatch and signal path, and the
health check script. No Docker engine here, so the image is not built; checkov's
Dockerfile checks run in test_checkov.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devstack.ports import free_port
from tests.infra.dockerfile import parse
from tests.infra.paths import DOCKERFILE, ROOT
from tests.support.wait import wait_for

ENTRYPOINT = ROOT / "infra" / "docker" / "entrypoint.sh"
HEALTHCHECK = ROOT / "infra" / "docker" / "healthcheck.py"
STAGES = parse(DOCKERFILE)
FINAL = STAGES[-1]


def _one(keyword: str) -> str:
    found = [i.args for i in FINAL if i.keyword == keyword]
    assert len(found) == 1, f"final stage needs exactly one {keyword}: {found}"
    return found[0]


def test_multi_stage_with_a_slim_pinned_base():
    assert len(STAGES) >= 2
    for stage in STAGES:
        base = stage[0].args.split()[0]
        assert "slim" in base and ":" in base and not base.endswith(":latest"), base
    assert any(i.keyword == "COPY" and i.args.startswith("--from=build") for i in FINAL)


def test_final_stage_runs_as_a_non_root_user_and_installs_nothing():
    user = [i.args for i in FINAL if i.keyword == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    runs = " ".join(i.args for i in FINAL if i.keyword == "RUN")
    for tool in ("apt-get", "apk", "gcc", "build-essential", "pip install", "make"):
        assert tool not in runs, f"final stage must not install build tools: {tool}"


def test_exec_form_entrypoint_and_health_check():
    entry = [i for i in FINAL if i.keyword == "ENTRYPOINT"]
    assert entry and entry[-1].exec_form() == ["/usr/local/bin/tock-entrypoint"]
    check = [i for i in FINAL if i.keyword == "HEALTHCHECK"]
    assert check and check[-1].exec_form() == ["python", "/opt/tock/healthcheck.py"]
    # The files the final stage copies in are the ones tested below.
    copies = " ".join(i.args for i in FINAL if i.keyword == "COPY")
    assert "infra/docker/entrypoint.sh /usr/local/bin/tock-entrypoint" in copies
    assert "infra/docker/healthcheck.py /opt/tock/healthcheck.py" in copies


def test_dockerignore_keeps_every_copied_path():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for stage in STAGES:
        for i in stage:
            if i.keyword != "COPY" or i.args.startswith("--from"):
                continue
            sources = [a for a in i.args.split() if not a.startswith("--")][:-1]
            for src in sources:
                assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), src
                assert (ROOT / src).exists(), src


def _entrypoint_env() -> dict[str, str]:
    # The image puts its venv first on PATH; here the project's venv plays that part.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.mark.parametrize(("process", "expected"), [
    ("timer", "python -m timer_service"),
    ("consumer", "--tasks MODULE"),
    ("migrate", "--database-url"),
    ("tock", "COMMAND"),
])
def test_entrypoint_dispatches_each_process_type(process, expected):
    done = subprocess.run(["sh", str(ENTRYPOINT), process, "--help"], check=False,
                          env=_entrypoint_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


@pytest.mark.parametrize("args", [[], ["worker"]])
def test_entrypoint_refuses_unknown_or_missing_process(args):
    done = subprocess.run(["sh", str(ENTRYPOINT), *args], check=False,
                          env=_entrypoint_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "usage:" in done.stdout + done.stderr


def test_entrypoint_execs_python_so_sigterm_stops_the_timer_gracefully(database_url):
    health_port = free_port()
    env = {**_entrypoint_env(), "TOCK_DATABASE_URL": database_url,
           "TOCK_LOG_FORMAT": "human", "TOCK_HEALTH_PORT": str(health_port),
           "TOCK_HEALTH_HOST": "127.0.0.1", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           # Nothing is due, so the timer never calls SQS; the endpoint is never used.
           "AWS_ENDPOINT_URL_SQS": "http://127.0.0.1:9"}
    proc = subprocess.Popen(["sh", str(ENTRYPOINT), "timer"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # exec keeps the pid: the process the runtime signals is Python itself.
        def cmdline() -> str:
            return Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

        wait_for(lambda: "timer_service" in cmdline(), timeout=20, message="python exec'd")
        assert not cmdline().startswith("sh ")
        # The image's HEALTHCHECK script sees the real timer healthy on TOCK_HEALTH_PORT.
        wait_for(lambda: proc.poll() is not None or _healthcheck(
            TOCK_HEALTH_PORT=str(health_port), TOCK_DASHBOARD_PORT=str(free_port())
        ).returncode == 0, timeout=30, message="timer healthy")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _run_until_healthy_then_sigterm(args: list[str], env: dict[str, str],
                                    ports: dict[str, str], exit_codes: tuple[int, ...] = (0,)
                                    ) -> str:
    """Start the entrypoint, wait until the image's health check passes against the real
    process, send SIGTERM and expect a clean exit; returns the output."""
    proc = subprocess.Popen(["sh", str(ENTRYPOINT), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or _healthcheck(**ports).returncode == 0,
                 timeout=60, message=f"{args[0]} healthy")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert code in exit_codes, output
        return output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_consumer_container_is_healthy_and_drains_on_sigterm(database_url, transport,
                                                             sqs_server, queue_prefix):
    health_port = str(free_port())
    env = {**_entrypoint_env(), **sqs_server.env(), "TOCK_DATABASE_URL": database_url,
           "TOCK_QUEUE_PREFIX": queue_prefix, "TOCK_LOG_FORMAT": "human",
           "TOCK_HEALTH_PORT": health_port, "TOCK_HEALTH_HOST": "127.0.0.1",
           "TOCK_SHUTDOWN_GRACE_SECONDS": "5", "TOCK_RECEIVE_WAIT_SECONDS": "1"}
    _run_until_healthy_then_sigterm(["consumer", "--tasks", "demo.tasks"], env,
                                    {"TOCK_HEALTH_PORT": health_port,
                                     "TOCK_DASHBOARD_PORT": str(free_port())})


def test_dashboard_container_is_healthy_through_the_fallback_port(database_url):
    dashboard_port = str(free_port())
    env = {**_entrypoint_env(), "TOCK_DATABASE_URL": database_url, "TOCK_LOG_FORMAT": "human",
           "TOCK_DASHBOARD_HOST": "127.0.0.1", "TOCK_DASHBOARD_PORT": dashboard_port,
           "TOCK_DASHBOARD_OPERATOR_TOKEN": "o" * 32, "TOCK_DASHBOARD_VIEWER_TOKEN": "v" * 32}
    # As in the image: TOCK_HEALTH_PORT is set but nothing listens there in this container.
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says so.
    output = _run_until_healthy_then_sigterm(
        ["dashboard"], env,
        {"TOCK_HEALTH_PORT": str(free_port()), "TOCK_DASHBOARD_PORT": dashboard_port},
        exit_codes=(0, -signal.SIGTERM))
    assert "Application shutdown complete" in output


@pytest.fixture
def hung_sqs() -> Iterator[str]:
    """An SQS endpoint that accepts connections and never answers (a hung SQS, or a proxy
    in front of one): every call waits out its read timeout, three times."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    server.close()


def test_consumer_answers_its_probes_while_sqs_hangs_at_start(database_url, hung_sqs,
                                                              tmp_path):
    # The start-up queue check waits out about three SQS call timeouts per queue. A
    # start-up probe (Kubernetes) or HEALTHCHECK start period (ECS) that got no answer
    # meanwhile would restart the consumer for an SQS outage, again and again: the probes
    # must answer first, live and not ready.
    health_port = str(free_port())
    log = tmp_path / "consumer.log"
    env = {**_entrypoint_env(), "TOCK_DATABASE_URL": database_url,
           "TOCK_LOG_FORMAT": "human", "TOCK_HEALTH_PORT": health_port,
           "TOCK_HEALTH_HOST": "127.0.0.1", "TOCK_QUEUES": "default,reports",
           "TOCK_SQS_CALL_TIMEOUT_SECONDS": "2", "AWS_ENDPOINT_URL_SQS": hung_sqs,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test"}
    with log.open("wb") as out:
        proc = subprocess.Popen(["sh", str(ENTRYPOINT), "consumer", "--tasks", "demo.tasks"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{health_port}"
        wait_for(lambda: proc.poll() is not None or _status(base + "/healthz") == 200,
                 timeout=30, message="/healthz answers")
        assert proc.poll() is None, log.read_text()
        # Still checking the queues (each check takes over 6 s here), yet live...
        assert "sqs_unavailable" not in log.read_text()
        # ...and not ready.
        assert _status(base + "/readyz") == 503
    finally:
        proc.kill()
        proc.wait()


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Handler", (_Health,), {"status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def _healthcheck(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TOCK_HEALTH_PORT", "TOCK_DASHBOARD_PORT")}
    return subprocess.run([sys.executable, str(HEALTHCHECK)], check=False,
                          env={**clean, **env},
                          capture_output=True, text=True, timeout=30)


def test_healthcheck_passes_on_the_health_port(health_server):
    port, _ = health_server
    assert _healthcheck(TOCK_HEALTH_PORT=str(port),
                        TOCK_DASHBOARD_PORT=str(free_port())).returncode == 0


def test_healthcheck_falls_through_to_the_dashboard_port(health_server):
    port, _ = health_server
    # As in the dashboard container: the image's TOCK_HEALTH_PORT has no listener.
    assert _healthcheck(TOCK_HEALTH_PORT=str(free_port()),
                        TOCK_DASHBOARD_PORT=str(port)).returncode == 0


def test_healthcheck_fails_on_an_unhealthy_answer(health_server):
    port, handler = health_server
    handler.status = 503
    done = _healthcheck(TOCK_HEALTH_PORT=str(port), TOCK_DASHBOARD_PORT=str(free_port()))
    assert done.returncode == 1
    assert "HTTP 503" in done.stderr


def test_healthcheck_fails_when_nothing_listens():
    done = _healthcheck(TOCK_HEALTH_PORT=str(free_port()), TOCK_DASHBOARD_PORT=str(free_port()))
    assert done.returncode == 1
    assert "nothing listening" in done.stderr
