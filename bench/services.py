"""The services a run measures against, started fresh for each run: a durable Postgres
cluster and a LocalStack SQS server. Nothing here is shared with the test suite's services."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from devstack.postgres import PostgresServer, start_postgres
from devstack.sqs import LOCALSTACK_VENV, SqsServer, start_sqs
from shared.store.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "bench_template"

# Durable: fsync, synchronous_commit and full_page_writes keep their defaults (on). We only
# give Postgres a production-like buffer cache, and pg_stat_statements so the report can say
# which statement the database time goes to.
SERVER_SETTINGS = {
    "shared_buffers": "1GB",
    "shared_preload_libraries": "pg_stat_statements",
}

REPORTED_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level",
    "wal_sync_method", "commit_delay", "shared_buffers", "work_mem", "effective_cache_size",
    "max_wal_size", "checkpoint_timeout", "max_connections", "autovacuum",
    "random_page_cost", "jit", "shared_preload_libraries",
)


@dataclass
class Services:
    postgres: PostgresServer
    sqs: SqsServer
    _databases: list[str] = field(default_factory=list)

    def fresh_database(self, name: str) -> str:
        """A new migrated database cloned from the template; its URL."""
        self._databases.append(name)
        return self.postgres.create_database(name, template=TEMPLATE)

    def drop_database(self, name: str) -> None:
        """Drop a phase's database once measured, so its autovacuum does not run under the
        phases after it."""
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def admin_url(self) -> str:
        return self.postgres.url("postgres")

    def aws_env(self) -> dict[str, str]:
        return self.sqs.env()

    def postgres_cpu_seconds(self) -> float | None:
        """CPU seconds the Postgres cluster has used so far: the postmaster, its live
        children, and the children it has reaped (the backends of closed connections);
        None if this user may not read them."""
        try:
            pid_file = self.postgres.data_dir / "data" / "postmaster.pid"
            postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
            own = postmaster.cpu_times()
            total = own.user + own.system + own.children_user + own.children_system
            for child in postmaster.children():
                with contextlib.suppress(psutil.Error):  # exited meanwhile: reaped above
                    used = child.cpu_times()
                    total += used.user + used.system
        except (OSError, ValueError, IndexError, psutil.Error):
            return None
        return float(total)

    def postgres_settings(self) -> dict[str, str]:
        with psycopg.connect(self.admin_url()) as conn:
            return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                    for name in REPORTED_SETTINGS}


@contextlib.contextmanager
def running_services() -> Iterator[Services]:
    """Start Postgres (durable) and LocalStack; set the AWS variables in this process so
    boto3 and every child process talk to this LocalStack; stop both at the end."""
    postgres = start_postgres(durable=True)
    sqs: SqsServer | None = None
    saved = {}
    try:
        with psycopg.connect(postgres.url(), autocommit=True) as conn:
            for name, value in SERVER_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        postgres.stop(mode="fast")
        postgres.start()
        _wait_for_postgres(postgres)
        template = postgres.create_database(TEMPLATE)
        migrate(template)
        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        sqs = start_sqs("localstack")
        saved = {k: os.environ.get(k) for k in sqs.env()}
        os.environ.update(sqs.env())
        yield Services(postgres, sqs)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        if sqs is not None:
            sqs.stop()
        postgres.destroy()


def _wait_for_postgres(server: PostgresServer) -> None:
    import time

    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def environment(services: Services) -> dict[str, Any]:
    """The machine, the versions and the Postgres settings this run measured on."""
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_total_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            "tock": _git_commit(),
            "boto3": _version("boto3"),
            "psycopg": _version("psycopg"),
            "localstack": _localstack_version(),
        },
        "postgres_settings": services.postgres_settings(),
        "postgres_mode": "durable (fsync, synchronous_commit and full_page_writes on)",
        "sqs_server": f"LocalStack at {services.sqs.endpoint}",
    }


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _localstack_version() -> str:
    found = sorted(LOCALSTACK_VENV.glob("lib/python*/site-packages/localstack_core-*.dist-info"))
    return found[-1].name.split("-")[1] if found else "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()
