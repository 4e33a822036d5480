"""A throwaway Postgres cluster in a temporary directory.

`initdb` and `postgres` refuse to run as root, so when we are root the server runs as the
`postgres` OS user and its directory lives directly under /tmp where that user can reach it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from devstack.ports import free_port

FAST_SETTINGS = ("-c fsync=off -c synchronous_commit=off -c full_page_writes=off",)
"""For tests only: 2-6x faster commits, no durability. Benchmarks use durable settings."""
CRASH_SAFE_SETTINGS = "-c fsync=off -c full_page_writes=off"
"""`make run`: a commit survives a crash of the server's processes (kill -9 of the
postmaster, which make run restarts from), as tock's guarantees assume of Postgres
(`synchronous_commit` on: schedule() and outcome writes are durable); not a crash of the
machine, since nothing is fsynced. With `synchronous_commit=off` a kill -9 loses the last
commits still in the server's WAL buffers: accepted jobs vanish and recorded outcomes run
again."""


def _bin_dir() -> Path:
    found = shutil.which("pg_ctl")
    if found and os.path.realpath(found).startswith("/usr/lib/postgresql/"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    if candidates:
        return Path(candidates[0])
    if found:
        return Path(found).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found: install them with "
        "`apt-get install postgresql` (make test does this on Debian)."
    )


@dataclass
class PostgresServer:
    """A running throwaway cluster; `stop()` kills it and removes its files."""

    port: int
    data_dir: Path
    bin_dir: Path
    run_as: str | None
    log_file: Path = field(init=False)
    options: str = field(default="", init=False)
    """The extra server options of the first start, which a restart keeps."""

    def __post_init__(self) -> None:
        self.log_file = self.data_dir / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.run_as:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True)

    def start(self, extra_options: str = "") -> None:
        self.options = extra_options
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data_dir} "
            f"-c max_connections=300 {extra_options}"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir / "data"), "-w",
            "-l", str(self.log_file), "-o", opts, "start",
        )

    def stop_command(self, mode: str = "immediate") -> list[str]:
        """The command that stops the server (as its OS user when we are root)."""
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir / "data"), "-m", mode,
               "stop"]
        return ["runuser", "-u", self.run_as, "--", *cmd] if self.run_as else cmd

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (immediate mode: the way a crash looks) and keep its files."""
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(self.stop_command(mode), check=True, capture_output=True,
                           text=True)

    def pid(self) -> int | None:
        """The postmaster's pid from its pid file (None without one)."""
        try:
            return int((self.data_dir / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        """Whether the server's postmaster is alive (its pid file names a live process)."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def restart(self) -> None:
        """Start a server that stopped or was killed, on its port, with its data and options.
        Right after a kill -9 the old backends may still hold its shared memory for a moment
        (they exit once they notice): retried until they have."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self.start(self.options)
                return
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def destroy(self, *, wait: bool = True) -> None:
        """Stop the server and remove its files; with `wait=False` the removal goes on in
        a process of its own after this returns (the test suite's cluster holds a
        database per test: a million files, a minute to remove)."""
        self.stop()
        if wait:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            subprocess.Popen(["rm", "-rf", "--", str(self.data_dir)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def create_database(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            tmpl = f" TEMPLATE {template}" if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{tmpl}')
        return self.url(name)


def start_postgres(*, durable: bool = False, crash_safe: bool = False,
                   port: int | None = None) -> PostgresServer:
    """Create and start a cluster. `durable=False` turns fsync off (tests only), and
    synchronous_commit too unless `crash_safe` (see CRASH_SAFE_SETTINGS)."""
    bin_dir = _bin_dir()
    run_as = "postgres" if os.geteuid() == 0 else None
    data_dir = Path(tempfile.mkdtemp(prefix="tock-pg-", dir="/tmp"))
    if run_as:
        pw = pwd.getpwnam(run_as)
        os.chown(data_dir, pw.pw_uid, pw.pw_gid)
    server = PostgresServer(port or free_port(), data_dir, bin_dir, run_as)
    server._run(
        str(bin_dir / "initdb"), "-D", str(data_dir / "data"), "-U", "postgres",
        "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
    )
    server.start("" if durable else CRASH_SAFE_SETTINGS if crash_safe else FAST_SETTINGS[0])
    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
            return server
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
