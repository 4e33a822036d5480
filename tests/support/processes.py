"""Real tock processes for end-to-end tests, with their logs kept for failure reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.wait import wait_for


@dataclass
class Processes:
    env: dict[str, str]
    log_dir: Path
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, *args], env={**self.env, **env},
                                stdout=log, stderr=subprocess.STDOUT)
        self.running[name] = proc
        return proc

    def timer(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        return self.start(name, "-m", "timer_service", **env)

    def consumer(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return self.start(name, "-m", "consumer", "--tasks", "tests.support.e2e_tasks", *args,
                          **env)

    def kill(self, name: str) -> None:
        proc = self.running[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def terminate(self, name: str, timeout: float = 60) -> int:
        proc = self.running[name]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def wait_for(self, condition: Callable[[], object], *, timeout: float, message: str
                 ) -> None:
        """`tests.support.wait.wait_for`, printing every process's log tail if it times
        out (pytest shows it with the failure)."""
        try:
            wait_for(condition, timeout=timeout, message=message)
        except AssertionError:
            print(self.logs())
            raise

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}"
                         for p in sorted(self.log_dir.glob("*.log")))

    def stop_all(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.running.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def process_env(database_url: str, queue_prefix: str, sqs_env: dict[str, str],
                **settings: str) -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    return {
        **os.environ, **sqs_env,
        "PYTHONPATH": str(root),
        "TOCK_DATABASE_URL": database_url,
        "TOCK_QUEUE_PREFIX": queue_prefix,
        "TOCK_LOG_FORMAT": "json",
        **{f"TOCK_{k.upper()}": v for k, v in settings.items()},
    }
