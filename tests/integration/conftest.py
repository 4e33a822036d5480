"""Fixtures of the pipeline and robustness tests (`test_pipeline_*.py`,
`test_robustness_*.py`): a timer on the test's queues, an empty task registry, a pinned
clock, and consumers driven one step at a time (`consumers`) or started for real
(`running`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from consumer.service import Consumer
from consumer.tasks import Registry
from tests.support.drive import Clock, db_now, make_consumer
from timer_service.service import Timer


@pytest.fixture
def timer(timer_settings, transport):
    t = Timer(timer_settings, transport)
    yield t
    t.close()


@pytest.fixture
def registry():
    return Registry()


@pytest.fixture
def clock(db):
    # A little ahead of the database clock, so jobs enqueued "now" by the test are due.
    return Clock(db_now(db) + timedelta(seconds=2))


@pytest.fixture
def consumers(consumer_settings, registry, transport):
    made = []

    def make(clock=None, **overrides):
        c = make_consumer(consumer_settings, registry, transport, clock, **overrides)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def running(consumer_settings, registry, transport):
    """Start a real consumer (all its loops on their threads); shut it down at the end."""
    made: list[Consumer] = []

    def start(transport_: Any = None, **overrides: Any) -> Consumer:
        settings = consumer_settings.model_copy(update=overrides)
        c = Consumer(settings, registry, transport_ or transport)
        c.start()
        made.append(c)
        return c

    yield start
    for c in made:
        c.shutdown()


@pytest.fixture
def clock_now(db):
    return db_now(db) + timedelta(seconds=2)
