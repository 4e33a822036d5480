"""Readings the pipeline and robustness tests take besides the tables: a Prometheus sample
of this process's registry, and whether the test's SQS queue is empty."""

from __future__ import annotations

from prometheus_client import REGISTRY


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def queue_empty(transport) -> bool:
    attrs = transport.client.get_queue_attributes(
        QueueUrl=transport.url("default"),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return attrs["ApproximateNumberOfMessages"] == "0" and \
        attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
