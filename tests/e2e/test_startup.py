"""Each process refuses to start on a database it cannot use, within seconds, naming the
variable and the cause (exit 2: a setting to fix; exit 3: unreachable), and a consumer
whose SQS queue does not exist says so once, clearly. An AWS configuration boto3 cannot
use (no region, a malformed endpoint) and a probe or dashboard address it cannot listen
on are settings to fix too: one line naming the variable, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devstack.ports import free_port

PROCESSES = {
    "timer": ["-m", "timer_service"],
    "consumer": ["-m", "consumer", "--tasks", "demo.tasks"],
    "dashboard": ["-m", "dashboard"],
}


def _run(args: list[str], *, drop: tuple[str, ...] = (),
         **env: str) -> subprocess.CompletedProcess[str]:
    # A free dashboard port: the dashboard binds it before it checks the database.
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, *args], check=False,
                          env={**base, "TOCK_DASHBOARD_PORT": str(free_port()), **env},
                          capture_output=True, text=True, timeout=60)


def _one_line_refusal(done: subprocess.CompletedProcess[str], *names: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert all(name in done.stderr for name in names), done.stderr
    return done.stderr


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_an_unreachable_database_stops_the_process_with_the_cause(process):
    url = f"postgresql://tock:secret@127.0.0.1:{free_port()}/tock"
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=url, TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 3, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and "refused" in done.stderr
    assert "secret" not in done.stderr, "the password is not printed"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("process", sorted(PROCESSES))
@pytest.mark.parametrize(("query", "words"), [
    ("?options=-c%20statement_timeout%3Dabc", 'invalid value for parameter "statement_timeout"'),
    ("?options=-c%20no_such_setting%3D1", 'unrecognized configuration parameter'),
])
def test_a_url_whose_settings_the_server_refuses_is_a_settings_error(process, database_url,
                                                                     query, words):
    """It exited 3 ("unavailable"), which an orchestrator retries for ever and an operator
    reads as Postgres being down; the URL is what is wrong."""
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=database_url + query,
                TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 2, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and words in done.stderr
    assert "refuses what the URL asks for" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count(words) == 1, "libpq's repeats of one failure are said once"


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_a_mistyped_setting_is_named_with_the_one_meant(process):
    # Unknown TOCK_* variables are never read: the default stays in force, unsaid.
    url = f"postgresql://tock@127.0.0.1:{free_port()}/tock"
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=url, TOCK_DASHBOARD_DEV="1",
                TOCK_CONCURENCY="4", TOCK_LOG_FORMAT="json")
    assert done.returncode == 3, done.stderr
    [line] = [json.loads(x) for x in done.stderr.splitlines() if "unknown_setting" in x]
    assert (line["level"], line["variable"]) == ("warning", "TOCK_CONCURENCY")
    assert line["detail"] == "no tock process reads it; did you mean TOCK_CONCURRENCY?"


@pytest.mark.parametrize("process", sorted(PROCESSES))
@pytest.mark.parametrize("url", ["not a url", "mysql://u@h/db"])
def test_a_malformed_database_url_is_a_settings_error(process, url):
    done = _run(PROCESSES[process], TOCK_DATABASE_URL=url, TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 2, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_a_malformed_database_url_is_refused_without_its_password(process):
    done = _run(PROCESSES[process], TOCK_DATABASE_URL="postgresql://me:s3cr3tpw@[db/tock",
                TOCK_DASHBOARD_DEV="1")
    assert done.returncode == 2, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr and "postgresql://me:***@[db/tock" in done.stderr
    assert "s3cr3tpw" not in done.stderr


AWS_PROCESSES = ["consumer", "timer"]
"""The processes that use SQS (the dashboard does not)."""


@pytest.mark.parametrize("process", AWS_PROCESSES)
def test_no_aws_region_is_one_line_naming_the_variable(process, database_url):
    done = _run(PROCESSES[process], drop=("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"),
                TOCK_DATABASE_URL=database_url, AWS_CONFIG_FILE=os.devnull)
    err = _one_line_refusal(done, "AWS_DEFAULT_REGION", "AWS_REGION")
    assert "NoRegionError" not in err


@pytest.mark.parametrize("process", AWS_PROCESSES)
@pytest.mark.parametrize(("variable", "url"), [
    ("AWS_ENDPOINT_URL_SQS", "not-a-url"),
    ("AWS_ENDPOINT_URL_SQS", "http://[::1"),
    ("AWS_ENDPOINT_URL", "localhost:4566"),
])
def test_a_malformed_aws_endpoint_is_one_line_naming_the_variable(process, database_url,
                                                                  variable, url):
    drop = ("AWS_ENDPOINT_URL_SQS",) if variable != "AWS_ENDPOINT_URL_SQS" else ()
    done = _run(PROCESSES[process], drop=drop, TOCK_DATABASE_URL=database_url,
                AWS_DEFAULT_REGION="us-east-1", **{variable: url})
    _one_line_refusal(done, variable, repr(url))


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something listens on (on every interface, as the probe server binds)."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("process", AWS_PROCESSES)
def test_a_taken_health_port_is_one_line_naming_it(process, taken_port):
    # Refused before Postgres is asked: the URL here leads nowhere.
    done = _run(PROCESSES[process], TOCK_HEALTH_PORT=str(taken_port),
                TOCK_DATABASE_URL=f"postgresql://tock@127.0.0.1:{free_port()}/tock")
    err = _one_line_refusal(done, "TOCK_HEALTH_PORT", str(taken_port))
    assert "in use" in err


@pytest.mark.parametrize("process", AWS_PROCESSES)
def test_a_health_host_that_does_not_resolve_is_one_line_naming_it(process):
    done = _run(PROCESSES[process], TOCK_HEALTH_PORT=str(free_port()),
                TOCK_HEALTH_HOST="nonexistent.invalid")
    _one_line_refusal(done, "TOCK_HEALTH_HOST", "nonexistent.invalid")


def test_a_taken_dashboard_port_is_one_line_and_exit_2_not_3(taken_port):
    done = _run(PROCESSES["dashboard"], TOCK_DASHBOARD_DEV="1",
                TOCK_DASHBOARD_PORT=str(taken_port),
                TOCK_DATABASE_URL=f"postgresql://tock@127.0.0.1:{free_port()}/tock")
    _one_line_refusal(done, "TOCK_DASHBOARD_PORT", str(taken_port))
    done = _run([*PROCESSES["dashboard"], "--port", str(taken_port)], TOCK_DASHBOARD_DEV="1")
    _one_line_refusal(done, "--port", str(taken_port))


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
