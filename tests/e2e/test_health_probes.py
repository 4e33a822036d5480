"""Liveness, readiness and /metrics of the timer and consumer (shared.health): in-process
against their real loops, and as real processes started with TOCK_HEALTH_PORT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.ports import free_port
from shared.core.errors import ConfigError
from shared.runtime.health import HealthServer
from tests.support.http import get
from tests.support.wait import wait_for
from timer_service.service import Timer


def test_timer_probes_follow_its_loops(transport, timer_settings, client):
    timer = Timer(timer_settings.model_copy(update={"max_idle_seconds": 0.2}), transport)
    loop = threading.Thread(target=timer.run_forever, daemon=True)
    live, ready = timer.supervisor.live, timer.supervisor.ready
    server = HealthServer(0, live=live, ready=ready, host="127.0.0.1", process="timer").start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, body = get(base + "/readyz")
        assert status == 503 and "no successful dispatch pass yet" in body
        loop.start()
        wait_for(lambda: get(base + "/readyz")[0] == 200, message="timer ready")
        assert get(base + "/healthz")[0] == 200
        client.schedule("email")
        wait_for(lambda: 'tock_jobs_dispatched_total{queue="default"}' in get(
            base + "/metrics")[1], message="dispatch counted in /metrics")
        assert get(base + "/nope")[0] == 404
        timer.stop_flag.set()
        status, body = get(base + "/readyz")
        assert status == 503 and "stopping" in body
        # Live while it stops: a failing liveness probe would have it killed mid-drain.
        status, body = get(base + "/healthz")
        assert status == 200 and "stopping" in body
        loop.join(timeout=10)
    finally:
        timer.stop_flag.set()
        server.close()


def test_consumer_ready_after_a_heartbeat_and_a_receive(consumer_settings, transport):
    consumer = Consumer(consumer_settings, Registry(), transport)
    live, ready = consumer.supervisor.live, consumer.supervisor.ready
    server = HealthServer(0, live=live, ready=ready, host="127.0.0.1").start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        consumer.open()
        assert get(base + "/healthz")[0] == 200
        status, body = get(base + "/readyz")
        assert status == 503 and "no successful heartbeat pass yet" in body
        consumer.heartbeat_once()
        status, body = get(base + "/readyz")
        assert status == 503 and "no successful claim-default pass yet" in body, (
            "and a receive from each queue")
        consumer.receive_once("default", wait_seconds=0)
        status, body = get(base + "/readyz")
        assert status == 200 and "heartbeat" in body
    finally:
        server.close()
        consumer.close()


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err.decode()


def test_processes_serve_probes_on_tock_health_port(database_url, queue_prefix, transport):
    common = {"TOCK_DATABASE_URL": database_url, "TOCK_QUEUE_PREFIX": queue_prefix,
              "TOCK_HEALTH_HOST": "127.0.0.1", "TOCK_LOG_FORMAT": "json"}
    timer_port, consumer_port = free_port(), free_port()
    timer = _spawn(["-m", "timer_service"], {**common, "TOCK_HEALTH_PORT": str(timer_port)})
    consumer = _spawn(["-m", "consumer", "--tasks", "demo.tasks", "--concurrency", "2"], {
        **common, "TOCK_HEALTH_PORT": str(consumer_port), "TOCK_HEARTBEAT_SECONDS": "0.5",
        "TOCK_LEASE_SECONDS": "5", "TOCK_VISIBILITY_TIMEOUT_SECONDS": "10"})
    procs: list[Any] = [timer, consumer]
    try:
        for port in (timer_port, consumer_port):
            wait_for(lambda p=port: get(f"http://127.0.0.1:{p}/readyz")[0] == 200,
                     timeout=60, message=f"readyz on {port}")
            status, body = get(f"http://127.0.0.1:{port}/healthz")
            assert status == 200, body
            assert "# HELP" in get(f"http://127.0.0.1:{port}/metrics")[1]
        # Each exports its own metrics (and the shared ones), not the other's.
        timer_metrics = get(f"http://127.0.0.1:{timer_port}/metrics")[1]
        consumer_metrics = get(f"http://127.0.0.1:{consumer_port}/metrics")[1]
        for own, other in (("tock_jobs_redispatched_total", "tock_leases_lost_total"),
                           ("tock_schedule_fires_total", "tock_stale_completions_total")):
            assert own in timer_metrics and own not in consumer_metrics
            assert other in consumer_metrics and other not in timer_metrics
        assert "tock_sqs_errors_total" in timer_metrics
        assert "tock_sqs_errors_total" in consumer_metrics
        assert "process_cpu_seconds_total" in timer_metrics
    finally:
        logs = [_stop(p) for p in procs]
    assert '"event": "health_server_started"' in logs[0]
    assert '"event": "health_server_started"' in logs[1]


@pytest.mark.parametrize("args", [["-m", "timer_service"],
                                  ["-m", "consumer", "--tasks", "demo.tasks"]])
def test_probes_answer_starting_while_the_database_check_waits(args):
    # A Postgres that takes the connection and never answers (frozen, or a partition):
    # the probe port listened without answering until the check gave up (exit 3), which
    # reads as a hung process rather than one starting.
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        url = f"postgresql://tock@127.0.0.1:{frozen.getsockname()[1]}/tock"
        port = free_port()
        proc = _spawn(args, {"TOCK_DATABASE_URL": url, "TOCK_HEALTH_HOST": "127.0.0.1",
                             "TOCK_HEALTH_PORT": str(port)})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: get(base + "/healthz")[0] != 0, timeout=30,
                     message="the probe port answering")
            assert get(base + "/healthz") == (200, "ok: starting\n")
            assert get(base + "/readyz") == (503, "not ok: starting\n")
            assert proc.poll() is None  # still checking the database
            # A stop asked for now is a clean exit (0), not a death by SIGTERM (-15).
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            err = _stop(proc)
    assert "health_server_started" in err


def test_a_consumer_checking_a_frozen_sqs_at_start_says_so_when_probed(database_url):
    # SQS that takes the connection and never answers: the start-up check of the queues
    # waits out its call timeouts, and readiness said "no successful heartbeat pass yet".
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        port = free_port()
        proc = _spawn(["-m", "consumer", "--tasks", "demo.tasks"], {
            "TOCK_DATABASE_URL": database_url, "TOCK_HEALTH_HOST": "127.0.0.1",
            "TOCK_HEALTH_PORT": str(port),
            "AWS_ENDPOINT_URL_SQS": f"http://127.0.0.1:{frozen.getsockname()[1]}",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test"})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: "SQS" in get(base + "/readyz")[1], timeout=30,
                     message="readiness naming the SQS check")
            assert get(base + "/readyz") == (
                503, "not ok: starting: checking the SQS queue(s) default\n")
            assert get(base + "/healthz")[0] == 200
        finally:
            proc.kill()  # its shutdown is not what is tested: no wait for the SQS timeouts
            proc.communicate()


def test_a_port_it_cannot_listen_on_is_a_config_error_naming_the_setting():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            HealthServer(port, host="127.0.0.1")
    assert str(refused.value).startswith(f"TOCK_HEALTH_PORT: cannot listen on 127.0.0.1:{port}")
    with pytest.raises(ConfigError) as refused:
        HealthServer(free_port(), host="nonexistent.invalid")
    assert str(refused.value).startswith("TOCK_HEALTH_HOST: cannot listen on nonexistent.invalid")


def test_a_server_bound_before_its_loops_exist_answers_starting_until_given_probes():
    server = HealthServer(0, host="127.0.0.1")  # listening, not yet serving
    base = f"http://127.0.0.1:{server.port}"
    try:
        server.start()
        assert get(base + "/readyz") == (503, "not ok: starting\n")
        server.live = server.ready = lambda: (True, "fine")
        assert get(base + "/healthz") == (200, "ok: fine\n")
    finally:
        server.close()
    HealthServer(0, host="127.0.0.1").close()  # never started: closes, does not hang
