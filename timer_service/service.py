"""The timer's loop: `run_once()` does one pass and says what it did; `run_forever()` only
loops, sleeps until the next due time (or a NOTIFY), logs, and stops on SIGTERM."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from shared.core.errors import DatabaseUnavailable, TockError
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import emit
from shared.runtime.settings import TimerSettings
from shared.store import jobs_sql as sql
from shared.store.database import connect, make_pool
from shared.transport.base import Transport
from shared.transport.sqs import SqsTransport
from timer_service.dispatcher import Dispatcher
from timer_service.rescuer import Rescuer

log = logging.getLogger("tock.timer")

MAX_ERROR_BACKOFF_SECONDS = 5.0


@dataclass(frozen=True)
class PassResult:
    """What one pass did."""

    dispatched: int = 0
    refused: int = 0
    rescued: int = 0
    redispatched: int = 0
    fired: int = 0
    """Recurring-schedule slots turned into jobs (see the schedules extension)."""

    @property
    def busy(self) -> bool:
        return bool(self.dispatched or self.rescued or self.redispatched or self.fired)


class Timer:
    """One timer instance. Several may run against the same database at once."""

    def __init__(self, settings: TimerSettings, transport: Transport | None = None) -> None:
        self.settings = settings
        self.name = f"timer-{socket.gethostname()}-{os.getpid()}"
        # Every write of the timer is recoverable if a database crash loses it after commit
        # (a lost dispatch leaves a token no job carries: stale; a lost rescue or slot fire
        # is simply done again), so its commits need not wait for the WAL flush.
        self.pool = make_pool(settings.database_url, max_size=4, name="tock-timer",
                              check=False, autocommit=True, synchronous_commit=False)
        self.transport = transport or SqsTransport(
            settings.queue_prefix, call_timeout_seconds=settings.sqs_call_timeout_seconds)
        self.dispatcher = Dispatcher(self.pool, self.transport, batch_size=settings.batch_size,
                                     send_concurrency=settings.send_concurrency)
        self.rescuer = Rescuer(
            self.pool, batch_size=settings.batch_size,
            default_max_attempts=settings.default_max_attempts,
            backoff_base_seconds=settings.backoff_base_seconds,
            backoff_cap_seconds=settings.backoff_cap_seconds,
            dispatch_timeout_seconds=settings.dispatch_timeout_seconds,
        )
        self.extra_steps: list[Any] = []
        """Callables `step(now) -> int` run each pass (recurring schedules plug in here)."""
        from timer_service.scheduler import Scheduler

        self.scheduler = Scheduler.for_timer(self.pool, settings)
        self.extra_steps.append(self.scheduler.step)
        self.stop_flag = StopFlag()
        self.last_pass_ok: float | None = None
        self._next_maintenance = 0.0
        self._opened = False

    def open(self) -> None:
        if not self._opened:
            self.pool.open()
            self._opened = True

    def close(self) -> None:
        self.dispatcher.close()
        self.pool.close()

    def run_once(self, now: datetime | None = None) -> PassResult:
        """One pass: fire recurring slots, rescue expired leases, re-dispatch stuck jobs,
        then dispatch one batch of due jobs. `now` pins the database clock (tests).
        Rescue and re-dispatch run at most every maintenance_interval_seconds."""
        self.open()
        fired = sum(step(now) for step in self.extra_steps)
        rescued = redispatched = 0
        # Recovery scans run every maintenance interval, not on the path of every due job;
        # a pinned `now` (tests) always runs them.
        if now is not None or time.monotonic() >= self._next_maintenance:
            self._next_maintenance = time.monotonic() + self.settings.maintenance_interval_seconds
            rescued = self.rescuer.rescue_expired(now)
            redispatched = self.rescuer.redispatch_stuck(now)
        sent, refused = self.dispatcher.dispatch_due(now)
        return PassResult(sent, refused, rescued, redispatched, fired)

    def seconds_until_next_due(self) -> float:
        """How long until the earliest scheduled job is due, capped at max_idle_seconds."""
        with self.pool.connection() as conn:
            row = conn.execute(sql.NEXT_DUE_AT).fetchone()
        if row is None or row[0] is None:
            return self.settings.max_idle_seconds
        next_due, db_now = row
        wait: float = (next_due - db_now).total_seconds()
        return min(max(wait, 0.0), self.settings.max_idle_seconds)

    def run_forever(self) -> None:
        """Loop until SIGTERM/SIGINT. Sleeps on LISTEN tock_due, so new near-due work wakes it
        at once; otherwise until the next due time; never longer than max_idle_seconds."""
        emit(log, "timer_started", timer=self.name, batch_size=self.settings.batch_size)
        listener: psycopg.Connection[Any] | None = None
        error_backoff = 0.0
        while not self.stop_flag.is_set():
            try:
                if listener is None:
                    listener = connect(self.settings.database_url, autocommit=True)
                    listener.execute("LISTEN tock_due")
                result = self.run_once()
                self.last_pass_ok = time.monotonic()  # readiness (shared.health)
                self._log_pass(result)
                error_backoff = 0.0
                if result.refused:
                    # SQS is refusing sends: do not spin on the same rows.
                    self.stop_flag.wait(1.0)
                    continue
                if result.dispatched >= self.settings.batch_size:
                    continue  # a full batch: more is due right now
                wait = self.seconds_until_next_due()
                if wait > 0:
                    for _ in listener.notifies(timeout=wait, stop_after=1):
                        pass
            except (DatabaseUnavailable, psycopg.OperationalError, TockError) as exc:
                error_backoff = min(max(error_backoff * 2, 0.1), MAX_ERROR_BACKOFF_SECONDS)
                emit(log, "timer_pass_failed", logging.ERROR, error=str(exc),
                     retry_in_seconds=error_backoff)
                if listener is not None:
                    listener.close()
                    listener = None
                self.stop_flag.wait(error_backoff)
        if listener is not None:
            listener.close()
        self.close()
        emit(log, "timer_stopped", timer=self.name)

    def _log_pass(self, result: PassResult) -> None:
        if result.busy or result.refused:
            emit(log, "timer_pass", logging.DEBUG, dispatched=result.dispatched,
                 refused=result.refused, rescued=result.rescued,
                 redispatched=result.redispatched, fired=result.fired)
