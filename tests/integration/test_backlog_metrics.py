"""Backlog metrics for autoscaling (timer_service/backlog_metrics.py): a timer with
TOCK_CLOUDWATCH_NAMESPACE publishes each queue's backlog to a real CloudWatch-compatible
server (moto's), read back through CloudWatch's API; a CloudWatch that dies (kill -9) costs a
logged warning and no more, and publishing resumes once it is back."""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

from devstack.sqs import SqsServer, start_moto
from shared.core.errors import ConfigError
from shared.runtime.settings import TimerSettings
from shared.store.operator_store import OperatorStore
from tests.support.drive import timer_running
from tests.support.wait import wait_for
from timer_service.backlog_metrics import BacklogMetrics, cloudwatch_client

REGION = "us-east-1"


@pytest.fixture
def cloudwatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[SqsServer]:
    """A moto server as CloudWatch, through the standard AWS variables."""
    server = start_moto()
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    yield server
    server.stop()


def _read(server: SqsServer, namespace: str, metric: str, queue: str,
          stat: str = "Maximum") -> list[float]:
    """`stat` of each one-second period of `metric` for `queue`, oldest first."""
    cw = boto3.client("cloudwatch", endpoint_url=server.endpoint, region_name=REGION,
                      aws_access_key_id="test", aws_secret_access_key="test")
    now = datetime.now(UTC)
    points = cw.get_metric_statistics(
        Namespace=namespace, MetricName=metric,
        Dimensions=[{"Name": "Queue", "Value": queue}],
        StartTime=now - timedelta(minutes=10), EndTime=now + timedelta(minutes=10),
        Period=1, Statistics=[stat])["Datapoints"]  # type: ignore[list-item]
    return [p[stat] for p in sorted(points, key=lambda p: p["Timestamp"])]  # type: ignore[literal-required]


def _namespace() -> str:
    return f"tock-test/{uuid.uuid4().hex[:8]}"


def test_each_queue_s_backlog_running_and_oldest_age_are_published(
        cloudwatch: SqsServer, operator_store: OperatorStore, client: Any, timer: Any,
        db: Any) -> None:
    ns = _namespace()
    past = datetime.now(UTC) - timedelta(minutes=5)
    for _ in range(3):
        client.schedule("report", queue="reports", at=past)
    client.schedule("report", queue="reports", delay=3600)  # not due: not backlog
    mail = [client.schedule("email", queue=f"mail{i}") for i in range(2)]
    db.execute("UPDATE tock_jobs SET state = 'running', attempt = 1, lease_owner = NULL "
               "WHERE id = %s", (mail[0].id,))
    metrics = BacklogMetrics(operator_store, ns, interval_seconds=60,
                             always=["default"])
    assert metrics.run_once() == 0
    assert _read(cloudwatch, ns, "Backlog", "reports") == [3]
    assert _read(cloudwatch, ns, "Running", "reports") == [0]
    assert _read(cloudwatch, ns, "OldestDueAgeSeconds", "reports")[0] >= 290
    assert _read(cloudwatch, ns, "Running", "mail0") == [1]
    assert _read(cloudwatch, ns, "Backlog", "mail1") == [1]
    # A queue always published, with nothing in it: zeros, so scaling has data.
    assert _read(cloudwatch, ns, "Backlog", "default") == [0]
    assert _read(cloudwatch, ns, "OldestDueAgeSeconds", "default") == [0]

    # Drained: a queue published once goes on being published, with zeros.
    db.execute("UPDATE tock_jobs SET run_at = now() + interval '1 hour' "
               "WHERE queue = 'reports'")
    metrics.run_once()
    assert min(_read(cloudwatch, ns, "Backlog", "reports", "Minimum")) == 0


def test_a_dead_cloudwatch_costs_a_warning_and_publishing_resumes(
        cloudwatch: SqsServer, operator_store: OperatorStore, client: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    ns = _namespace()
    client.schedule("report")
    metrics = BacklogMetrics(operator_store, ns, interval_seconds=60)
    metrics.run_once()
    assert _read(cloudwatch, ns, "Backlog", "default") == [1]

    os.killpg(cloudwatch.process.pid, signal.SIGKILL)
    cloudwatch.process.wait(timeout=10)
    with caplog.at_level(logging.WARNING, logger="tock.timer.backlog_metrics"):
        assert metrics.run_once() == 0  # no raise: the timer's other loops go on
    assert "backlog_metrics_unpublished" in caplog.text

    port = urlsplit(cloudwatch.endpoint).port
    assert port is not None
    back = start_moto(port)  # a new, empty server where the old one was
    try:
        client.schedule("report")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tock.timer.backlog_metrics"):
            metrics.run_once()
        assert "backlog_metrics_published" in caplog.text
        assert _read(back, ns, "Backlog", "default") == [2]
    finally:
        back.stop()


def test_a_timer_with_a_namespace_publishes_on_its_own_and_stays_ready_without_cloudwatch(
        cloudwatch: SqsServer, timer_settings: TimerSettings, transport: Any,
        client: Any) -> None:
    ns = _namespace()
    settings = timer_settings.model_copy(update={
        "cloudwatch_namespace": ns, "cloudwatch_interval_seconds": 1,
        "cloudwatch_queues": ["default"]})
    client.schedule("report", delay=3600)
    with timer_running(settings, transport) as running:
        wait_for(lambda: _read(cloudwatch, ns, "Backlog", "default"), timeout=30,
                 message="the timer published the default queue's backlog")
        os.killpg(cloudwatch.process.pid, signal.SIGKILL)
        cloudwatch.process.wait(timeout=10)
        job = client.schedule("report")
        # Dispatching does not depend on CloudWatch; nor do the probes.
        wait_for(lambda: client.get(job.id).state.value == "dispatched", timeout=30,
                 message="dispatched with CloudWatch gone")
        assert running.supervisor.live()[0], running.supervisor.live()[1]
        assert running.supervisor.ready()[0], running.supervisor.ready()[1]


def test_a_namespace_cloudwatch_would_refuse_is_a_settings_error() -> None:
    for bad in ("AWS/SQS", "has space", "x" * 256):
        with pytest.raises(ConfigError, match="TOCK_CLOUDWATCH_NAMESPACE"):
            TimerSettings(database_url="postgresql://localhost/tock", cloudwatch_namespace=bad)
    with pytest.raises(ConfigError, match="TOCK_CLOUDWATCH_QUEUES"):
        TimerSettings(database_url="postgresql://localhost/tock", cloudwatch_queues="a,,b")


def test_no_aws_region_is_a_config_error_at_start(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Any) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="AWS_DEFAULT_REGION"):
        cloudwatch_client()
