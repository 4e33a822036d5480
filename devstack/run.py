"""`make run`: the whole system on this machine, with throwaway services.

Starts a private Postgres and LocalStack (SQS), applies migrations, creates the queue and
its dead-letter queue, then runs a timer, two consumers with the demo tasks and a demo
producer, streaming their logs. Ctrl-C stops every process and removes what it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from devstack.postgres import PostgresServer, start_postgres
from devstack.sqs import SqsServer, start_sqs
from shared.store.migrate import migrate
from shared.transport.sqs import SqsTransport


@dataclass
class Stack:
    postgres: PostgresServer | None = None
    sqs: SqsServer | None = None
    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def stop(self) -> None:
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for name, proc in self.processes:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                print(f"run: {name} did not stop in time; killing it", file=sys.stderr)
                proc.kill()
        if self.sqs:
            self.sqs.stop()
        if self.postgres:
            self.postgres.destroy()


def _say(text: str) -> None:
    print(f"\033[1mrun:\033[0m {text}", file=sys.stderr, flush=True)


def process_env(stack: Stack, database_url: str) -> dict[str, str]:
    assert stack.sqs is not None
    return {
        **os.environ,
        **stack.sqs.env(),
        "TOCK_DATABASE_URL": database_url,
        "TOCK_LOG_FORMAT": "human",
        "TOCK_LOG_LEVEL": "DEBUG",
        # Short leases so the demo shows heartbeats and crash recovery within seconds.
        "TOCK_LEASE_SECONDS": "3",
        "TOCK_HEARTBEAT_SECONDS": "1",
        "TOCK_VISIBILITY_TIMEOUT_SECONDS": "10",
        "TOCK_SHUTDOWN_GRACE_SECONDS": "8",
        # A LocalStack restart loses its queues: the processes create them again.
        "TOCK_CREATE_QUEUES": "1",
        "PYTHONUNBUFFERED": "1",
        # Development tokens (printed below), so the dashboard binds 127.0.0.1 only (it
        # refuses TOCK_DASHBOARD_DEV on any other address: the tokens are public).
        "TOCK_DASHBOARD_DEV": "1",
        "TOCK_DASHBOARD_HOST": "127.0.0.1",
    }


PROCESSES: list[tuple[str, list[str]]] = [
    ("timer", ["-m", "timer_service"]),
    ("consumer-1", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"]),
    ("consumer-2", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"]),
    ("producer", ["-m", "demo.producer"]),
    ("dashboard", ["-m", "dashboard"]),
]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    stack = Stack()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _say("starting a throwaway Postgres ...")
        stack.postgres = start_postgres()
        database_url = stack.postgres.create_database("tock")
        migrate(database_url)
        _say(f"Postgres ready at {database_url}")
        _say("starting LocalStack (SQS) ...")
        stack.sqs = start_sqs("localstack")
        os.environ.update(stack.sqs.env())
        SqsTransport("tock-").create_queue("default", visibility_timeout=10,
                                           dead_letter_after=10)
        _say(f"SQS ready at {stack.sqs.endpoint} (queue tock-default, DLQ tock-default-dlq)")
        env = process_env(stack, database_url)
        for name, args in PROCESSES:
            proc = subprocess.Popen([sys.executable, *args],
                                    env={**env, "TOCK_PROCESS_NAME": name})
            stack.processes.append((name, proc))
        from dashboard.settings import DEV_OPERATOR_TOKEN, DEV_VIEWER_TOKEN

        port = os.environ.get("TOCK_DASHBOARD_PORT", "8080")
        _say(f"dashboard at http://127.0.0.1:{port}/  log in with operator token "
             f"{DEV_OPERATOR_TOKEN} (or viewer token {DEV_VIEWER_TOKEN}, read only)")
        _say(f"metrics: curl -H 'Authorization: Bearer {DEV_VIEWER_TOKEN}' "
             f"http://127.0.0.1:{port}/metrics")
        _say("running; press Ctrl-C to stop everything")
        while all(p.poll() is None for _, p in stack.processes):
            time.sleep(0.5)
        for name, proc in stack.processes:
            if proc.poll() is not None and proc.returncode != 0:
                _say(f"{name} exited with code {proc.returncode}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # Ctrl-C reached the children too (same process group); let them stop gracefully.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _say("stopping ...")
        stack.stop()
        _say("stopped; everything started by make run was removed")


if __name__ == "__main__":
    sys.exit(main())
