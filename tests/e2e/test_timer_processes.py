"""Three real `python -m timer_service` processes on the real clock, one killed with
SIGKILL half way: every slot of a 1-second schedule still becomes exactly one job, with no
gap and no duplicate."""

import os
import signal
import subprocess
import sys
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from shared.core.schedules import slot_of
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


def start_timer(database_url, queue_prefix, index, log_dir):
    env = {**os.environ, "TOCK_DATABASE_URL": database_url, "TOCK_QUEUE_PREFIX": queue_prefix,
           "TOCK_LOG_FORMAT": "json", "TOCK_PROCESS_NAME": f"timer-{index}",
           "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    # A file, not a pipe: a full pipe would block the timer.
    log = (log_dir / f"timer-{index}.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "timer_service"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log)


@pytest.mark.e2e
def test_three_timer_processes_one_killed_exactly_one_job_per_slot(
        client, db, transport, database_url, queue_prefix, tmp_path):
    client.recurring("pulse", "report", every=1)

    def keys():
        return [r[0] for r in db.execute(
            "SELECT unique_key FROM tock_jobs_all WHERE schedule_name = 'pulse' "
            "ORDER BY run_at").fetchall()]

    timers = [start_timer(database_url, queue_prefix, i, tmp_path) for i in range(3)]
    try:
        wait_for(lambda: len(keys()) >= 4, timeout=60, message="4 slots fired")
        timers[0].kill()  # SIGKILL: no clean shutdown
        timers[0].wait(timeout=10)
        seen = len(keys())
        wait_for(lambda: len(keys()) >= seen + 5, timeout=60, message="5 more slots")
        # Each dispatched job went out through SQS (the timers dispatch what they make).
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM tock_jobs_all WHERE schedule_name = 'pulse' "
            "AND state = 'scheduled' AND run_at < now() - interval '3 seconds'"
        ).fetchone()[0] == 0, timeout=30, message="due schedule jobs dispatched")
    finally:
        for proc in timers[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc in timers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for proc in timers[1:]:
        assert proc.returncode == 0, (tmp_path / "timer-1.log").read_text()
    slots = [slot_of(k) for k in keys()]
    assert len(slots) == len(set(slots))
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(slots)), \
        slots
    assert db.execute("SELECT count(*) FROM tock_schedule_audit").fetchone()[0] == 0
    run_ats = db.execute("SELECT unique_key, run_at FROM tock_jobs_all "
                         "WHERE schedule_name = 'pulse'").fetchall()
    assert all(slot_of(k) == run_at for k, run_at in run_ats)
