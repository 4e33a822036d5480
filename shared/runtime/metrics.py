"""Process-local Prometheus metrics of the timer and consumers. Cluster-wide gauges (jobs by
state, oldest due age) are computed from Postgres by the dashboard's /metrics, once, not by
every replica.

Every metric lives in prometheus_client's default registry, whichever module defines it
(the timer's schedule and retention loops define theirs next to them), so code increments
them as usual. What a process exports is `exported_by(process)`: the default registry less
the metrics another process owns (OWNED, from TIMER_METRICS, TIMER_LOOP_METRICS and
CONSUMER_METRICS), so the timer's /metrics shows no consumer counters stuck at 0 and the
other way round; the shared ones (SHARED_METRICS) and the process and platform collectors
(process_*, python_*) show in both. A new metric belongs in one of these groups
(tests/unit/test_process_metrics.py checks)."""

import functools
from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.transport.sqs import REQUESTS

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
                            "From run_at (or the enqueue, if later) to dispatch",
                            buckets=LATENCY_BUCKETS)
IN_SQS = Gauge("tock_dispatch_window_jobs",
               "Jobs of a kind sent to an SQS queue and not yet claimed, as the timer last "
               "counted them (up to about TOCK_DISPATCH_WINDOW)", ["kind", "queue"])
PACED = Gauge("tock_dispatch_paced_tenants",
              "Tenants of a kind the timer sends to an SQS queue below TOCK_DISPATCH_WINDOW, "
              "because a batch of their jobs waited there past TOCK_DISPATCH_WINDOW_SECONDS "
              "(consumers fell behind on them) in the last few seconds", ["kind", "queue"])
REDISPATCHED = Counter("tock_jobs_redispatched_total",
                       "Dispatched jobs nobody claimed in time, sent again")
LEASE_EXPIRIES = Counter("tock_lease_expiries_total",
                         "Running jobs whose worker stopped heartbeating", ["outcome"])

DUE_TO_START = Histogram("tock_due_to_start_seconds",
                         "From run_at (or the enqueue, if later) to a handler starting",
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


# --- who exports what -------------------------------------------------------------------

TIMER = "timer"
CONSUMER = "consumer"

class _SqsRequests(Collector):
    """`tock_sqs_requests_total`, read from the transport's counts at each scrape (the
    transport sits below this layer and counts in a botocore hook)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "tock_sqs_requests", "HTTP requests sent to SQS by this process, retries "
            "included (what SQS bills)", labels=["operation"])
        for operation, count in sorted(REQUESTS.snapshot().items()):
            family.add_metric([operation], count)
        yield family


REGISTRY.register(_SqsRequests())

SHARED_METRICS = (SQS_ERRORS, "tock_sqs_requests_total")
"""Incremented by both processes: each exports its own count."""
TIMER_METRICS = (DISPATCHED, DISPATCH_FAILURES, DUE_TO_DISPATCH, IN_SQS, PACED, REDISPATCHED,
                 LEASE_EXPIRIES)
CONSUMER_METRICS = (DUE_TO_START, RUN_DURATION, OUTCOMES, RETRIES, DEAD, STALE_COMPLETIONS,
                    MESSAGES_DROPPED, LEASES_LOST, STUCK_HANDLERS, HANDLER_PROCESSES_REPLACED)
TIMER_LOOP_METRICS = ("tock_schedule_fires_total", "tock_schedule_slots_audited_total",
                      "tock_history_moved_total", "tock_history_partitions_expired_total",
                      "tock_retention_pruned_total")
"""Defined by the timer's own loops (timer_service/scheduler.py, retention.py), which this
layer cannot import: by name, as exported."""


def family_names(metrics: Iterable[Counter | Gauge | Histogram | str]) -> frozenset[str]:
    """The metric family names (what a scrape's `# TYPE` line names: a counter's without
    `_total`) of metric objects, or of metric names as exported."""
    names: set[str] = set()
    for metric in metrics:
        if isinstance(metric, str):
            names.add(metric.removesuffix("_total"))
        else:
            names.update(family.name for family in metric.describe())
    return frozenset(names)


SHARED_FAMILIES = family_names(SHARED_METRICS)
OWNED: dict[str, frozenset[str]] = {
    TIMER: family_names((*TIMER_METRICS, *TIMER_LOOP_METRICS)),
    CONSUMER: family_names(CONSUMER_METRICS),
}
"""The metric families only that process exports."""


class ProcessMetrics:
    """A process's view of a registry (by default the default one): every family except
    those another process owns. A process not named in OWNED sees everything."""

    def __init__(self, process: str, source: Collector = REGISTRY) -> None:
        self.process = process
        self.source = source
        others = [names for owner, names in OWNED.items() if owner != process]
        self.hidden: frozenset[str] = (frozenset().union(*others) if process in OWNED
                                       else frozenset())

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if family.name not in self.hidden:
                yield family


def exported_by(process: str) -> ProcessMetrics:
    """What `process` ("timer", "consumer") serves on its /metrics: its own metrics, the
    shared ones and the process and platform collectors."""
    return ProcessMetrics(process)
