"""A local SQS server process: LocalStack (native, own venv) or moto's server.

LocalStack is what `make run`, the end-to-end tests and the benchmarks use; moto's server
starts in a fraction of a second but scans the whole queue on every call, so it is only
fit for small tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from devstack.lifetime import dies_with_parent
from devstack.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
LOCALSTACK_VENV = Path(os.environ.get("TOCK_LOCALSTACK_VENV", ROOT / ".localstack-venv"))


@dataclass
class SqsServer:
    """A running local SQS endpoint; `env()` gives the AWS variables that point at it."""

    endpoint: str
    process: subprocess.Popen[bytes]
    work_dir: Path
    kind: str

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_SQS": self.endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            # hypercorn sometimes ignores SIGTERM: TERM, wait, then KILL.
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, check: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"SQS server exited early:\n{log.read_text()[-3000:]}")
        try:
            resp = httpx.get(url, timeout=1)
            if check in resp.text:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"SQS server not ready after 90 s:\n{log.read_text()[-3000:]}")


def start_localstack(port: int | None = None, *, die_with_parent: bool = False) -> SqsServer:
    """Start LocalStack natively from its pinned venv (see localstack/requirements.txt).
    `port` fixes the listening port (e.g. to restart a killed server where clients expect
    it); by default a free one is picked. `die_with_parent`: it is killed when the calling
    thread ends (make run; not for servers a worker thread restarts)."""
    python = LOCALSTACK_VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"LocalStack venv missing at {LOCALSTACK_VENV}: run `make localstack-venv`."
        )
    port = port or free_port()
    work = Path(tempfile.mkdtemp(prefix="tock-localstack-"))
    env = {
        **os.environ,
        "SERVICES": "sqs",
        "EAGER_SERVICE_LOADING": "1",
        "GATEWAY_LISTEN": f"127.0.0.1:{port}",
        "LOCALSTACK_HOST": f"127.0.0.1:{port}",
        "GATEWAY_SERVER": "hypercorn",
        "SQS_ENDPOINT_STRATEGY": "off",
        "SQS_DISABLE_CLOUDWATCH_METRICS": "1",
        "DNS_ADDRESS": "0",
        "DISABLE_EVENTS": "1",
        "SKIP_SSL_CERT_DOWNLOAD": "1",
        "PERSISTENCE": "0",
        "FILESYSTEM_ROOT": str(work),
        "XDG_CACHE_HOME": str(LOCALSTACK_VENV / ".cache"),
    }
    log = work / "localstack.log"
    with log.open("wb") as out:
        # Only make run asks to tie LocalStack's life to its own, and it runs no threads.
        on_parent_death = dies_with_parent(signal.SIGKILL) if die_with_parent else None
        proc = subprocess.Popen(
            [str(python), "-m", "localstack.runtime.main"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=on_parent_death,  # noqa: PLW1509
        )
    server = SqsServer(f"http://127.0.0.1:{port}", proc, work, "localstack")
    _ready_or_removed(server, "/_localstack/health", '"sqs": "running"')
    return server


def start_moto(port: int | None = None) -> SqsServer:
    """Start moto's server (small tests only: it scans the whole queue on every call);
    `port` fixes its port (to restart a killed one where clients expect it)."""
    port = port or free_port()
    work = Path(tempfile.mkdtemp(prefix="tock-moto-"))
    log = work / "moto.log"
    moto_server = Path(sys.executable).parent / "moto_server"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(moto_server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = SqsServer(f"http://127.0.0.1:{port}", proc, work, "moto")
    _ready_or_removed(server, "/moto-api/", "")
    return server


def _ready_or_removed(server: SqsServer, path: str, check: str) -> None:
    """Wait until `server` answers; if it never does (its port was still held, say), stop
    it and remove its directory before raising, so a retry leaves nothing behind."""
    try:
        _wait_ready(f"{server.endpoint}{path}", server.process,
                    server.work_dir / f"{server.kind}.log", check)
    except BaseException:
        server.stop()
        raise


def start_sqs(kind: str = "localstack", *, die_with_parent: bool = False) -> SqsServer:
    """Start the named local SQS server: `localstack` or `moto`."""
    if kind == "localstack":
        return start_localstack(die_with_parent=die_with_parent)
    if kind == "moto":
        return start_moto()
    raise ValueError(f"unknown SQS server {kind!r}: expected 'localstack' or 'moto'")
