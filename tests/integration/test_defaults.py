"""The defaults of the design tock follows, each shown with an injected clock: missed
recurring runs coalesce into one, retries never come at once, equal jobs run in order,
unknown kinds can be refused at enqueue, and leases may be shorter than a second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from consumer.tasks import Registry
from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from shared.client import Client
from shared.core.errors import InvalidInput
from shared.core.states import AttemptOutcome, JobState
from shared.runtime.settings import ClientSettings
from tests.support.drive import Clock, db_now, dispatch, make_consumer, receive, run_all
from timer_service.service import Timer

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def test_missed_runs_coalesce_into_one_then_the_grid_goes_on(client, db, transport,
                                                             timer_settings):
    client.recurring("every-5", "report", every=300, now=T0)  # misfire left at its default
    timer = Timer(timer_settings, transport)
    timer.scheduler.lookahead = timedelta(0)
    try:
        assert timer.run_once(now=T0 + 5 * MIN).fired == 1  # 12:05 on time
        back = T0 + 5 * MIN + 3.5 * 5 * MIN  # every timer down for 3.5 periods: 12:22:30
        assert timer.run_once(now=back).fired == 1, "one run on recovery"
        keys = [r[0] for r in db.execute(
            "SELECT unique_key FROM tock_jobs WHERE schedule_name = 'every-5' ORDER BY id")]
        assert keys == ["every-5:2026-06-01T12:05:00Z", "every-5:2026-06-01T12:20:00Z"]
        (event,) = client.schedule_history("every-5")
        assert (event.reason, event.slot_count) == ("missed", 2)  # 12:10, 12:15 coalesced
        assert timer.run_once(now=back + MIN).fired == 0
        assert timer.run_once(now=T0 + 25 * MIN).fired == 1, "then on the grid: 12:25"
    finally:
        timer.close()


def test_jobs_of_one_priority_and_run_at_are_claimed_in_id_order(client, db, timer_settings,
                                                                 transport):
    at = db_now(db) - timedelta(seconds=5)
    ids = [client.schedule("k", at=at).id for _ in range(6)]
    timer = Timer(timer_settings.model_copy(update={"batch_size": 2}), transport)
    try:
        order = []
        for _ in range(3):
            timer.run_once()
            order.append(sorted(r[0] for r in db.execute(
                "SELECT id FROM tock_jobs WHERE state = 'dispatched'")))
        assert order == [ids[:2], ids[:4], ids]
    finally:
        timer.close()


def test_the_first_retry_waits_at_least_half_the_backoff_step(client, timer_settings,
                                                               transport, consumer_settings,
                                                               db):
    registry = Registry()
    registry.add("fails", lambda payload, ctx: 1 / 0)
    clock = Clock(db_now(db) + timedelta(seconds=2))
    consumer = make_consumer(consumer_settings.model_copy(update={
        "backoff_base_seconds": 4, "backoff_cap_seconds": 3600}), registry, transport, clock)
    timer = Timer(timer_settings, transport)
    try:
        jobs = client.schedule_many([{"kind": "fails"} for _ in range(8)])
        dispatch(timer, clock.now)
        run_all(consumer, receive(consumer, 8))
        delays = [(client.get(j.id).run_at - clock.now).total_seconds() for j in jobs]
        assert all(2 <= d <= 4 for d in delays), delays
    finally:
        consumer.close()
        timer.close()


def test_reject_unknown_kinds_refuses_a_kind_no_consumer_has(database_url, db, transport,
                                                             consumer_settings, monkeypatch):
    registry = Registry()
    registry.add("known", lambda payload, ctx: None)
    consumer = make_consumer(consumer_settings, registry, transport)
    consumer.pipe.store.heartbeat(consumer.pipe.announcement(), [], 30)  # its heartbeat
    strict = Client(ClientSettings(database_url=database_url, reject_unknown_kinds=True))
    lenient = Client(ClientSettings(database_url=database_url))
    try:
        assert strict.schedule("known").created
        with pytest.raises(InvalidInput, match=r"kind 'brand.new'.*known kinds: known"):
            strict.schedule("brand.new")
        with pytest.raises(InvalidInput, match=r"brand\.new"):
            strict.recurring("r", "brand.new", every=60)
        assert lenient.schedule("brand.new").created, "off by default"
        monkeypatch.setenv("TOCK_REJECT_UNKNOWN_KINDS", "1")
        app = create_app(DashboardSettings(database_url=database_url,
                                           dashboard_operator_token="o" * 20))
        with TestClient(app, base_url="http://localhost",
                        headers={"Authorization": "Bearer " + "o" * 20}) as api:
            refused = api.post("/api/jobs", json={"kind": "brand.new"})
            assert refused.status_code == 400 and "known kinds: known" in refused.text
            assert api.post("/api/jobs", json={"kind": "known"}).status_code == 201
        assert db.execute("SELECT count(*) FROM tock_jobs WHERE kind = 'brand.new'"
                          ).fetchone()[0] == 1  # only the lenient one
    finally:
        strict.close()
        lenient.close()
        consumer.close()


def test_a_lease_shorter_than_a_second_is_kept_by_heartbeats_and_then_rescued(
        client, db, timer_settings, transport, consumer_settings):
    registry = Registry()
    registry.add("quick", lambda payload, ctx: None)
    clock = Clock(db_now(db) + timedelta(seconds=2))
    consumer = make_consumer(consumer_settings.model_copy(update={
        "lease_seconds": 0.2, "heartbeat_seconds": 0.05}), registry, transport, clock)
    timer = Timer(timer_settings, transport)
    try:
        job = client.schedule("quick", max_attempts=2)
        dispatch(timer, clock.now)
        receive(consumer, 1)
        for _ in range(5):  # 5 beats 0.15 s apart: 0.75 s on a 0.2 s lease
            clock.advance(0.15)
            assert consumer.heartbeat_once() == (1, 0)
            assert timer.run_once(clock.now).rescued == 0
        assert timer.run_once(clock.now + timedelta(seconds=0.25)).rescued == 1
        rescued = client.get(job.id, with_attempts=True)
        assert rescued.state is JobState.RETRYING
        assert [a.outcome for a in rescued.attempts] == [AttemptOutcome.LEASE_EXPIRED]
    finally:
        consumer.close()
        timer.close()


def test_a_heartbeat_of_half_the_lease_is_refused():
    from shared.core.errors import ConfigError
    from shared.runtime.settings import ConsumerSettings

    with pytest.raises(ConfigError, match="under half"):
        ConsumerSettings.load(lease_seconds=0.2, heartbeat_seconds=0.1)
    assert ConsumerSettings.load(lease_seconds=0.2, heartbeat_seconds=0.09).lease_seconds == 0.2
