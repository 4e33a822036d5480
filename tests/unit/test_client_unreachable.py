"""A producer client whose database cannot be used fails its first call at once with one
error naming the database (password redacted), the cause and the setting to fix, instead
of waiting out the pool's 30 s and logging every retry. And bad input is refused before
any connection is made. No server is needed: the port is closed."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from shared.client import Client
from shared.core.errors import DatabaseUnavailable, InvalidInput
from shared.runtime.settings import ClientSettings
from shared.store.database import Database, redacted


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def client(closed_port: int) -> Iterator[Client]:
    url = f"postgresql://me:secret@127.0.0.1:{closed_port}/tock"
    with Client(ClientSettings(database_url=url)) as c:
        yield c


def _refused(client: Client) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as info:
        client.schedule("a.ok", {})
    return str(info.value), time.monotonic() - started


def test_the_first_call_fails_at_once_saying_which_database_why_and_what_to_check(
        client, closed_port, caplog):
    caplog.set_level(logging.DEBUG, logger="psycopg")
    message, took = _refused(client)
    assert took < 5, took
    assert message.startswith(
        f"cannot use the database at postgresql://me:***@127.0.0.1:{closed_port}/tock: ")
    assert "Connection refused" in message
    assert message.endswith("(check TOCK_DATABASE_URL or ClientSettings.database_url)")
    assert "secret" not in message
    # The pool was never started: none of its "error connecting" lines, no retries behind.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert not client.database._opened


def test_every_call_tries_again_and_fails_as_fast(client):
    for _ in range(3):
        message, took = _refused(client)
        assert took < 5 and "Connection refused" in message


def test_callers_waiting_together_share_one_attempt(client, monkeypatch):
    attempts: list[float] = []
    ask = client.database._ask

    def slow_ask() -> str | None:
        attempts.append(time.monotonic())
        time.sleep(0.3)  # a slow connect, so that the 8 callers overlap it
        return ask()

    monkeypatch.setattr(client.database, "_ask", slow_ask)
    errors: list[str] = []

    def call() -> None:
        try:
            client.get(1)
        except DatabaseUnavailable as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 8 and all("Connection refused" in e for e in errors)
    assert len(attempts) == 1, attempts


def test_an_unknown_host_is_named_as_the_cause():
    url = "postgresql://me:secret@no-such-host.invalid:5432/tock"
    with Client(ClientSettings(database_url=url)) as client:
        message, took = _refused(client)
    assert "no-such-host.invalid" in message and "secret" not in message, message
    assert took < 10, took


def test_a_pool_without_a_setting_keeps_the_plain_behaviour(closed_port):
    """The services' pools (no `setting`) are left as they were: they start without
    connecting, and their loops retry (timer, consumer)."""
    db = Database(f"postgresql://127.0.0.1:{closed_port}/tock", timeout=0.2, name="tock-t")
    try:
        db.open()
        assert db._opened
        with pytest.raises(DatabaseUnavailable, match="couldn't get a connection"), \
                db.connection():
            pass
    finally:
        db.close()


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://me:secret@db:5432/tock", "postgresql://me:***@db:5432/tock"),
    ("postgresql://me@db/tock?password=secret&sslmode=require",
     "postgresql://me@db/tock?password=***&sslmode=require"),
    ("host=db user=me password=secret dbname=tock", "host=db user=me password=*** dbname=tock"),
    ("host=db password='s e\\'cret' dbname=tock", "host=db password=*** dbname=tock"),
    ("postgresql://me@db/tock", "postgresql://me@db/tock"),
])
def test_redacted_hides_the_password_in_every_form_libpq_takes(url, shown):
    assert redacted(url) == shown


# --- bad input is refused before anything connects ----------------------------------------


@pytest.mark.parametrize(("jobs", "says"), [
    ([{"payload": {}}], "job #0: kind is missing: every job needs one"),
    ([{"kind": "a", "bogus": 1}], "job #0: unknown job field(s) bogus; known: "),
    ([{"kind": "a", "priority": 99}], "job #0: priority must be between 0 and 9"),
    ([{"kind": "a"}, {"kind": "b", "priority": 99}], "job #1: priority must be between"),
    ([{"kind": "a"}, "email"], "job #1 must be a mapping, got str"),
    ([{"kind": "a", "delay": True}], "job #0: delay must be a number, got True"),
])
def test_schedule_many_numbers_the_job_in_every_message(client, jobs, says):
    with pytest.raises(InvalidInput) as info:
        client.schedule_many(jobs)
    assert str(info.value).startswith(says), str(info.value)


def test_schedule_has_one_job_and_no_number(client):
    with pytest.raises(InvalidInput) as info:
        client.schedule("a", delay=True)
    assert str(info.value) == "delay must be a number, got True"
    with pytest.raises(InvalidInput, match=r"^priority must be between 0 and 9"):
        client.schedule("a", priority=99)


def test_a_url_where_settings_belong_says_what_the_client_takes():
    with pytest.raises(InvalidInput) as refused:
        Client("postgresql://me@db/tock")  # type: ignore[arg-type]
    assert str(refused.value).startswith(
        "Client takes settings, e.g. Client(ClientSettings(database_url=...)) "
        "(shared.runtime.settings), got str, which has no database_url, ")
