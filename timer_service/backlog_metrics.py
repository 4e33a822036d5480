"""Each queue's backlog, published to CloudWatch for autoscaling (TOCK_CLOUDWATCH_NAMESPACE).

SQS holds only the dispatch window of a backlog; the rest waits in Postgres, where SQS's
own CloudWatch metrics cannot see it. So autoscaling that reads CloudWatch (ECS) would keep
one or two consumers for a backlog of millions. Every `interval_seconds` this loop reads the
bounded per-queue counts the dashboard shows (shared.store.operator_store) and publishes,
per queue (dimension `Queue`):

    Backlog               jobs due and not yet running: waiting for a timer or in SQS
    Running               jobs running on consumers
    OldestDueAgeSeconds   how long the oldest of those due jobs has waited (exact)

Every timer publishes (there is no leader): they publish the same figures, so scaling reads
their Maximum. A failed publish is logged (`backlog_metrics_unpublished`) and tried again at
the next interval; it never fails the timer, whose dispatching does not depend on it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, InvalidRegionError, NoRegionError

from shared.core.errors import ConfigError
from shared.core.reports import QueueKindStats
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.operator_store import OperatorStore

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_cloudwatch.type_defs import MetricDatumTypeDef

log = logging.getLogger("tock.timer.backlog_metrics")

CALL_TIMEOUT_SECONDS = 10.0
DATUMS_PER_CALL = 1000
"""PutMetricData's limit."""


@dataclass(frozen=True)
class QueueBacklog:
    """One queue's figures, summed over its kinds."""

    queue: str
    backlog: int = 0
    running: int = 0
    oldest_due_age_seconds: float = 0.0


def by_queue(stats: Sequence[QueueKindStats], always: Sequence[str] = ()) -> list[QueueBacklog]:
    """Per queue, the sum over its kinds (the oldest age: their maximum); every queue in
    `always` is there, with zeros if it holds nothing."""
    queues: dict[str, QueueBacklog] = {q: QueueBacklog(q) for q in always}
    for s in stats:
        q = queues.get(s.queue, QueueBacklog(s.queue))
        queues[s.queue] = QueueBacklog(
            s.queue, q.backlog + s.depth, q.running + s.running,
            max(q.oldest_due_age_seconds, s.oldest_due_age_seconds))
    return [queues[name] for name in sorted(queues)]


def datums(figures: Sequence[QueueBacklog]) -> list[MetricDatumTypeDef]:
    out: list[MetricDatumTypeDef] = []
    for f in figures:
        dimensions: Any = [{"Name": "Queue", "Value": f.queue}]
        out += [
            {"MetricName": "Backlog", "Dimensions": dimensions, "Value": f.backlog,
             "Unit": "Count"},
            {"MetricName": "Running", "Dimensions": dimensions, "Value": f.running,
             "Unit": "Count"},
            {"MetricName": "OldestDueAgeSeconds", "Dimensions": dimensions,
             "Value": round(f.oldest_due_age_seconds, 3), "Unit": "Seconds"},
        ]
    return out


def cloudwatch_client() -> CloudWatchClient:
    """A boto3 CloudWatch client from the standard AWS configuration (AWS_ENDPOINT_URL_CLOUDWATCH
    or AWS_ENDPOINT_URL for a local server), or `ConfigError` at start if it cannot work."""
    config = Config(connect_timeout=CALL_TIMEOUT_SECONDS, read_timeout=CALL_TIMEOUT_SECONDS,
                    retries={"mode": "standard", "total_max_attempts": 3})
    try:
        client: CloudWatchClient = boto3.client("cloudwatch", config=config)
    except NoRegionError:
        raise ConfigError("AWS_DEFAULT_REGION: no AWS region is configured, and "
                          "TOCK_CLOUDWATCH_NAMESPACE asks for CloudWatch metrics; set it "
                          "(e.g. AWS_DEFAULT_REGION=us-east-1)") from None
    except (InvalidRegionError, ValueError) as exc:
        raise ConfigError(f"CloudWatch client for TOCK_CLOUDWATCH_NAMESPACE: {exc}") from None
    return client


class BacklogMetrics(Loop):
    """One read and one publish per pass; `run_once` returns 0 so the loop waits the
    interval whatever happened."""

    name = "backlog-metrics"

    def __init__(self, store: OperatorStore, namespace: str, *, interval_seconds: float,
                 always: Sequence[str] = (), client: CloudWatchClient | None = None) -> None:
        super().__init__()
        self.store = store
        self.namespace = namespace
        self.idle_seconds = interval_seconds
        self.always = list(always)
        self.client = client or cloudwatch_client()
        self._seen: set[str] = set()
        self._failing = False

    def run_once(self, now: datetime | None = None) -> int:
        # A queue published once is published with zeros once drained: a queue whose
        # metric stopped would leave scaling with no data, so it would never scale in.
        figures = by_queue(self.store.queue_stats(now), [*self.always, *self._seen])
        self._seen.update(f.queue for f in figures)
        data = datums(figures)
        try:
            for i in range(0, len(data), DATUMS_PER_CALL):
                self.client.put_metric_data(Namespace=self.namespace,
                                            MetricData=data[i:i + DATUMS_PER_CALL])
        except (ClientError, BotoCoreError) as exc:
            self._failing = True
            emit(log, "backlog_metrics_unpublished", logging.WARNING, namespace=self.namespace,
                 error=str(exc)[:500], retry_in_s=self.idle_seconds,
                 detail="CloudWatch refused or did not answer; autoscaling on these "
                        "metrics sees no new data until a publish succeeds")
            return 0
        if self._failing:
            self._failing = False
            emit(log, "backlog_metrics_published", namespace=self.namespace,
                 queues=len(figures), detail="publishing again")
        return 0
