"""`make run` as a user meets it (`python -m devstack.run`, what the Makefile calls): the whole
local system starts, and it heals when one of its processes or servers is killed, as it
would under an orchestrator, instead of stopping everything."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import psycopg
import pytest

from devstack.ports import free_port
from devstack.run import Stack, consumer_env, export_line, start_database
from shared.runtime.settings import ConsumerSettings
from tests.infra.processes import load_settings
from tests.support.http import get as _get
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SUCCEEDED = "SELECT count(*) FROM tock_jobs_all WHERE state = 'succeeded'"


class MakeRun:
    """`python -m devstack.run` with its stderr in a file the test reads as it grows."""

    def __init__(self, log: Path, *, under_parent: bool = False) -> None:
        """`under_parent`: started by a shell that waits for it, as make does, and `popen`
        is that shell."""
        self.log = log
        env = {**os.environ, "TOCK_DASHBOARD_PORT": str(free_port())}
        argv = [sys.executable, "-m", "devstack.run"]
        if under_parent:  # the `; :` keeps sh from exec'ing Python in its place
            argv = ["sh", "-c", f"{shlex.join(argv)}; :"]
        with log.open("wb") as out:
            self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                          stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def said(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            assert self.popen.poll() is None, f"make run exited:\n{self.text()[-3000:]}"
            return re.search(pattern, self.text())
        return wait_for(found, timeout=timeout, interval=0.2, message=f"make run: {pattern}")

    def pid_of(self, name: str) -> int:
        return int(self.said(rf"\b{name} (\d+)\b").group(1))

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C would: make run stops and removes everything it started."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=90)

    def close(self) -> None:
        """After a failure too: stop it the same way, so that nothing it started outlives
        the test (a SIGKILL would leave its processes and servers running)."""
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.popen.kill()


def _succeeded(url: str) -> int:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute(SUCCEEDED).fetchone()
    except psycopg.OperationalError:
        return -1
    assert row is not None
    return int(row[0])


def _announced(url: str, pid: int) -> bool:
    with psycopg.connect(url, connect_timeout=2) as conn:
        row = conn.execute("SELECT count(*) FROM tock_workers WHERE pid = %s "
                           "AND stopped_at IS NULL", (pid,)).fetchone()
    return bool(row and row[0])


def _health_ports(run: MakeRun) -> dict[str, int]:
    """The probe ports make run printed, by process; the pids line names the same."""
    ports = {name: int(run.said(rf"http://127\.0\.0\.1:(\d+)/metrics \({name}\)").group(1))
             for name in ("timer", "consumer-1", "consumer-2")}
    for name, port in ports.items():
        run.said(rf"\b{name} \d+ \(health port {port}\)")
    return ports


def _check_probes(ports: dict[str, int]) -> None:
    """Each answers its probes, and its /metrics has its own metrics, not the other's."""
    for name, port in ports.items():
        wait_for(lambda p=port: _get(f"http://127.0.0.1:{p}/readyz")[0] == 200, timeout=60,
                 message=f"{name} ready on its health port {port}")
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    timer = _get(f"http://127.0.0.1:{ports['timer']}/metrics")[1]
    assert "tock_jobs_redispatched_total" in timer and "tock_leases_lost_total" not in timer
    for name in ("consumer-1", "consumer-2"):
        consumer = _get(f"http://127.0.0.1:{ports[name]}/metrics")[1]
        assert "tock_leases_lost_total" in consumer
        assert "tock_jobs_redispatched_total" not in consumer


def _own_consumer_joins(run: MakeRun, url: str, tmp_path: Path) -> None:
    """The printed `export` line is all a consumer of one's own needs: one started with
    only it (no TOCK_* or AWS_* of the test's environment) announces itself and stops."""
    line = run.said(r"(?m)^export (.+)$").group(1)
    exported = dict(item.split("=", 1) for item in shlex.split(line))
    assert {"TOCK_DATABASE_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "TOCK_LEASE_SECONDS",
            "TOCK_VISIBILITY_TIMEOUT_SECONDS", "TOCK_KILL_GRACE_SECONDS"} <= set(exported)
    assert exported["TOCK_DATABASE_URL"] == url
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TOCK_", "AWS_"))}
    with (tmp_path / "own-consumer.log").open("wb") as out:
        own = subprocess.Popen([sys.executable, "-m", "consumer", "--tasks", "demo.tasks",
                                "--concurrency", "1"], cwd=ROOT, env={**base, **exported},
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: own.poll() is not None or _announced(url, own.pid), timeout=60,
                 message="the consumer started with the export line announced itself")
        assert own.poll() is None, (tmp_path / "own-consumer.log").read_text()[-3000:]
    finally:
        own.send_signal(signal.SIGTERM)
        assert own.wait(timeout=60) == 0, (tmp_path / "own-consumer.log").read_text()[-3000:]


def _more_succeed(url: str, timeout: float = 60) -> None:
    """Jobs still run: the count of succeeded jobs grows from what it is now."""
    before = wait_for(lambda: _succeeded(url) + 1, timeout=timeout,
                      message="the database answering") - 1
    wait_for(lambda: _succeeded(url) > before, timeout=timeout, interval=0.2,
             message=f"more than {before} jobs succeeded")


def test_the_export_line_suits_a_consumer_with_process_isolated_kinds(monkeypatch):
    """Its short lease needs a kill grace under it, which the default (5 s) is not."""
    env = consumer_env(Stack(sqs=SimpleNamespace(env=dict)), "postgresql://me@db/tock")
    settings = load_settings("consumer", env, monkeypatch)
    assert isinstance(settings, ConsumerSettings)
    assert settings.kill_grace_problem("process-isolated kind(s) ['x']") is None
    assert load_settings("consumer", {**env, "TOCK_ISOLATION": "process"}, monkeypatch)
    line = export_line(env)
    assert f"TOCK_KILL_GRACE_SECONDS={env['TOCK_KILL_GRACE_SECONDS']}" in line
    # Pasted into a shell, it must not turn on the CLI's audit logging (cli/audit.py).
    assert "TOCK_LOG_LEVEL" not in line


def test_make_runs_postgres_keeps_every_commit_through_a_kill_9():
    """make run invites `kill -9` of the postmaster and starts it again with its data: a
    job schedule() returned (or an outcome a consumer recorded) must still be there. With
    synchronous_commit off, the last commits before the kill were lost."""
    server = start_database()
    try:
        url = server.create_database("durable")
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            conn.execute("CREATE TABLE accepted (id int PRIMARY KEY)")
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(200):
                conn.execute("INSERT INTO accepted VALUES (%s)", (i,))
            postmaster = server.pid()
            assert postmaster is not None
            os.kill(postmaster, signal.SIGKILL)
        wait_for(lambda: not server.running(), timeout=30, message="the postmaster to die")
        server.restart()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM accepted").fetchone() == (200,)
    finally:
        server.destroy()


def test_make_run_restarts_what_is_killed_and_the_jobs_go_on(tmp_path):
    run = MakeRun(tmp_path / "make-run.log")
    try:
        run.said("running; press Ctrl-C", timeout=180)
        url = run.said(r"Postgres ready at (\S+)").group(1)
        _more_succeed(url)
        ports = _health_ports(run)
        assert len(set(ports.values())) == 3
        _check_probes(ports)
        _own_consumer_joins(run, url, tmp_path)

        # A consumer killed -9: restarted, and jobs keep finishing.
        consumer = run.pid_of("consumer-1")
        os.kill(consumer, signal.SIGKILL)
        run.said(rf"consumer-1 \(pid {consumer}\) exited with signal SIGKILL; restarting")
        restarted = int(run.said(r"consumer-1 restarted \(pid (\d+)").group(1))
        assert restarted != consumer
        wait_for(lambda: _announced(url, restarted), timeout=60,
                 message="the restarted consumer announced itself")
        _more_succeed(url)
        _check_probes(ports)  # on the same ports as before

        # The database killed -9: started again with its data; every process heals.
        postmaster = run.pid_of("Postgres")
        os.kill(postmaster, signal.SIGKILL)
        run.said(r"Postgres \(port \d+\) is down; starting it again")
        run.said(r"Postgres is back", timeout=60)
        _more_succeed(url)
        # They healed by themselves: no process had to be started again for it.
        assert "exited with" not in run.text().split("is down; starting it again")[-1]

        # LocalStack killed -9: started again on its port; its queue and the messages in
        # it are gone, so the processes create the queue and the timer sends again.
        localstack = run.pid_of("LocalStack")
        os.killpg(localstack, signal.SIGKILL)
        run.said(r"LocalStack \(port \d+\) exited with signal SIGKILL; starting it again")
        run.said(r"LocalStack is back", timeout=120)
        _more_succeed(url, timeout=90)

        assert run.stop() == 0
        assert "stopped; everything started by make run was removed" in run.text()
    finally:
        run.close()


@pytest.mark.parametrize("killed", ["make run", "make"])
def test_make_run_killed_9_takes_everything_it_started_with_it(tmp_path, killed):
    """kill -9 of make run itself (no chance to clean up): its tock processes get SIGTERM
    and LocalStack SIGKILL from the kernel, so a second make run is not refused because an
    orphaned dashboard holds the port; its janitor stops Postgres (daemonized by pg_ctl,
    out of the kernel's reach) and removes both servers' directories. kill -9 of the make
    above it: make run gets SIGTERM from the kernel and stops as on Ctrl-C."""
    run = MakeRun(tmp_path / "make-run.log", under_parent=killed == "make")
    postmaster: psutil.Process | None = None
    try:
        run.said("running; press Ctrl-C", timeout=180)
        names = ("timer", "consumer-1", "consumer-2", "producer", "dashboard", "LocalStack",
                 "Postgres")
        pids = [run.pid_of(name) for name in names]
        postmaster = psutil.Process(run.pid_of("Postgres"))
        directories = [_data_dir(postmaster).parent,
                       Path(psutil.Process(run.pid_of("LocalStack")).environ()
                            ["FILESYSTEM_ROOT"])]
        assert all(d.exists() for d in directories)
        run.popen.kill()
        run.popen.wait(timeout=30)
        wait_for(lambda: not any(_alive(p) for p in pids), timeout=90,
                 message="every process and server make run started, gone")
        wait_for(lambda: not any(d.exists() for d in directories), timeout=30,
                 message=f"{directories} removed")
        if killed == "make":  # it stopped everything itself, as on Ctrl-C
            wait_for(lambda: "everything started by make run was removed" in run.text(),
                     timeout=30, message="make run's own clean stop")
        postmaster = None
    finally:
        run.close()
        if postmaster is not None and postmaster.is_running():
            _remove_postgres(postmaster)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _data_dir(postmaster: psutil.Process) -> Path:
    args = postmaster.cmdline()
    return Path(args[args.index("-D") + 1])


def _remove_postgres(postmaster: psutil.Process) -> None:
    """After a failure: what the janitor should have done."""
    data = _data_dir(postmaster)
    stop = [str(Path(postmaster.exe()).parent / "pg_ctl"), "-D", str(data), "-m",
            "immediate", "stop"]
    if os.geteuid() == 0:
        stop = ["runuser", "-u", postmaster.username(), "--", *stop]
    subprocess.run(stop, check=False, capture_output=True, timeout=60)
    shutil.rmtree(data.parent, ignore_errors=True)


def test_make_run_says_which_port_is_taken_instead_of_starting():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "devstack.run"], cwd=ROOT, check=False,
                              env={**os.environ, "TOCK_DASHBOARD_PORT": str(port)},
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"port {port} on 127.0.0.1 is taken" in done.stderr
    assert "TOCK_DASHBOARD_PORT" in done.stderr


@pytest.mark.parametrize("value", ["0", "99999", "abc", "", "-1", "\uff18\uff10\uff18\uff10"])
def test_make_run_refuses_a_dashboard_port_that_is_not_one_before_starting(value):
    """Port 0 binds (any free port), so it passed as free, and the dashboard then refused
    it and was restarted for ever behind a "running" line; 99999 was a traceback."""
    done = subprocess.run([sys.executable, "-m", "devstack.run"], cwd=ROOT, check=False,
                          env={**os.environ, "TOCK_DASHBOARD_PORT": value},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"TOCK_DASHBOARD_PORT={value!r} is not a port: give a number from 1 to 65535" \
        in done.stderr
    assert "Traceback" not in done.stderr and "starting" not in done.stderr
