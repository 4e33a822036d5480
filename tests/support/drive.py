"""Driving the real timer and consumer one step at a time, in-process, against the real
Postgres and SQS of the test session."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from consumer.service import Consumer
from consumer.tasks import Registry
from shared.core.states import JobState
from shared.runtime.settings import ConsumerSettings, TimerSettings
from tests.support.wait import wait_for
from timer_service.service import Timer


class Clock:
    """A pinned database clock for the consumer (`clock=`) and the timer (`now=`)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def db_now(db: Any) -> datetime:
    now: datetime = db.execute("SELECT now()").fetchone()[0]
    return now


def make_consumer(settings: ConsumerSettings, registry: Registry, transport: Any,
                  clock: Any = None, **overrides: Any) -> Consumer:
    if overrides:
        settings = settings.model_copy(update=overrides)
    consumer = Consumer(settings, registry, transport, clock=clock or (lambda: None))
    consumer.open()
    return consumer


def receive(consumer: Consumer, expect: int, queue: str = "default",
            rounds: int = 20) -> list[Any]:
    """Receive until `expect` jobs are claimed (SQS may hand out fewer per call)."""
    entries: list[Any] = []
    for _ in range(rounds):
        if len(entries) >= expect:
            break
        consumer.receive_once(queue, wait_seconds=1)
        while not consumer.pipe.work.empty():
            entry = consumer.pipe.work.get_nowait()
            assert entry is not None
            entries.append(entry)
    return entries


def run_all(consumer: Consumer, entries: list[Any]) -> None:
    """Run each claimed job's handler, then write every outcome."""
    for entry in entries:
        consumer.executor.run(entry)
    while consumer.complete_pending():
        pass


def dispatch(timer: Timer, now: datetime | None = None) -> int:
    total = 0
    while True:
        result = timer.run_once(now)
        total += result.dispatched
        if result.dispatched < timer.settings.batch_size:
            return total


def settle(client: Any, timer: Timer, job_id: int, state: JobState = JobState.SUCCEEDED,
           timeout: float = 30) -> Any:
    """Dispatch (retries too) until the job reaches `state`."""
    return wait_for(lambda: dispatch(timer) >= 0 and client.get(job_id).state is state,
                    timeout=timeout, message=f"job {job_id} {state.value}")


@contextmanager
def timer_running(settings: TimerSettings, transport: Any) -> Iterator[Timer]:
    """A real Timer with all its loops on a thread, stopped and closed on exit."""
    timer = Timer(settings, transport)
    thread = threading.Thread(target=timer.run_forever, daemon=True)
    thread.start()
    try:
        yield timer
    finally:
        timer.stop_flag.set()
        thread.join(timeout=15)
        timer.close()


def race_timers(settings: TimerSettings, transport: Any, now: datetime, *, timers: int = 2,
                passes: int = 15) -> None:
    """`timers` Timers making `passes` dispatch passes each, all at once, at `now`. An
    error in any of them is raised here, in the test's thread, so a race that crashed a
    timer cannot pass for one that stayed within its limits."""
    racing = [Timer(settings, transport) for _ in range(timers)]
    errors: list[BaseException] = []
    try:
        def run(t: Timer) -> None:
            try:
                for _ in range(passes):
                    t.run_once(now)
            except BaseException as exc:
                errors.append(exc)
        threads = [threading.Thread(target=run, args=(t,)) for t in racing]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "a racing timer hung"
    finally:
        for t in racing:
            t.close()
    if errors:
        raise errors[0]
