"""Process-local Prometheus metrics of the timer and consumers. Cluster-wide gauges (jobs by
state, oldest due age) are computed from Postgres by the dashboard's /metrics, once, not by
every replica."""

import functools
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


@functools.lru_cache(maxsize=4096)
def child(metric: M, *labels: str) -> M:
    """`metric.labels(*labels)`, looked up once: per job, `labels()` costs a lock and a
    few tuple builds. Only for labels of bounded cardinality (kinds, outcomes)."""
    return metric.labels(*labels)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)

DISPATCHED = Counter("tock_jobs_dispatched_total", "Jobs sent to SQS by the timer", ["queue"])
DISPATCH_FAILURES = Counter("tock_dispatch_failures_total",
                            "Job sends SQS refused (the job stays due)", ["queue"])
DUE_TO_DISPATCH = Histogram("tock_due_to_dispatch_seconds",
                            "From run_at to dispatch", buckets=LATENCY_BUCKETS)
IN_SQS = Gauge("tock_dispatch_window_jobs",
               "Jobs of a kind sent to SQS and not yet claimed, as the timer last counted "
               "them (up to TOCK_DISPATCH_WINDOW)", ["kind"])
REDISPATCHED = Counter("tock_jobs_redispatched_total",
                       "Dispatched jobs nobody claimed in time, sent again")
LEASE_EXPIRIES = Counter("tock_lease_expiries_total",
                         "Running jobs whose worker stopped heartbeating", ["outcome"])

DUE_TO_START = Histogram("tock_due_to_start_seconds", "From run_at to a handler starting",
                         ["kind"], buckets=LATENCY_BUCKETS)
RUN_DURATION = Histogram("tock_job_run_seconds", "Handler run time", ["kind", "outcome"],
                         buckets=RUN_BUCKETS)
OUTCOMES = Counter("tock_job_outcomes_total", "Finished attempts by outcome",
                   ["kind", "outcome"])
RETRIES = Counter("tock_job_retries_total", "Failed attempts that will be retried", ["kind"])
DEAD = Counter("tock_jobs_dead_total", "Jobs that went dead", ["kind"])
STALE_COMPLETIONS = Counter("tock_stale_completions_total",
                            "Results not written because the worker had lost its lease")
MESSAGES_DROPPED = Counter("tock_messages_dropped_total",
                           "Messages that claimed no job", ["reason"])
SQS_ERRORS = Counter("tock_sqs_errors_total", "Failed SQS calls", ["operation"])
LEASES_LOST = Counter("tock_leases_lost_total",
                      "In-flight jobs whose lease a heartbeat found gone")
STUCK_HANDLERS = Gauge("tock_stuck_handlers",
                       "Handlers still running more than a lease past their deadline (their "
                       "job was left to expire; their thread and slot stay busy)", ["kind"])
HANDLER_PROCESSES_REPLACED = Counter(
    "tock_handler_processes_replaced_total",
    "Handler processes (process isolation) killed past their grace, or found dead, and "
    "replaced", ["reason"])
