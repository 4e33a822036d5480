"""The timer service: seven loops (eight with backlog metrics) on one database pool, any
number of instances side by side with no leader (every claim is FOR UPDATE SKIP LOCKED).

    schedule   turns recurring schedules' due slots into jobs (timer_service/scheduler.py)
    dispatch   claims due jobs and sends them to SQS (timer_service/dispatcher.py)
    dispatch-watch  while a pair is backlogged or held back by the dispatch window, work
               falling due for the others goes out at once (timer_service/due_watcher.py)
    rescue     expired leases (timer_service/rescuer.py)
    redispatch dispatched jobs whose SQS message was lost, on evidence from SQS's counts
               (timer_service/lost_messages.py): a loop of its own, as SQS may hang
    retention  the history's day partitions and retention (timer_service/retention.py)
    statistics an ANALYZE of tock_jobs when its statistics lag far behind it
               (timer_service/statistics.py)
    backlog-metrics  with TOCK_CLOUDWATCH_NAMESPACE set: each queue's backlog to
               CloudWatch, for autoscaling (timer_service/backlog_metrics.py)

`run_once(now)` runs one pass of schedule, rescue, redispatch and dispatch, in that order, on the
caller's thread (tests; the retention loop has its own `run_once(now)`, as it runs every
TOCK_RETENTION_INTERVAL_SECONDS); `run_forever()` runs each loop on its own supervised
thread until SIGTERM.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime

from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import emit
from shared.runtime.settings import TimerSettings
from shared.runtime.supervisor import Supervisor
from shared.store.database import SERVICE_IDLE_IN_TRANSACTION_SECONDS, Database
from shared.store.job_store import JobStore
from shared.store.operator_store import OperatorStore
from shared.store.retention_store import RetentionStore
from shared.store.schedule_store import ScheduleStore
from shared.store.statistics_store import StatisticsStore
from shared.transport.base import Transport
from shared.transport.sqs import SqsTransport
from timer_service.backlog_metrics import BacklogMetrics
from timer_service.dispatcher import Dispatcher
from timer_service.due_watcher import DueWatcher
from timer_service.lost_messages import LostMessages
from timer_service.rescuer import Rescuer
from timer_service.retention import Retention
from timer_service.scheduler import Scheduler
from timer_service.statistics import Statistics

log = logging.getLogger("tock.timer")


@dataclass(frozen=True)
class PassResult:
    """What one pass did."""

    dispatched: int = 0
    refused: int = 0
    rescued: int = 0
    redispatched: int = 0
    fired: int = 0
    """Recurring-schedule slots turned into jobs."""

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
        # A dispatch's transaction stays open through its sends: past SQS's retries (3
        # tries of the call timeout) the server may end it, never before.
        self.database = Database.for_service(
            settings.database_url, max_size=9 if settings.cloudwatch_namespace else 8,
            name="tock-timer", synchronous_commit=False,
            idle_in_transaction_seconds=max(SERVICE_IDLE_IN_TRANSACTION_SECONDS,
                                            4 * settings.sqs_call_timeout_seconds + 20))
        self.transport = transport or SqsTransport(
            settings.queue_prefix, call_timeout_seconds=settings.sqs_call_timeout_seconds,
            create_missing=settings.create_queues,
            visibility_timeout=settings.visibility_timeout_seconds,
            dead_letter_after=settings.dead_letter_after,
            message_groups=settings.sqs_fair_queues)
        jobs = JobStore(self.database)
        self.dispatcher = Dispatcher(jobs, self.transport, batch_size=settings.batch_size,
                                     send_concurrency=settings.send_concurrency,
                                     max_idle_seconds=settings.max_idle_seconds,
                                     dispatch_window=settings.dispatch_window,
                                     dispatch_window_seconds=settings.dispatch_window_seconds)
        self.rescuer = Rescuer(
            jobs, batch_size=settings.batch_size,
            default_max_attempts=settings.default_max_attempts,
            backoff_base_seconds=settings.backoff_base_seconds,
            backoff_cap_seconds=settings.backoff_cap_seconds,
            interval_seconds=settings.maintenance_interval_seconds)
        self.lost_messages = LostMessages(
            jobs, self.transport, batch_size=settings.batch_size,
            dispatch_timeout_seconds=settings.dispatch_timeout_seconds,
            interval_seconds=settings.maintenance_interval_seconds,
            call_timeout_seconds=settings.sqs_call_timeout_seconds)
        self.scheduler = Scheduler(
            ScheduleStore(self.database), batch_size=settings.schedule_batch_size,
            batches_per_pass=settings.schedule_batches_per_pass,
            lookahead_seconds=settings.lookahead_seconds,
            max_fires_per_second=settings.schedule_max_fires_per_second)
        self.retention = Retention(
            RetentionStore(self.database), retention_hours=settings.retention_hours,
            workers_hours=settings.retention_workers_hours,
            audit_hours=settings.retention_audit_hours,
            batch_size=settings.retention_batch_size,
            interval_seconds=settings.retention_interval_seconds)
        self.due_watcher = DueWatcher(self.dispatcher)
        self.statistics = Statistics(StatisticsStore(self.database),
                                     vacuum_dead_rows=settings.vacuum_dead_rows)
        self.stop_flag = StopFlag()
        self.supervisor = Supervisor("timer", self.stop_flag)
        self.supervisor.watch(self.scheduler, self.rescuer, self.lost_messages,
                              self.dispatcher, self.due_watcher, self.retention,
                              self.statistics)
        self.backlog_metrics: BacklogMetrics | None = None
        if settings.cloudwatch_namespace:
            self.backlog_metrics = BacklogMetrics(
                OperatorStore(self.database), settings.cloudwatch_namespace,
                interval_seconds=settings.cloudwatch_interval_seconds,
                always=settings.cloudwatch_queues)
            self.supervisor.watch(self.backlog_metrics)

    def close(self) -> None:
        self.due_watcher.close()
        self.dispatcher.close()
        self.database.close()

    def run_once(self, now: datetime | None = None) -> PassResult:
        """One pass of every loop: fire recurring slots, rescue expired leases, re-dispatch
        stuck jobs, then dispatch one batch of due jobs. `now` pins the database clock."""
        fired = self.scheduler.run_once(now)
        rescued = self.rescuer.rescue_expired(now)
        redispatched = self.lost_messages.redispatch_stuck(now)
        sent, refused = self.dispatcher.dispatch_due(now)
        return PassResult(sent, refused, rescued, redispatched, fired)

    def start(self) -> None:
        """Start the loops on their threads; returns at once."""
        emit(log, "timer_started", timer=self.name, batch_size=self.settings.batch_size)
        self.supervisor.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loops (each finishes its pass) and close the pool."""
        self.supervisor.stop(timeout)
        self.close()
        emit(log, "timer_stopped", timer=self.name, exit_code=self.supervisor.exit_code)

    def run_forever(self) -> int:
        """Run until SIGTERM/SIGINT or a loop crash; returns the process exit code."""
        self.start()
        while not self.stop_flag.wait(1.0):
            self.supervisor.report_stalls()
        self.stop()
        return self.supervisor.exit_code
