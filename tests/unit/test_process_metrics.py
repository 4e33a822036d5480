"""Each process's /metrics exports its own metrics, the shared ones and the process and
platform collectors, never the other process's (shared.runtime.metrics.exported_by), though
every metric lives in the one default registry. No services: the probe server runs on a
loopback port with probes that always answer ok."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

# Every module that defines metrics, as one process that imported both sides would have.
import consumer.service  # noqa: F401
import timer_service.service  # noqa: F401
from shared.runtime import metrics
from shared.runtime.health import HealthServer

TIMER_ONLY = {"tock_jobs_dispatched", "tock_dispatch_failures", "tock_due_to_dispatch_seconds",
              "tock_dispatch_window_jobs", "tock_dispatch_paced_tenants", "tock_jobs_redispatched",
              "tock_lease_expiries",
              "tock_schedule_fires", "tock_schedule_slots_audited", "tock_history_moved",
              "tock_history_partitions_expired", "tock_retention_pruned"}
CONSUMER_ONLY = {"tock_due_to_start_seconds", "tock_job_run_seconds", "tock_job_outcomes",
                 "tock_job_retries", "tock_jobs_dead", "tock_stale_completions",
                 "tock_messages_dropped", "tock_leases_lost", "tock_stuck_handlers",
                 "tock_handler_processes_replaced"}
SHARED = {"tock_sqs_errors", "tock_sqs_requests"}


def _ok() -> tuple[bool, str]:
    return True, "fine"


@pytest.fixture
def scrape() -> Iterator[object]:
    servers: list[HealthServer] = []

    def run(process: str) -> set[str]:
        server = HealthServer(0, live=_ok, ready=_ok, host="127.0.0.1",
                              process=process).start()
        servers.append(server)
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as res:
            assert res.status == 200
            text = res.read().decode()
        return {family.name for family in text_string_to_metric_families(text)}
    yield run
    for server in servers:
        server.close()


def test_every_tock_metric_has_an_owner() -> None:
    registered = {family.name for family in REGISTRY.collect()
                  if family.name.startswith("tock_")}
    owned = [*metrics.OWNED.values(), metrics.SHARED_FAMILIES]
    unowned = {name for name in registered if not any(name in names for names in owned)}
    assert not unowned, f"add these to TIMER_/CONSUMER_/SHARED_METRICS: {sorted(unowned)}"
    assert not metrics.OWNED["timer"] & metrics.OWNED["consumer"]
    assert metrics.OWNED == {"timer": TIMER_ONLY, "consumer": CONSUMER_ONLY}
    assert metrics.SHARED_FAMILIES == SHARED
    assert registered == TIMER_ONLY | CONSUMER_ONLY | SHARED


def test_the_timer_exports_its_own_metrics_and_no_consumer_ones(scrape) -> None:
    names = scrape("timer")
    assert names >= TIMER_ONLY | SHARED
    assert not names & CONSUMER_ONLY
    assert {"process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= names


def test_the_consumer_exports_its_own_metrics_and_no_timer_ones(scrape) -> None:
    names = scrape("consumer")
    assert names >= CONSUMER_ONLY | SHARED
    assert not names & TIMER_ONLY
    assert {"process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= names


def test_counting_is_unchanged_and_shows_where_it_belongs(scrape) -> None:
    metrics.LEASES_LOST.inc()
    metrics.REDISPATCHED.inc()
    assert REGISTRY.get_sample_value("tock_leases_lost_total") >= 1
    assert "tock_leases_lost" in scrape("consumer")
    assert "tock_jobs_redispatched" in scrape("timer")


def test_a_process_of_another_name_exports_everything(scrape) -> None:
    assert scrape("tock") >= TIMER_ONLY | CONSUMER_ONLY | SHARED


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_a_plain_405_and_head_the_headers(method) -> None:
    server = HealthServer(0, live=_ok, ready=_ok, host="127.0.0.1", process="timer").start()
    try:
        url = f"http://127.0.0.1:{server.port}/healthz"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, HEAD"
        assert refused.value.read().decode().startswith(f"{method} not allowed: GET")
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=5) as res:
            assert res.status == 200 and res.read() == b""
    finally:
        server.close()
