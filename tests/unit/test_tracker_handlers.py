"""`Tracker.handlers`: every claim whose handler still runs in this process, held or not.
The heartbeat sends their dispatch tokens, and forgets the lingering rows (concurrency
slots) of the others: a handler missing from it loses its slot while it runs."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

from consumer.inflight import InFlight, Tracker
from consumer.pipeline import Pipeline
from consumer.tasks import Registry, TaskContext
from shared.runtime.settings import ConsumerSettings
from shared.store.rows import Lease


def _item(job_id: int = 17, attempt: int = 1) -> InFlight:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    ctx = TaskContext(job_id=job_id, kind="k", queue="default", attempt=attempt,
                      max_attempts=3, scheduled_at=now, deadline=now + timedelta(seconds=30),
                      tenant=None, key=None, cancelled=threading.Event())
    return InFlight(Lease(job_id, attempt, uuid.uuid4()), "default", "r", ctx,
                    timeout_seconds=30.0)


def test_a_claim_replaced_by_the_same_jobs_next_claim_still_runs_until_it_returns():
    tracker = Tracker()
    stuck, retry = _item(attempt=1), _item(attempt=2)
    tracker.add(stuck)
    tracker.add(retry)  # the stuck handler's job, rescued and claimed here again
    assert tracker.items() == [retry]
    assert tracker.handlers() == [stuck, retry]
    retry.handler_returned()
    tracker.forget(retry)
    assert tracker.handlers() == [stuck], "the stuck handler still runs"
    stuck.handler_returned()
    assert tracker.handlers() == []


def test_a_job_given_back_at_shutdown_still_runs_after_it_is_forgotten():
    tracker = Tracker()
    released, unknown = _item(1), _item(2)
    tracker.add(released)
    tracker.add(unknown)
    released.released = True
    tracker.forget(released)  # its release is written; its handler runs on
    tracker.forget(unknown)  # no handler ran (an unknown kind): nothing runs on
    assert tracker.handlers() == [released]
    released.handler_returned()
    assert tracker.handlers() == []


def test_a_worker_reports_its_busy_slots_not_the_outcomes_still_to_be_written():
    """A job stays tracked until its outcome is written, while its slot already runs the
    next one: `tock workers` showed 3 busy of 2."""
    settings = ConsumerSettings(database_url="postgresql://tock@db.example/tock",
                                concurrency=2)
    pipe = Pipeline(settings, Registry(), transport=None, store=None,  # type: ignore[arg-type]
                    claim_store=None)  # type: ignore[arg-type]
    first, second, third = _item(1), _item(2), _item(3)
    pipe.slots.settle(pipe.slots.reserve(2, 0), 2)
    pipe.tracker.add(first)
    pipe.tracker.add(second)
    first.handler_returned()  # its outcome waits for the completer's commit
    pipe.slots.release()
    pipe.slots.settle(pipe.slots.reserve(2, 0), 1)
    pipe.tracker.add(third)
    assert len(pipe.tracker) == 3
    assert pipe.announcement().in_flight == 2
    second.handler_returned()
    pipe.slots.release()
    assert pipe.slots.reserve(1, 0) == 1  # a receiver's, not yet a claim: not busy either
    assert pipe.announcement().in_flight == 1
