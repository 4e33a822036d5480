"""`make run`: the whole system on this machine, with throwaway services.

Starts a private Postgres and LocalStack (SQS), applies migrations, creates the queue and
its dead-letter queue, then runs a timer, two consumers with the demo tasks, a demo
producer and the dashboard, streaming their logs. Ctrl-C stops every process and removes
what it started.

It looks after them as an orchestrator would (ECS restarts a task, Kubernetes a pod): a
process that exits or is killed is started again after a backoff (1 s, doubling to 30 s
while it keeps failing within 30 s of its start), and a Postgres or LocalStack server that
dies is started again on its port, Postgres with its data, as a managed database comes
back. So `kill -9` anything it printed the pid of and watch the system heal.

The timer and consumers serve /healthz, /readyz and /metrics on ports of their own, picked
free at start and kept across restarts (printed with the pids). It also prints an `export`
line with what a consumer of your own needs to join the stack.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from devstack.janitor import Janitor, Manifest
from devstack.lifetime import dies_with_parent, end_with_parent
from devstack.ports import free_port
from devstack.postgres import PostgresServer, start_postgres
from devstack.sqs import SqsServer, start_localstack, start_sqs
from shared.core.errors import TransportError
from shared.store.migrate import migrate
from shared.transport.sqs import SqsTransport

POLL_SECONDS = 0.5
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
STABLE_SECONDS = 30.0
"""A process that ran this long before it exited is restarted after the first backoff
again, not after a longer one."""
QUEUE = "default"
VISIBILITY_SECONDS = 10
DEAD_LETTER_AFTER = 10


@dataclass
class Child:
    """One supervised tock process and its restart state."""

    name: str
    args: list[str]
    health_port: int | None = None
    """Where it serves /healthz, /readyz and /metrics (the timer and consumers)."""
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = FIRST_BACKOFF_SECONDS
    restart_at: float | None = None
    """When it is due to start again (it exited); None while it runs."""

    def start(self, env: dict[str, str]) -> None:
        # SIGTERM if make run itself is killed -9: they stop as on Ctrl-C, not orphaned.
        # (A preexec_fn is safe here: make run runs no threads.)
        on_parent_death = dies_with_parent(signal.SIGTERM)
        own = {"TOCK_PROCESS_NAME": self.name}
        if self.health_port is not None:
            own["TOCK_HEALTH_PORT"] = str(self.health_port)
        self.popen = subprocess.Popen([sys.executable, *self.args], env={**env, **own},
                                      preexec_fn=on_parent_death)  # noqa: PLW1509
        self.started_at = time.monotonic()
        self.restart_at = None


@dataclass
class Stack:
    postgres: PostgresServer | None = None
    sqs: SqsServer | None = None
    children: list[Child] = field(default_factory=list)
    janitor: Janitor | None = None
    """Removes the servers and their directories should make run be killed -9."""

    def leave_to_janitor(self) -> None:
        """Tell the janitor what the servers are now (after each start or restart)."""
        if self.janitor is None:
            return
        manifest = Manifest()
        if self.sqs is not None:
            manifest.kill_groups.append(self.sqs.process.pid)  # its own session
            manifest.remove.append(str(self.sqs.work_dir))
        if self.postgres is not None:
            manifest.stop_commands.append(self.postgres.stop_command())
            manifest.remove.append(str(self.postgres.data_dir))
        self.janitor.update(manifest)

    @property
    def processes(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        return [(c.name, c.popen) for c in self.children if c.popen is not None]

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
        if self.janitor:
            self.janitor.stop()


def _say(text: str) -> None:
    print(f"\033[1mrun:\033[0m {text}", file=sys.stderr, flush=True)


def consumer_env(stack: Stack, database_url: str) -> dict[str, str]:
    """What a consumer needs to join this stack: the one make run starts, or your own
    (printed as an `export` line)."""
    assert stack.sqs is not None
    return {
        **stack.sqs.env(),
        "TOCK_DATABASE_URL": database_url,
        # Not TOCK_LOG_LEVEL: in the shell this line is pasted into, it would also make
        # every `tock` command log its audit line (cli/audit.py). The stack's own
        # processes log at DEBUG (process_env).
        "TOCK_LOG_FORMAT": "human",
        # Short leases so the demo shows heartbeats and crash recovery within seconds.
        "TOCK_LEASE_SECONDS": "3",
        "TOCK_HEARTBEAT_SECONDS": "1",
        # Under the lease, as process isolation requires (the default 5 s is not).
        "TOCK_KILL_GRACE_SECONDS": "1",
        "TOCK_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS),
        "TOCK_SHUTDOWN_GRACE_SECONDS": "8",
        # A LocalStack restart loses its queues: the processes create them again (as make
        # run does: the same visibility and redrive).
        "TOCK_CREATE_QUEUES": "1",
        "TOCK_DEAD_LETTER_AFTER": str(DEAD_LETTER_AFTER),
    }


def export_line(env: dict[str, str]) -> str:
    """`export A=1 B=2`, quoted for a POSIX shell."""
    return "export " + " ".join(f"{name}={shlex.quote(value)}"
                                for name, value in env.items())


def process_env(stack: Stack, database_url: str) -> dict[str, str]:
    """The processes' environment: the caller's, under what make run sets itself."""
    return {**os.environ, **own_env(stack, database_url)}


def own_env(stack: Stack, database_url: str) -> dict[str, str]:
    """What make run sets for its processes, over the caller's environment."""
    return {
        **consumer_env(stack, database_url),
        "TOCK_LOG_LEVEL": "DEBUG",
        # After a LocalStack restart the timer sends the lost messages again after 10 s
        # instead of a minute.
        "TOCK_DISPATCH_TIMEOUT_SECONDS": "10",
        # Rescue passes every 0.5 s: a freeze of Postgres that a pass does not see as one
        # (under 1 s plus this interval) stays within the 3 s leases' slack (timer_service/
        # rescuer.py), and an expired lease is rescued within half a second.
        "TOCK_MAINTENANCE_INTERVAL_SECONDS": "0.5",
        "PYTHONUNBUFFERED": "1",
        # The timer's and consumers' probes and /metrics (each its own TOCK_HEALTH_PORT),
        # on this machine only, as the dashboard.
        "TOCK_HEALTH_HOST": "127.0.0.1",
        # Development tokens (printed below), so the dashboard binds 127.0.0.1 only (it
        # refuses TOCK_DASHBOARD_DEV on any other address: the tokens are public).
        "TOCK_DASHBOARD_DEV": "1",
        "TOCK_DASHBOARD_HOST": "127.0.0.1",
    }


def children(health_ports: list[int]) -> list[Child]:
    """The processes, the timer and consumers with `health_ports` (three)."""
    timer, consumer_1, consumer_2 = health_ports
    return [
        Child("timer", ["-m", "timer_service"], health_port=timer),
        Child("consumer-1", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"],
              health_port=consumer_1),
        Child("consumer-2", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"],
              health_port=consumer_2),
        Child("producer", ["-m", "demo.producer"]),
        Child("dashboard", ["-m", "dashboard"]),
    ]


def free_ports(count: int, taken: set[int]) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, none of them in `taken` (ports
    reserved for what has not started listening yet, such as the dashboard's)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    return ports


def exit_reason(code: int) -> str:
    """`code 1`, or `signal SIGKILL` for a process a signal ended (Popen's negative codes)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def tend(child: Child, env: dict[str, str], now: float) -> None:
    """Notice that `child` exited and schedule its restart, or restart it when due."""
    assert child.popen is not None
    if child.restart_at is None:
        code = child.popen.poll()
        if code is None:
            return
        if now - child.started_at >= STABLE_SECONDS:
            child.backoff = FIRST_BACKOFF_SECONDS
        child.restart_at = now + child.backoff
        _say(f"{child.name} (pid {child.popen.pid}) exited with {exit_reason(code)}; "
             f"restarting it in {child.backoff:.0f} s")
        child.backoff = min(child.backoff * 2, MAX_BACKOFF_SECONDS)
    elif now >= child.restart_at:
        child.restarts += 1
        if child.health_port is not None and not _can_listen(child.health_port):
            old, child.health_port = child.health_port, free_ports(1, {child.health_port})[0]
            _say(f"{child.name}'s health port {old} is taken now; it gets port "
                 f"{child.health_port} (http://127.0.0.1:{child.health_port}/metrics)")
        child.start(env)
        _say(f"{child.name} restarted (pid {child.popen.pid}, restart {child.restarts})")


def tend_services(stack: Stack) -> None:
    """Start Postgres or LocalStack again if it died, on the same port."""
    postgres, sqs = stack.postgres, stack.sqs
    assert postgres is not None and sqs is not None
    if not postgres.running():
        _say(f"Postgres (port {postgres.port}) is down; starting it again with its data")
        postgres.restart()
        _say(f"Postgres is back (pid {postgres.pid()})")
    if sqs.process.poll() is not None:
        port = int(sqs.endpoint.rsplit(":", 1)[1])
        _say(f"LocalStack (port {port}) exited with {exit_reason(sqs.process.returncode)}; "
             "starting it again (its queues and messages are gone: the processes create "
             "the queues again and the timer sends lost messages again)")
        sqs.stop()
        stack.sqs = start_localstack(port=port, die_with_parent=True)
        stack.leave_to_janitor()
        try:
            _create_queue()
        except TransportError as exc:  # a process got there first: the queue is there
            _say(f"(the queue was there already: {exc})")
        _say(f"LocalStack is back (pid {stack.sqs.process.pid})")


def start_database() -> PostgresServer:
    """make run's Postgres: fast (no fsync), but its commits survive the kill -9 of its
    processes that make run invites and restarts from, as tock's guarantees assume."""
    return start_postgres(crash_safe=True)


def _create_queue() -> None:
    SqsTransport("tock-").create_queue(QUEUE, visibility_timeout=VISIBILITY_SECONDS,
                                       dead_letter_after=DEAD_LETTER_AFTER)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _can_listen(port: int) -> bool:
    """Whether a server could listen on `port` now, as the probe server does (with
    SO_REUSEADDR, so the closed connections of a process that died do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def dashboard_port(value: str) -> tuple[int | None, str]:
    """TOCK_DASHBOARD_PORT as make run takes it: (the port, "") or (None, what is wrong).
    Checked here, before anything starts: the dashboard would refuse it only once running,
    and be restarted for ever behind a "running" line."""
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 65535:
        return None, (f"TOCK_DASHBOARD_PORT={value!r} is not a port: give a number from 1 to "
                      "65535, e.g. TOCK_DASHBOARD_PORT=8081 make run")
    if not _port_free(int(value)):
        return None, (f"port {value} on 127.0.0.1 is taken: the dashboard needs it; choose "
                      "another with TOCK_DASHBOARD_PORT=8081 make run")
    return int(value), ""


def inherited_settings(shell: dict[str, str], own: dict[str, str]) -> list[str]:
    """The TOCK_* variables of the caller's shell that make run passes on to every process
    (`own`: what it sets itself, which wins): said at start, since one of them can change
    what the demo does (TOCK_QUEUES moves its consumers off the default queue, say)."""
    return sorted(name for name in shell if name.startswith("TOCK_")
                  and name not in own and name != "TOCK_DASHBOARD_PORT")


def token_shown(env: dict[str, str], name: str, dev_token: str) -> str:
    """The dashboard token make run's dashboard takes: the development one unless the
    caller's shell set its own (named, not printed)."""
    return f"your {name}" if env.get(name) else dev_token


def main() -> int:
    port, wrong = dashboard_port(os.environ.get("TOCK_DASHBOARD_PORT", "8080"))
    if port is None:
        _say(wrong)
        return 2
    stack = Stack()
    signal.signal(signal.SIGTERM, _interrupt)
    # Set, not inherited: a shell that starts make run in the background ignores SIGINT
    # for it, and then an interrupt would stop the children but not make run, which would
    # start them again.
    signal.signal(signal.SIGINT, _interrupt)
    try:
        end_with_parent()  # make killed with kill -9: stop as on Ctrl-C
        stack.janitor = Janitor()
        _say("starting a throwaway Postgres ...")
        stack.postgres = start_database()
        stack.leave_to_janitor()
        database_url = stack.postgres.create_database("tock")
        migrate(database_url)
        _say(f"Postgres ready at {database_url}")
        _say("starting LocalStack (SQS) ...")
        stack.sqs = start_sqs("localstack", die_with_parent=True)
        stack.leave_to_janitor()
        os.environ.update(stack.sqs.env())
        _create_queue()
        _say(f"SQS ready at {stack.sqs.endpoint} (queue tock-{QUEUE}, DLQ tock-{QUEUE}-dlq)")
        own = own_env(stack, database_url)
        env = {**os.environ, **own}  # process_env, with `own` kept for the banner below
        sqs_port = int(stack.sqs.endpoint.rsplit(":", 1)[1])
        stack.children = children(free_ports(3, {port, stack.postgres.port, sqs_port}))
        for child in stack.children:
            child.start(env)
        from dashboard.settings import DEV_OPERATOR_TOKEN, DEV_VIEWER_TOKEN

        operator = token_shown(env, "TOCK_DASHBOARD_OPERATOR_TOKEN", DEV_OPERATOR_TOKEN)
        viewer = token_shown(env, "TOCK_DASHBOARD_VIEWER_TOKEN", DEV_VIEWER_TOKEN)
        _say(f"dashboard at http://127.0.0.1:{port}/  log in with operator token "
             f"{operator} (or viewer token {viewer}, read only)")
        _say(f"metrics: curl -H 'Authorization: Bearer {viewer}' "
             f"http://127.0.0.1:{port}/metrics")
        inherited = inherited_settings(dict(os.environ), own)
        if inherited:
            _say("from your shell, passed to every process: " + ", ".join(inherited))
        probed = [c for c in stack.children if c.health_port is not None]
        _say("timer and consumers, no token: " + ", ".join(
            f"http://127.0.0.1:{c.health_port}/metrics ({c.name})" for c in probed)
             + "; /healthz and /readyz on the same ports")
        _say(f"CLI, in another terminal: . .venv/bin/activate && export "
             f"TOCK_DATABASE_URL={shlex.quote(database_url)}  # then tock stats, tock jobs")
        _say("a consumer of your own, in another terminal: . .venv/bin/activate, paste "
             "the next line, then python -m consumer --tasks demo.tasks,YOUR_MODULE "
             "(with the demo's kinds too, as it shares their queue)")
        print(export_line(consumer_env(stack, database_url)), file=sys.stderr, flush=True)
        _say("pids: " + ", ".join(
            f"{c.name} {c.popen.pid}"
            + (f" (health port {c.health_port})" if c.health_port is not None else "")
            for c in stack.children if c.popen is not None)
             + f", Postgres {stack.postgres.pid()}, LocalStack "
             f"{stack.sqs.process.pid}; kill any of them and make run starts it again, as an "
             "orchestrator would")
        _say("running; press Ctrl-C to stop everything")
        while True:
            time.sleep(POLL_SECONDS)
            try:
                tend_services(stack)
            except Exception as exc:  # keep looking after the rest; tried again next poll
                _say(f"could not restart a service yet ({type(exc).__name__}: {exc}); "
                     "trying again")
            now = time.monotonic()
            for child in stack.children:
                try:
                    tend(child, env, now)
                except OSError as exc:  # could not start it: tried again next poll
                    _say(f"could not start {child.name} ({exc}); trying again")
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
