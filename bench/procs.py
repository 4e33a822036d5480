"""Real tock processes for the benchmarks (`python -m timer_service`, `python -m consumer
--tasks bench.noop_tasks`), and a sampler of their memory (RSS) next to the backlog."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import psycopg

from bench.services import ROOT
from devstack.ports import free_port

BACKLOG = "SELECT count(*) FROM tock_jobs WHERE state NOT IN ('succeeded', 'dead', 'cancelled')"


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    health_port: int | None = None
    """Where its /metrics is served (timer and consumers)."""


SQS_REQUESTS = re.compile(r'^tock_sqs_requests_total\{operation="(\w+)"\} ([0-9.e+]+)$', re.M)


@dataclass
class Fleet:
    """The processes of one phase: they share a database and a queue prefix."""

    database_url: str
    queue_prefix: str
    log_dir: Path
    phase: str
    aws_env: dict[str, str]
    concurrency: int = 20
    procs: list[Proc] = field(default_factory=list)

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self._base_env(), **(extra or {})}

    def _base_env(self) -> dict[str, str]:
        return {
            **os.environ, **self.aws_env,
            "TOCK_DATABASE_URL": self.database_url,
            "TOCK_QUEUE_PREFIX": self.queue_prefix,
            "TOCK_LOG_FORMAT": "json",
            "TOCK_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
        }

    def _spawn(self, role: str, args: list[str],
               env: dict[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{self.phase}-{role}.log").open("ab")
        port = free_port()
        popen = subprocess.Popen([sys.executable, *args], cwd=ROOT,
                                 env=self._env({"TOCK_HEALTH_PORT": str(port), **(env or {})}),
                                 stdout=log, stderr=subprocess.STDOUT)
        proc = Proc(role, popen, log, port)
        self.procs.append(proc)
        return proc

    def start_timer(self, env: dict[str, str] | None = None) -> Proc:
        """The timer process; `env` adds to (or overrides) its TOCK_* settings."""
        return self._spawn("timer", ["-m", "timer_service"], env)

    def start_consumers(self, count: int) -> list[Proc]:
        first = sum(p.role.startswith("consumer") for p in self.procs)
        return [self._spawn(f"consumer{first + i + 1}",
                            ["-m", "consumer", "--tasks", "bench.noop_tasks",
                             "--concurrency", str(self.concurrency)])
                for i in range(count)]

    def sqs_requests(self) -> dict[str, int]:
        """The SQS requests every running process of the fleet has sent so far, by
        operation (their `tock_sqs_requests_total`, summed)."""
        total: dict[str, int] = {}
        for p in self.procs:
            if p.health_port is None or p.popen.poll() is not None:
                continue
            for operation, value in SQS_REQUESTS.findall(self._metrics(p)):
                total[operation] = total.get(operation, 0) + int(float(value))
        return total

    def _metrics(self, p: Proc, timeout: float = 60.0) -> str:
        """`p`'s /metrics text, waiting for its probe server to listen (a process counts
        as up in the database before its server may be: the timer's, under load)."""
        url = f"http://127.0.0.1:{p.health_port}/metrics"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as res:
                    return str(res.read().decode())
            except OSError:  # URLError included: refused until it listens
                if time.monotonic() >= deadline or p.popen.poll() is not None:
                    raise
            time.sleep(0.1)  # polling for the server to listen: a condition, not a pause

    def check_alive(self) -> None:
        dead = [p for p in self.procs if p.popen.poll() is not None]
        if dead:
            names = ", ".join(f"{p.role} (exit {p.popen.returncode})" for p in dead)
            raise RuntimeError(f"{self.phase}: process died: {names}; logs in {self.log_dir}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every process (a graceful stop), then wait; SIGKILL what does not stop."""
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
            p.log.close()
        self.procs.clear()


class RssSampler:
    """Every `interval` seconds: each process's RSS and the phase database's backlog."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._fleet: Fleet | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def watch(self, fleet: Fleet | None) -> None:
        with self._lock:
            self._fleet = fleet

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        url = None
        while not self._stop.wait(self.interval):
            with self._lock:
                fleet = self._fleet
                procs = list(fleet.procs) if fleet else []
            if fleet is None or not procs:
                continue
            try:
                if url != fleet.database_url:
                    if conn is not None:
                        conn.close()
                    url = fleet.database_url
                    conn = psycopg.connect(url, autocommit=True)
                backlog = conn.execute(BACKLOG).fetchone()[0]  # type: ignore[union-attr,index]
            except psycopg.Error:
                backlog = None
            t = round(time.monotonic() - self._started, 2)
            for p in procs:
                try:
                    rss = psutil.Process(p.popen.pid).memory_info().rss
                except psutil.Error:
                    continue
                self.samples.append({"t": t, "phase": fleet.phase, "role": p.role,
                                     "rss_mb": round(rss / 2**20, 1), "backlog": backlog})
        if conn is not None:
            conn.close()
