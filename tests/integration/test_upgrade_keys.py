"""Upgrading a database from the 0008 schema: migration 0009 adds the concurrency key to
both sides of the jobs and the kind_key scope to the limits; the jobs and limits already
there read and work as before, and new jobs take keys."""

from __future__ import annotations

import psycopg

from shared.client import Client
from shared.core.states import JobState
from shared.runtime.settings import ClientSettings
from shared.store.migrate import available, migrate
from tests.integration.store.helpers import add_job
from tests.support.drive import db_now

BEFORE = "0008_flow_control.sql"



def test_0009_keeps_jobs_and_limits_and_takes_keys_from_then_on(old_url):
    with psycopg.connect(old_url, autocommit=True) as conn:
        now = db_now(conn)
        pending = add_job(conn, run_at=now, tenant="acme")
        conn.execute("INSERT INTO tock_limits (scope, key, max_running) VALUES ('kind', 'k', 2)")
    names = [name for name, _ in available()]
    assert migrate(old_url) == names[names.index(BEFORE) + 1:]
    client = Client(ClientSettings(database_url=old_url))
    try:
        old = client.get(pending)
        assert (old.state, old.tenant, old.concurrency_key) == (JobState.SCHEDULED, "acme",
                                                                None)
        assert [(lim.scope, lim.key, lim.max_running) for lim in client.limits()] == [
            ("kind", "k", 2)]
        new = client.schedule("k", concurrency_key="acct-1")
        assert client.get(new.id).concurrency_key == "acct-1"
        client.set_limit("kind_key", "k", max_running=1)
        assert {lim.scope for lim in client.limits()} == {"kind", "kind_key"}
    finally:
        client.close()
