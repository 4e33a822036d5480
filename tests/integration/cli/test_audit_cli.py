"""Operator actions through the CLI log the dashboard's events for them, with via="cli"
and the OS user, on stderr when TOCK_LOG_LEVEL is set; without it, only the command's own
output. Run as a process: logging is configured once per process, as in real use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.support.dashboard import make_dead


def _tock(database_url: str, *argv: str, level: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOCK_DATABASE_URL": database_url}
    env.pop("TOCK_LOG_LEVEL", None)
    if level is not None:
        env["TOCK_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def _events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_actions_are_logged_when_a_log_level_is_set(database_url, db, client):
    job = client.schedule("email")
    make_dead(db, job.id)
    done = _tock(database_url, "retry", str(job.id), level="INFO")
    assert done.returncode == 0, done.stderr
    (event,) = _events(done.stderr)
    assert event["event"] == "job_retried" and event["job_id"] == job.id
    assert event["via"] == "cli" and event["user"]
    done = _tock(database_url, "limits", "set", "kind", "email", "--max-running", "2",
                 level="INFO")
    assert [e["event"] for e in _events(done.stderr)] == ["limit_set"]


def test_without_a_log_level_a_command_prints_only_its_output(database_url, client):
    done = _tock(database_url, "enqueue", "email", level=None)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("enqueued job ")


def test_a_log_level_it_cannot_use_is_a_usage_error(database_url):
    done = _tock(database_url, "stats", level="LOUD")
    assert done.returncode == 2
    assert "TOCK_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR" in done.stderr
