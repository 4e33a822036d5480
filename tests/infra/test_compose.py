"""localstack/compose.yaml (the Docker path of the local stack): valid against the Compose
Specification, structure, commands, health checks and start order, settings that agree.
No Docker engine here, so the stack is not started; its init hook is run against a real
LocalStack below."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from typing import Any

import boto3
import pytest
import yaml
from compose_spec import PyOptions

from consumer.service import LAST_WRITES_SECONDS
from devstack.sqs import LOCALSTACK_VENV
from tests.infra.paths import COMPOSE_FILE, INIT_HOOK, ROOT
from tests.infra.processes import load_settings, unknown_tock_variables

COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
TOCK_SERVICES = {"migrate": "migrate", "timer": "timer", "consumer": "consumer",
                 "dashboard": "dashboard", "producer": "producer"}
ENTRYPOINT_PROCESSES = {"timer", "consumer", "dashboard", "migrate", "tock", "python"}


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * units[suffix]
    return float(value)


def _validate_spec(source: str) -> None:
    """Parse with the Compose Specification (the `compose_spec` crate): unknown keys,
    bad enum values and malformed durations are errors."""
    PyOptions(apply_merge=True).from_yaml(source).validate()


def test_compose_file_follows_the_compose_specification():
    _validate_spec(COMPOSE_FILE.read_text())


@pytest.mark.parametrize(("good", "bad"), [
    ("stop_grace_period: 40s", "stop_grace_perod: 40s"),
    ("condition: service_healthy", "condition: service_heathy"),
    ("interval: 2s", "interval: two"),
])
def test_compose_specification_check_rejects_mistakes(good, bad):
    source = COMPOSE_FILE.read_text()
    assert good in source
    with pytest.raises(ValueError):
        _validate_spec(source.replace(good, bad, 1))


def test_all_services_are_present():
    assert set(SERVICES) == {"postgres", "localstack", *TOCK_SERVICES}


@pytest.mark.parametrize("name", sorted(TOCK_SERVICES))
def test_tock_services_use_the_repository_image_hardened(name):
    service = SERVICES[name]
    build = service["build"]
    assert (COMPOSE_FILE.parent / build["context"] / build["dockerfile"]).resolve() == \
        (ROOT / "Dockerfile").resolve()
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]
    assert service["command"][0] in ENTRYPOINT_PROCESSES


def test_consumer_runs_the_demo_tasks_module():
    command = SERVICES["consumer"]["command"]
    assert command[:3] == ["consumer", "--tasks", "demo.tasks"]
    from consumer.tasks import registry

    importlib.import_module("demo.tasks")
    assert registry.kinds()


def test_start_order_waits_for_health_and_migrations():
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("timer", "consumer", "dashboard", "producer"):
        assert SERVICES[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "localstack": {"condition": "service_healthy"},
        }, name


def test_health_checks():
    for name in ("postgres", "localstack"):
        assert SERVICES[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    # LocalStack is healthy only once the init hook has created the queues.
    assert "/_localstack/init/ready" in SERVICES["localstack"]["healthcheck"]["test"][1]
    # One-shot and client processes disable the image's HEALTHCHECK; servers keep it and
    # listen where it looks (TOCK_HEALTH_PORT, or the dashboard port).
    for name in ("migrate", "producer"):
        assert SERVICES[name]["healthcheck"] == {"disable": True}
    for name in ("timer", "consumer"):
        assert "healthcheck" not in SERVICES[name]
        assert SERVICES[name]["environment"]["TOCK_HEALTH_PORT"] == "9000"
    assert SERVICES["dashboard"]["environment"]["TOCK_DASHBOARD_PORT"] == "8080"


def test_timer_runs_two_replicas():
    assert SERVICES["timer"]["deploy"]["replicas"] >= 2


@pytest.mark.parametrize("name", sorted(TOCK_SERVICES))
def test_environment_is_valid_for_each_process(name, monkeypatch):
    env = {k: str(v) for k, v in SERVICES[name]["environment"].items()}
    process = TOCK_SERVICES[name]
    assert unknown_tock_variables(process, env) == []
    # ${VAR:-default} is compose interpolation: validate with the defaults.
    env = {k: v.split(":-", 1)[1].rstrip("}") if v.startswith("${") else v
           for k, v in env.items()}
    load_settings(process, env, monkeypatch)


def test_consumer_drains_within_docker_stop_grace(monkeypatch):
    env = SERVICES["consumer"]["environment"]
    settings = load_settings("consumer", dict(env), monkeypatch)
    assert _seconds(SERVICES["consumer"]["stop_grace_period"]) > \
        settings.shutdown_grace_seconds + LAST_WRITES_SECONDS


def test_localstack_hook_creates_the_queues_the_processes_use():
    ls = SERVICES["localstack"]
    assert "./init/ready.d:/etc/localstack/init/ready.d:ro" in ls["volumes"]
    assert (COMPOSE_FILE.parent / "init" / "ready.d" / INIT_HOOK.name).exists()
    consumer_env = SERVICES["consumer"]["environment"]
    assert ls["environment"]["TOCK_QUEUE_PREFIX"] == consumer_env["TOCK_QUEUE_PREFIX"]
    assert ls["environment"]["TOCK_QUEUES"].split(",") == json.loads(consumer_env["TOCK_QUEUES"])
    assert ls["environment"]["TOCK_VISIBILITY_TIMEOUT_SECONDS"] == \
        consumer_env["TOCK_VISIBILITY_TIMEOUT_SECONDS"]
    for name in TOCK_SERVICES:
        env = SERVICES[name]["environment"]
        assert env["AWS_ENDPOINT_URL_SQS"] == "http://localstack:4566"
        assert env["TOCK_QUEUE_PREFIX"] == ls["environment"]["TOCK_QUEUE_PREFIX"]


def _run_hook(endpoint: str, **env: str) -> subprocess.CompletedProcess[str]:
    # Exactly how LocalStack runs a Python init script: exec(source, {}) in its interpreter.
    code = f"exec(open({str(INIT_HOOK)!r}).read(), {{}})"
    return subprocess.run(
        [str(LOCALSTACK_VENV / "bin" / "python"), "-c", code], check=False,
        env={"PATH": os.environ["PATH"], "AWS_ENDPOINT_URL": endpoint, **env},
        capture_output=True, text=True, timeout=120)


def test_init_hook_creates_queues_with_dlq_in_real_localstack(sqs_server, queue_prefix):
    env = {"TOCK_QUEUE_PREFIX": queue_prefix, "TOCK_QUEUES": "default,reports",
           "TOCK_VISIBILITY_TIMEOUT_SECONDS": "90", "TOCK_DLQ_MAX_RECEIVE_COUNT": "4"}
    first = _run_hook(sqs_server.endpoint, **env)
    assert first.returncode == 0, first.stderr
    again = _run_hook(sqs_server.endpoint, **env)
    assert again.returncode == 0, again.stderr  # idempotent: a restarted LocalStack re-runs it
    sqs = boto3.client("sqs", endpoint_url=sqs_server.endpoint, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")
    for queue in ("default", "reports"):
        url = sqs.get_queue_url(QueueName=f"{queue_prefix}{queue}")["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        dlq_url = sqs.get_queue_url(QueueName=f"{queue_prefix}{queue}-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(
            QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert attrs["VisibilityTimeout"] == "90"
        redrive = json.loads(attrs["RedrivePolicy"])
        assert redrive["deadLetterTargetArn"] == dlq_arn
        assert int(redrive["maxReceiveCount"]) == 4


def test_init_hook_refuses_bad_queue_names(sqs_server, queue_prefix):
    done = _run_hook(sqs_server.endpoint, TOCK_QUEUE_PREFIX=queue_prefix,
                     TOCK_QUEUES="default,no spaces")
    assert done.returncode != 0
    assert "TOCK_QUEUES must name queues" in done.stderr
