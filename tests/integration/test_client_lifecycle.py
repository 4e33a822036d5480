"""A producer client across a fork and after close(): a child forked after the parent's
client made connections gets connections of its own (two processes on one connection read
each other's replies, and a child closing it would end the parent's session), and a
closed client says so instead of looking like a database outage."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from shared.client import Client
from shared.core.errors import DatabaseClosed, Retryable
from shared.runtime.settings import ClientSettings


def _child(client: Client, n: int, out: Any) -> None:
    try:
        for i in range(n):
            job = client.schedule("fork.child", {"i": i})
            assert job.payload == {"i": i}, job
        client.close()  # must leave the parent's connections alone
        out.put("ok")
    except BaseException as exc:  # reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_uses_connections_of_its_own(database_url, db):
    with Client(ClientSettings(database_url=database_url)) as client:
        client.schedule("warm")  # the parent's pool holds a connection now
        parent_backends = {r[0] for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'tock-client'")}
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        children = [ctx.Process(target=_child, args=(client, 50, out)) for _ in range(3)]
        for p in children:
            p.start()
        for i in range(50):  # the parent goes on using its pool meanwhile
            assert client.schedule("fork.parent", {"i": i}).payload == {"i": i}
        results = [out.get(timeout=60) for _ in children]
        for p in children:
            p.join(10)
        assert results == ["ok"] * 3, results
        # The parent's own sessions survived the children (their close() included).
        alive = {r[0] for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'tock-client'")}
        assert parent_backends <= alive
        assert client.schedule("after").created
    counts = dict(db.execute("SELECT kind, count(*) FROM tock_jobs GROUP BY kind").fetchall())
    assert counts == {"warm": 1, "fork.parent": 50, "fork.child": 150, "after": 1}


def test_a_closed_client_says_so_and_is_not_retryable(database_url, db):
    client = Client(ClientSettings(database_url=database_url))
    client.schedule("warm")
    client.close()
    for call in (lambda: client.schedule("late"), lambda: client.get(1),
                 lambda: client.recurring("r", "k", every=5)):
        with pytest.raises(DatabaseClosed, match="closed") as info:
            call()
        assert not isinstance(info.value, Retryable)
    assert db.execute("SELECT count(*) FROM tock_jobs WHERE kind = 'late'").fetchone()[0] == 0
    client.close()  # closing twice is fine


def test_a_client_from_the_environment_names_a_mistyped_setting(database_url, monkeypatch,
                                                                caplog):
    """As tock's processes do at start, once per process: TOCK_DATABSE_URL would otherwise
    leave the default database in force without a word."""
    import shared.client

    monkeypatch.setattr(shared.client, "_warned_unknown", False)
    monkeypatch.setenv("TOCK_DATABASE_URL", database_url)
    monkeypatch.setenv("TOCK_DATABSE_URL", "postgresql://somewhere/else")
    with caplog.at_level("WARNING", logger="tock.client"):
        with Client() as client:
            client.schedule("typo.check")
        Client().close()
    warned = [r.getMessage() for r in caplog.records if r.name == "tock.client"]
    assert warned == ["TOCK_DATABSE_URL is set but no tock setting has that name; did you "
                      "mean TOCK_DATABASE_URL?"], warned
