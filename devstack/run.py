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
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from devstack.janitor import Janitor, Manifest
from devstack.lifetime import dies_with_parent
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
        self.popen = subprocess.Popen([sys.executable, *self.args],
                                      env={**env, "TOCK_PROCESS_NAME": self.name},
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
        "TOCK_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS),
        "TOCK_SHUTDOWN_GRACE_SECONDS": "8",
        # A LocalStack restart loses its queues: the processes create them again (as make
        # run does: the same visibility and redrive), and the timer sends the lost messages
        # again after 10 s instead of a minute.
        "TOCK_CREATE_QUEUES": "1",
        "TOCK_DEAD_LETTER_AFTER": str(DEAD_LETTER_AFTER),
        "TOCK_DISPATCH_TIMEOUT_SECONDS": "10",
        "PYTHONUNBUFFERED": "1",
        # Development tokens (printed below), so the dashboard binds 127.0.0.1 only (it
        # refuses TOCK_DASHBOARD_DEV on any other address: the tokens are public).
        "TOCK_DASHBOARD_DEV": "1",
        "TOCK_DASHBOARD_HOST": "127.0.0.1",
    }


def children() -> list[Child]:
    return [
        Child("timer", ["-m", "timer_service"]),
        Child("consumer-1", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"]),
        Child("consumer-2", ["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "4"]),
        Child("producer", ["-m", "demo.producer"]),
        Child("dashboard", ["-m", "dashboard"]),
    ]


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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    port = os.environ.get("TOCK_DASHBOARD_PORT", "8080")
    if not port.isdigit() or not _port_free(int(port)):
        _say(f"port {port} on 127.0.0.1 is taken (or not a port): the dashboard needs it; "
             "choose another with TOCK_DASHBOARD_PORT=8081 make run")
        return 2
    stack = Stack()
    signal.signal(signal.SIGTERM, _interrupt)
    # Set, not inherited: a shell that starts make run in the background ignores SIGINT
    # for it, and then an interrupt would stop the children but not make run, which would
    # start them again.
    signal.signal(signal.SIGINT, _interrupt)
    try:
        stack.janitor = Janitor()
        _say("starting a throwaway Postgres ...")
        stack.postgres = start_postgres()
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
        env = process_env(stack, database_url)
        stack.children = children()
        for child in stack.children:
            child.start(env)
        from dashboard.settings import DEV_OPERATOR_TOKEN, DEV_VIEWER_TOKEN

        _say(f"dashboard at http://127.0.0.1:{port}/  log in with operator token "
             f"{DEV_OPERATOR_TOKEN} (or viewer token {DEV_VIEWER_TOKEN}, read only)")
        _say(f"metrics: curl -H 'Authorization: Bearer {DEV_VIEWER_TOKEN}' "
             f"http://127.0.0.1:{port}/metrics")
        _say(f"CLI, in another terminal: . .venv/bin/activate && export "
             f"TOCK_DATABASE_URL={database_url}  then e.g. tock stats, tock jobs")
        _say("pids: " + ", ".join(f"{c.name} {c.popen.pid}" for c in stack.children
                                  if c.popen is not None)
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
