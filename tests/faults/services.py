"""The fault suite's own servers: a Postgres cluster and a LocalStack, started here (not
the pytest session's shared ones), because the faults stop, crash and kill them.

Postgres runs with `synchronous_commit=on`, as in production: tock's guarantees rest on
`schedule()` and outcome writes being durable, and a crash (`pg_ctl stop -m immediate`)
must not lose them. `fsync` is off: a killed server process does not lose what it handed
to the kernel, so a process crash is simulated faithfully and commits stay fast.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg
from botocore.config import Config

from devstack.ports import free_port
from devstack.postgres import PostgresServer, start_postgres
from devstack.sqs import SqsServer, start_localstack
from shared.store.migrate import migrate
from tests.faults.waiting import wait_until

PG_SETTINGS = {"fsync": "off", "full_page_writes": "off", "synchronous_commit": "on"}
"""Written with ALTER SYSTEM, so every restart of the cluster keeps them."""


@dataclass
class Services:
    pg: PostgresServer
    sqs: SqsServer
    sqs_port: int
    log_dir: Path
    sqs_restarts: int = 0

    @classmethod
    def start(cls, log_dir: Path) -> Services:
        log_dir.mkdir(parents=True, exist_ok=True)
        pg = start_postgres(durable=True)
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            for name, value in PG_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        port = free_port()
        sqs = start_localstack(port=port)
        services = cls(pg, sqs, port, log_dir)
        services.wait_pg()
        return services

    # --- Postgres -------------------------------------------------------------------------

    def pg_up(self) -> bool:
        try:
            psycopg.connect(self.pg.url(), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def wait_pg(self, timeout: float = 30) -> None:
        wait_until(self.pg_up, timeout, "Postgres to accept connections")

    def pg_stop(self, mode: str) -> None:
        """Stop Postgres (`immediate`: a crash; `fast`: an orderly stop)."""
        self.pg.stop(mode)

    def pg_start(self) -> None:
        """Start Postgres again on the same data directory and port (crash recovery runs
        first after an immediate stop); returns once it accepts connections."""
        self.pg.start()
        self.wait_pg()

    def create_database(self, name: str) -> str:
        url = self.pg.create_database(name)
        migrate(url)
        return url

    # --- LocalStack -----------------------------------------------------------------------

    def sqs_env(self) -> dict[str, str]:
        return self.sqs.env()

    def sqs_client(self) -> Any:
        """A boto3 SQS client on our LocalStack (explicit: the environment of the pytest
        process may point elsewhere)."""
        return boto3.client(
            "sqs", endpoint_url=self.sqs.endpoint, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",
            config=Config(connect_timeout=5, read_timeout=30,
                          retries={"mode": "standard", "max_attempts": 3}))

    def sqs_up(self) -> bool:
        return self.sqs.process.poll() is None

    def sqs_kill(self) -> None:
        """SIGKILL LocalStack's whole process group: its queues and messages are gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sqs.process.pid, signal.SIGKILL)
        self.sqs.process.wait()
        self._keep_sqs_log()
        shutil.rmtree(self.sqs.work_dir, ignore_errors=True)

    def sqs_signal(self, signum: int) -> None:
        """Send `signum` to LocalStack's whole process group (SIGSTOP freezes it: calls
        hang, neither answered nor refused; SIGCONT lets it go on)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sqs.process.pid, signum)

    def sqs_start(self) -> None:
        """Start a fresh LocalStack on the same port; returns once SQS is ready."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sqs = start_localstack(port=self.sqs_port)
                self.sqs_restarts += 1
                return
            except RuntimeError:  # the port may still be held for a moment
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _keep_sqs_log(self) -> None:
        log = self.sqs.work_dir / "localstack.log"
        if log.exists():
            shutil.copy(log, self.log_dir / f"localstack.{self.sqs_restarts}.log")

    # --- both -----------------------------------------------------------------------------

    def ensure_up(self) -> None:
        """Bring back whatever a failed scenario may have left down."""
        if not self.pg_up():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.pg.start()
            self.wait_pg()
        self.sqs_signal(signal.SIGCONT)  # a freeze a failed scenario left on
        if not self.sqs_up():
            self.sqs_kill()
            self.sqs_start()

    def stop(self) -> None:
        if self.sqs_up():
            self._keep_sqs_log()
        self.sqs.stop()
        self.pg.destroy()
