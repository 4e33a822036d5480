"""The producer client: enqueue, idempotency, transactions, and bad input refused before
anything is written."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from shared.client import Client
from shared.core.errors import InvalidInput, InvalidTransition, JobNotFound, Retryable
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings


def _count(db) -> int:
    return db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0]


def test_schedule_now_at_and_delay(client, db):
    now_job = client.schedule("email", {"to": "a@example.com"})
    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    at_job = client.schedule("email", at=at)
    delayed = client.schedule("email", delay=timedelta(minutes=5))
    db_now = db.execute("SELECT now()").fetchone()[0]
    assert now_job.state is JobState.SCHEDULED and now_job.payload == {"to": "a@example.com"}
    assert now_job.run_at <= db_now
    assert at_job.run_at == at
    assert timedelta(minutes=4) < delayed.run_at - db_now <= timedelta(minutes=5)
    assert client.get(now_job.id) == now_job


def test_extreme_offsets_are_stored_in_utc(client):
    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=20)))
    assert client.schedule("email", at=at).run_at == at


def test_schedule_with_pinned_clock_computes_run_at_from_it(database_url):
    pinned = datetime(2031, 5, 1, tzinfo=UTC)
    with Client(ClientSettings(database_url=database_url), now=pinned) as client:
        job = client.schedule("email", delay=30)
    assert job.run_at == pinned + timedelta(seconds=30)


def test_idempotent_key_returns_the_existing_job(client, db):
    first = client.schedule("email", {"n": 1}, key="welcome:42")
    second = client.schedule("email", {"n": 2}, key="welcome:42")
    assert first.created and not second.created
    assert second.id == first.id and second.payload == {"n": 1}
    assert second.key == first.unique_key == "welcome:42"  # `key`, as schedule(key=) says
    assert _count(db) == 1


def test_schedule_many_one_round_trip_keeps_order_and_keys(client, db):
    existing = client.schedule("email", key="k2")
    jobs = client.schedule_many([
        {"kind": "a", "payload": 1}, {"kind": "b", "key": "k1"},
        {"kind": "c", "key": "k2"}, {"kind": "d", "priority": 9},
    ])
    assert [j.kind for j in jobs] == ["a", "b", "email", "d"]
    assert jobs[2].id == existing.id and not jobs[2].created
    assert [j.created for j in jobs] == [True, True, False, True]
    assert _count(db) == 4
    assert client.schedule_many([]) == []


def test_enqueue_in_callers_psycopg_transaction_rolls_back(client, database_url, db):
    with psycopg.connect(database_url) as conn:
        client.schedule("email", connection=conn)
        assert conn.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 1
        conn.rollback()
    assert _count(db) == 0
    with psycopg.connect(database_url) as conn:
        job = client.schedule("email", connection=conn)
        conn.commit()
    assert client.get(job.id).kind == "email"


def test_enqueue_in_callers_sqlalchemy_transaction(client, database_url, db):
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            client.schedule("email", connection=conn)
            conn.rollback()
        assert _count(db) == 0
        with Session(engine) as session, session.begin():
            client.schedule("email", connection=session)
        assert _count(db) == 1
    finally:
        engine.dispose()


def test_a_read_only_caller_connection_is_the_callers_error_not_a_retryable_one(
        client, database_url, db):
    # tock replaces its own read-only connections (a standby behind stale DNS); one it
    # was given would refuse the same write however often it were retried.
    existing = client.schedule("email")
    with psycopg.connect(database_url) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(InvalidInput, match="connection= is read-only") as refused:
            client.schedule("email", connection=conn)
        assert not isinstance(refused.value, Retryable) and not conn.closed
        conn.rollback()
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(InvalidInput, match="connection= is read-only"):
            client.cancel(existing.id, connection=conn)
    assert _count(db) == 1 and client.get(existing.id).state == "scheduled"


def test_connection_of_another_kind_is_refused(client, db):
    with pytest.raises(InvalidInput, match="psycopg 3"):
        client.schedule("email", connection=object())
    assert _count(db) == 0


def test_a_connection_in_pipeline_mode_is_refused_before_anything_is_sent(client,
                                                                          database_url, db):
    # Its rows would come only at the pipeline's sync: the job written, but not returned.
    with psycopg.connect(database_url) as conn:
        with conn.pipeline(), pytest.raises(InvalidInput, match="pipeline mode"):
            client.schedule("email", connection=conn)
        with conn.pipeline(), pytest.raises(InvalidInput, match="pipeline mode"):
            client.schedule_many([{"kind": "email"}, {"kind": "sms"}], connection=conn)
        assert conn.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 0
        client.schedule("email", connection=conn)  # the same transaction, after the block
        conn.commit()
    assert _count(db) == 1


def test_a_connection_in_a_failed_transaction_or_closed_is_refused_with_the_way_out(
        client, database_url, db):
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(InvalidInput, match="roll it back, then call again"):
            client.schedule("email", connection=conn)
        conn.rollback()
        client.schedule("email", connection=conn)
        conn.commit()
    with pytest.raises(InvalidInput, match="connection is closed"):
        client.schedule("email", connection=conn)
    assert _count(db) == 1


NAIVE = datetime(2030, 1, 1, 12)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"at": NAIVE}, "timezone-aware"),
    ({"at": "2030-01-01"}, "must be a timezone-aware datetime"),
    ({"delay": -1}, "must not be negative"),
    ({"delay": math.nan}, "must be finite"),
    ({"delay": math.inf}, "must be finite"),
    ({"delay": timedelta(seconds=-5)}, "must not be negative"),
    ({"at": datetime.now(UTC), "delay": 5}, "not both"),
    ({"max_attempts": 0}, "max_attempts must be between"),
    ({"max_attempts": True}, "max_attempts must be an integer"),
    ({"priority": 10}, "priority must be between 0 and 9"),
    ({"priority": -1}, "priority must be between 0 and 9"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"timeout": 0}, "timeout must be from 1 ms to 12 hours, got 0"),
    ({"timeout": 1e-300}, "timeout must be from 1 ms to 12 hours, got 1e-300"),
    ({"at": datetime(2999, 1, 1, tzinfo=UTC)},
     "at must be at most 10 years (3,650 days) from now, as delay= is, got "
     "2999-01-01T00:00:00"),
    ({"timeout": math.inf}, "timeout must be finite"),
    ({"queue": "no spaces"}, "not a valid queue name"),
    ({"key": ""}, "key must be a non-empty string"),
    ({"key": "x" * 300}, "at most 255"),
    ({"tenant": 5}, "tenant must be a non-empty string"),
])
def test_bad_options_are_refused_before_anything_is_written(client, db, kwargs, message):
    with pytest.raises(InvalidInput) as refused:
        client.schedule("email", {}, **kwargs)
    assert message in str(refused.value)
    assert _count(db) == 0


@pytest.mark.parametrize(("kind", "message"), [
    ("", "non-empty"),
    (None, "non-empty"),
    ("has space", "not a valid kind"),
    ("9starts-with-digit", "not a valid kind"),
    ("x" * 200, "not a valid kind"),
])
def test_bad_kinds_are_refused(client, db, kind, message):
    with pytest.raises(InvalidInput, match=message):
        client.schedule(kind)
    assert _count(db) == 0


@pytest.mark.parametrize(("payload", "message"), [
    ({"x": math.nan}, "not JSON"),
    ({"x": math.inf}, "is infinite"),
    ({"x": object()}, "not JSON"),
    ({1, 2}, "not JSON"),
    ({"x": "a\x00b"}, "NUL"),
])
def test_bad_payloads_are_refused(client, db, payload, message):
    with pytest.raises(InvalidInput, match=message):
        client.schedule("email", payload)
    assert _count(db) == 0


def test_a_payload_comes_back_as_jsonb_keeps_it(client):
    # README, the payload row: the same values; -0.0 as 0.0 (numeric has no negative zero)
    payload = {"zero": -0.0, "big": 2**62, "nested": {"b": [1.5, None, True], "a": "x"}}
    stored = client.get(client.schedule("email", payload).id).payload
    assert stored == payload
    assert math.copysign(1.0, stored["zero"]) == 1.0


def test_oversized_payload_is_refused(database_url, db):
    with Client(ClientSettings(database_url=database_url, max_payload_bytes=100)) as client:
        with pytest.raises(InvalidInput, match="over the limit of 100"):
            client.schedule("email", {"blob": "x" * 200})
        client.schedule("email", {"blob": "x" * 10})
    assert _count(db) == 1


def test_one_bad_item_in_schedule_many_writes_nothing(client, db):
    with pytest.raises(InvalidInput, match="job #1: priority"):
        client.schedule_many([{"kind": "a"}, {"kind": "b", "priority": 99}])
    with pytest.raises(InvalidInput, match="unknown job field"):
        client.schedule_many([{"kind": "a", "prio": 1}])
    assert _count(db) == 0


def test_get_cancel_retry_errors_are_typed(client):
    with pytest.raises(JobNotFound):
        client.get(999_999)
    with pytest.raises(InvalidInput):
        client.get(0)
    job = client.schedule("email")
    assert client.cancel(job.id).state is JobState.CANCELLED
    with pytest.raises(InvalidTransition, match="it is cancelled"):
        client.cancel(job.id)
    again = client.retry(job.id)
    assert again.state is JobState.SCHEDULED and again.attempt == 0
    with pytest.raises(InvalidTransition, match="only dead or cancelled"):
        client.retry(job.id)
