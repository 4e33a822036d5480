"""Consumers: receive SQS messages, claim the job row with a fenced update, keep the lease
alive with heartbeats, run the handler, record the outcome, then delete the message."""

from consumer.tasks import Abandon, Registry, TaskContext, registry, task
from shared.core.errors import Permanent, RetryAfter

__all__ = ["Abandon", "Permanent", "Registry", "RetryAfter", "TaskContext", "registry", "task"]
