"""Each process refuses to start on a database it cannot use, within seconds, naming the
variable and the cause (exit 2: a setting to fix; exit 3: unreachable), and a consumer
whose SQS queue does not exist says so once, clearly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devstack.ports import free_port

PROCESSES = {
    "timer": ["-m", "timer_service"],
    "consumer": ["-m", "consumer", "--tasks", "demo.tasks"],
    "dashboard": ["-m", "dashboard"],
}


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], check=False, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_an_unreachable_database_stops_the_process_with_the_cause(process):
    url = f"postgresql://tock:secret@127.0.0.1:{free_port()}/tock"
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=url, TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 3, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and "refused" in done.stderr
    assert "secret" not in done.stderr, "the password is not printed"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("process", sorted(PROCESSES))
@pytest.mark.parametrize("url", ["not a url", "mysql://u@h/db"])
def test_a_malformed_database_url_is_a_settings_error(process, url):
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=url, TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 2, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr


def test_an_unmigrated_database_says_run_tock_migrate(pg_server):
    url = pg_server.create_database("empty_for_startup")
    done = _run(PROCESSES["timer"], TOCK_DATABASE_URL=url)
    assert done.returncode == 2 and "tock migrate" in done.stderr, done.stderr


def test_settings_errors_name_their_variables():
    done = _run(PROCESSES["consumer"], TOCK_HEARTBEAT_SECONDS="20", TOCK_LEASE_SECONDS="30")
    assert done.returncode == 2
    assert "TOCK_HEARTBEAT_SECONDS" in done.stderr and "TOCK_LEASE_SECONDS" in done.stderr
    assert "TOCK_?" not in done.stderr


def test_comma_separated_queues_are_read(database_url, queue_prefix, sqs_server):
    proc = subprocess.Popen(
        [sys.executable, *PROCESSES["consumer"]], text=True, stderr=subprocess.PIPE,
        env={**os.environ, **sqs_server.env(), "TOCK_DATABASE_URL": database_url,
             "TOCK_QUEUE_PREFIX": queue_prefix, "TOCK_QUEUES": "default,other"})
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if '"event": "consumer_started"' in line:
                break
        text = "".join(lines)
        assert '"queues": ["default", "other"]' in text, text
        assert text.count('"event": "queue_missing"') == 2, "each missing queue said once"
    finally:
        proc.terminate()
        proc.wait(30)
