"""What `make run` leaves outside its own process tree, removed even when it is killed with
SIGKILL and gets no chance to clean up: Postgres (which `pg_ctl` daemonizes, so the
parent-death signal of devstack.lifetime does not reach it) and the servers' temporary
directories.

`make run` starts this as a small process of its own with the parent-death signal, and
keeps a manifest up to date: the commands that stop its servers, the process groups to
kill, the directories to remove. When `make run` ends, however it ends, the kernel sends
this process SIGTERM and it does what the manifest says. After an orderly stop everything
is gone already and that is a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devstack.lifetime import dies_with_parent

KILL_WAIT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 60.0


@dataclass
class Manifest:
    """What to undo, in this order."""

    kill_groups: list[int] = field(default_factory=list)
    """Process groups to SIGKILL (and wait for) before their directories are removed."""
    stop_commands: list[list[str]] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


class Janitor:
    """The watching process, seen from `make run`."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="tock-run-", suffix=".json")
        os.close(fd)
        self.path = Path(name)
        self.update(Manifest())
        # Its own session: Ctrl-C in the terminal reaches make run, which stops everything
        # in order; only make run's end (or an explicit stop) sets this one off.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devstack.janitor", str(self.path), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=dies_with_parent(signal.SIGTERM))  # noqa: PLW1509 (no threads)

    def update(self, manifest: Manifest) -> None:
        """Replace the manifest (atomically: the janitor may read it at any moment)."""
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(manifest)))
        partial.replace(self.path)

    def stop(self) -> None:
        """After make run's own clean-up: let the janitor check and exit."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS + KILL_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.path.unlink(missing_ok=True)


def clean(path: Path) -> None:
    """Do what the manifest at `path` says, then remove it."""
    try:
        manifest = Manifest(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return
    for group in manifest.kill_groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    # Not our children: nothing to wait on but their absence, so look every 50 ms.
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while any(_group_alive(g) for g in manifest.kill_groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for command in manifest.stop_commands:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(command, check=False, capture_output=True,
                           timeout=STOP_TIMEOUT_SECONDS)
    for directory in manifest.remove:
        shutil.rmtree(directory, ignore_errors=True)
    path.unlink(missing_ok=True)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def main(argv: list[str]) -> int:
    path, parent = Path(argv[0]), int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM (the parent-death signal, or make run's own stop) is taken with sigwait:
    # blocked first, so one that comes before the wait is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    # The parent may have died before the parent-death signal was set in this process
    # (between fork and prctl): then our parent is already another process. After this
    # check the signal is armed, so a later death reaches the wait.
    if os.getppid() == parent:
        signal.sigwait({signal.SIGTERM})
    clean(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
