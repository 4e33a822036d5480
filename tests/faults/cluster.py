"""The tock processes of a scenario, run the way an orchestrator (ECS, Kubernetes) runs
them: any process that exits is started again, and every exit is recorded, telling the
ones the suite caused (`kill -9`) from the ones a process did on its own.

Each start of a process (a *generation*) logs to its own file, `<name>.<gen>.log`, kept
under the scenario's log directory; `events.log` there is the harness's own timeline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESTART_DELAY_SECONDS = 0.2
"""How long the orchestrator takes to start a replacement (kept short: we measure tock)."""
CRASH_BACKOFF_SECONDS = (0.5, 5.0)
"""Restart back-off for a process that keeps exiting on its own (first, cap)."""


@dataclass
class ProcRecord:
    """One start of one process."""

    name: str
    role: str
    """"timer" or "consumer"."""
    generation: int
    pid: int
    log: Path
    started: float
    ended: float | None = None
    returncode: int | None = None
    killed_at: float | None = None
    """When the suite sent SIGKILL (a fault), if it did."""
    stopped_at: float | None = None
    """When the suite asked it to stop at the end of the scenario."""

    @property
    def label(self) -> str:
        return f"{self.name}.{self.generation}"

    @property
    def exited_on_its_own(self) -> bool:
        return (self.ended is not None and self.killed_at is None
                and self.stopped_at is None)


@dataclass
class _Slot:
    name: str
    role: str
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    record: ProcRecord | None = None
    generation: int = 0
    restart_at: float | None = None
    crash_backoff: float = 0.0


@dataclass
class Cluster:
    log_dir: Path
    records: list[ProcRecord] = field(default_factory=list)
    _slots: dict[str, _Slot] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: bool = False
    _monitor: threading.Thread | None = None
    _events: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._events = self.log_dir / "events.log"

    # --- the harness's timeline ----------------------------------------------------------

    def event(self, what: str, **fields: object) -> None:
        line = json.dumps({"t": round(time.time(), 3), "event": what, **fields}, default=str)
        with self._events.open("a") as out:
            out.write(line + "\n")

    # --- processes ------------------------------------------------------------------------

    def add(self, name: str, role: str, args: list[str], env: dict[str, str]) -> None:
        """Register a process and start it."""
        slot = _Slot(name, role, args, env)
        with self._lock:
            self._slots[name] = slot
            self._spawn(slot)
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, daemon=True,
                                             name="orchestrator")
            self._monitor.start()

    def names(self, role: str | None = None) -> list[str]:
        return [s.name for s in self._slots.values() if role is None or s.role == role]

    def current(self, name: str) -> ProcRecord | None:
        return self._slots[name].record

    def kill(self, name: str) -> ProcRecord | None:
        """`kill -9` the current generation of `name` (the orchestrator then restarts it);
        None if it is not running right now (between a death and its restart)."""
        with self._lock:
            slot = self._slots[name]
            if slot.proc is None or slot.proc.poll() is not None or slot.record is None:
                return None
            slot.record.killed_at = time.time()
            slot.proc.send_signal(signal.SIGKILL)
            record = slot.record
        self.event("kill", process=record.label, pid=record.pid)
        return record

    def by_pid(self) -> dict[int, ProcRecord]:
        return {r.pid: r for r in self.records}

    def all_started(self) -> bool:
        """Every current process has logged that it started its loops."""
        with self._lock:
            slots = list(self._slots.values())
        for slot in slots:
            record = slot.record
            if record is None or slot.proc is None or slot.proc.poll() is not None:
                return False
            marker = '"event": "timer_started"' if slot.role == "timer" \
                else '"event": "consumer_started"'
            try:
                if marker not in record.log.read_text(errors="replace"):
                    return False
            except FileNotFoundError:
                return False
        return True

    def stop(self, timeout: float = 20) -> None:
        """End of the scenario: SIGTERM everything (nothing is restarted any more), then
        SIGKILL what is still running after `timeout`."""
        with self._lock:
            self._stopping = True
            slots = list(self._slots.values())
            now = time.time()
            for slot in slots:
                if slot.proc is not None and slot.proc.poll() is None and slot.record:
                    slot.record.stopped_at = now
                    slot.proc.send_signal(signal.SIGTERM)
        if self._monitor is not None:
            self._monitor.join(5)
        deadline = time.monotonic() + timeout
        for slot in slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
            self._reap(slot)
        self.event("cluster_stopped")

    # --- the orchestrator -----------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        slot.generation += 1
        label = f"{slot.name}.{slot.generation}"
        log = self.log_dir / f"{label}.log"
        env = {**slot.env, "TOCK_FAULT_PROC": label, "TOCK_PROCESS_NAME": label}
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, *slot.args], env=env, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT)
        slot.proc = proc
        slot.record = ProcRecord(slot.name, slot.role, slot.generation, proc.pid, log,
                                 time.time())
        slot.restart_at = None
        self.records.append(slot.record)
        self.event("start", process=label, pid=proc.pid)

    def _reap(self, slot: _Slot) -> bool:
        """Record the exit of the slot's process if it has exited; True if it did now."""
        record = slot.record
        if slot.proc is None or record is None or record.ended is not None:
            return False
        code = slot.proc.poll()
        if code is None:
            return False
        record.ended, record.returncode = time.time(), code
        cause = ("killed by the suite" if record.killed_at is not None
                 else "stopped by the suite" if record.stopped_at is not None
                 else "exited on its own")
        self.event("exit", process=record.label, pid=record.pid, code=code, cause=cause)
        return True

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                now = time.monotonic()
                for slot in self._slots.values():
                    if self._reap(slot):
                        record = slot.record
                        assert record is not None
                        if record.exited_on_its_own:
                            lived = (record.ended or 0) - record.started
                            first, cap = CRASH_BACKOFF_SECONDS
                            slot.crash_backoff = (first if lived > 30 or not slot.crash_backoff
                                                  else min(slot.crash_backoff * 2, cap))
                            slot.restart_at = now + slot.crash_backoff
                        else:
                            slot.restart_at = now + RESTART_DELAY_SECONDS
                    if slot.restart_at is not None and now >= slot.restart_at:
                        self._spawn(slot)
            time.sleep(0.05)

    # --- reading the logs -----------------------------------------------------------------

    def log_report(self, lines: int = 40) -> str:
        """The harness timeline, the notable lines of every process log, and each log's
        tail: what a failure report prints."""
        out = [f"process logs: {self.log_dir}"]
        if self._events.exists():
            out.append("--- events.log")
            out.extend(self._events.read_text().splitlines()[-200:])
        notable = ("loop_crashed", "process_stopping", "Traceback", "loop_failed",
                   "loop_recovered", "error", "critical")
        for record in self.records:
            try:
                text = record.log.read_text(errors="replace").splitlines()
            except FileNotFoundError:
                continue
            exit_text = ("running" if record.ended is None
                         else f"exit {record.returncode}"
                         + (" (killed by the suite)" if record.killed_at else "")
                         + (" (stopped by the suite)" if record.stopped_at else ""))
            out.append(f"--- {record.label} pid {record.pid}: {exit_text}")
            hits = [line for line in text if any(k in line for k in notable)]
            if hits:
                out.append(f"    notable ({len(hits)} lines, last 15):")
                out.extend("    " + line[:600] for line in hits[-15:])
            out.append(f"    tail ({min(lines, len(text))} of {len(text)} lines):")
            out.extend("    " + line[:600] for line in text[-lines:])
        return "\n".join(out)


def base_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of every process: ours, minus any TOCK_* or AWS_* setting the
    calling shell or test session may carry."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOCK_", "AWS_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env
