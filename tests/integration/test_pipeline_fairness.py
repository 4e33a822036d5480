"""Fair share between tenants, from the timer's side: one tenant's backlog does not queue
the others behind it, weights set the split, capacity a light tenant leaves over is used,
priority stays above fairness, and with more tenants than a batch has slots every tenant
is reached in turn. Real timer code, real Postgres, real SQS (LocalStack); due times are
pinned through `now=`."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from shared.store.flow_store import FlowStore
from timer_service.service import Timer


def _backlog(db, n: int, tenant: str | None, *, now, priority: int = 0, age: float = 60):
    """`n` due jobs of one tenant, the oldest `age` seconds overdue."""
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, tenant, priority)
        SELECT 'k', 'scheduled', %s - make_interval(secs => %s - g * 0.0001), '{}', %s, %s
        FROM generate_series(1, %s) g
    """, (now, age, tenant, priority, n))


def _dispatched(db) -> Counter[str]:
    return Counter(dict(db.execute("""
        SELECT coalesce(tenant, ''), count(*) FROM tock_jobs WHERE state = 'dispatched'
        GROUP BY 1""").fetchall()))


def _timer(timer_settings, transport, batch: int = 100) -> Timer:
    return Timer(timer_settings.model_copy(update={"batch_size": batch}), transport)


def test_a_big_backlog_does_not_hold_back_a_small_tenant(db, timer_settings, transport, clock):
    now = clock.now
    _backlog(db, 20_000, "big", now=now, age=3600)  # an hour of backlog, all older
    _backlog(db, 100, "small", now=now, age=1)
    timer = _timer(timer_settings, transport)
    try:
        for _ in range(2):
            assert timer.run_once(now).dispatched == 100
        assert _dispatched(db) == {"big": 100, "small": 100}
    finally:
        timer.close()


def test_weights_set_each_tenants_share(db, database, timer_settings, transport, clock):
    now = clock.now
    for tenant in ("gold", "bronze"):
        _backlog(db, 500, tenant, now=now)
    FlowStore(database).set_tenant_weight("gold", 3)
    timer = _timer(timer_settings, transport)
    try:
        timer.run_once(now)
        assert _dispatched(db) == {"gold": 75, "bronze": 25}
    finally:
        timer.close()


def test_what_a_light_tenant_leaves_over_goes_to_the_others(db, timer_settings, transport,
                                                            clock):
    now = clock.now
    _backlog(db, 500, "heavy", now=now)
    _backlog(db, 10, "light", now=now)
    _backlog(db, 500, None, now=now)  # jobs without a tenant share as one more tenant
    timer = _timer(timer_settings, transport)
    try:
        assert timer.run_once(now).dispatched == 100, "the batch is always filled"
        served = _dispatched(db)
        assert served["light"] == 10
        assert served["heavy"] + served[""] == 90 and abs(served["heavy"] - served[""]) <= 2
    finally:
        timer.close()


def test_priority_is_served_before_fairness(db, timer_settings, transport, clock):
    now = clock.now
    _backlog(db, 30, "urgent", now=now, priority=9, age=1)
    _backlog(db, 500, "a", now=now)
    _backlog(db, 500, "b", now=now)
    timer = _timer(timer_settings, transport)
    try:
        timer.run_once(now)
        assert _dispatched(db) == {"urgent": 30, "a": 35, "b": 35}
    finally:
        timer.close()


def test_with_more_tenants_than_slots_every_tenant_is_reached_in_turn(
        db, timer_settings, transport, clock):
    now = clock.now
    for i in range(25):
        _backlog(db, 3, f"t{i:02}", now=now)
    timer = _timer(timer_settings, transport, batch=10)
    try:
        for _ in range(3):
            assert timer.run_once(now).dispatched == 10
        served = _dispatched(db)
        assert len(served) == 25, "25 tenants reached in ceil(25 / 10) passes"
        assert max(served.values()) == 2, "the first five were reached twice, none more"
    finally:
        timer.close()


def test_future_jobs_of_a_tenant_are_not_dispatched_early(db, timer_settings, transport,
                                                         clock):
    now = clock.now
    _backlog(db, 5, "later", now=now + timedelta(seconds=60), age=0.5)
    _backlog(db, 5, "now", now=now)
    timer = _timer(timer_settings, transport)
    try:
        timer.run_once(now)
        assert _dispatched(db) == {"now": 5}
    finally:
        timer.close()
