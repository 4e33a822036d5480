"""`tock migrate`: its help says what it does, `--dry-run` lists the applied and pending
migrations without applying any, and an upgrade past the history migration says what
happens next. Against the session's real Postgres, each test on a database of its own."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

from shared.store.migrate import MigrationBlocked, available, migrate, missing_migrations
from tests.support.wait import wait_for

SHIPPED = [name for name, _ in available()]
BEFORE_HISTORY = "0006_worker_leases.sql"


@pytest.fixture
def empty_url(pg_server: Any) -> str:
    return str(pg_server.create_database(f"migrate_{uuid.uuid4().hex[:8]}"))


def _listed(out: str, status: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith(f"{status} ")]


def test_help_says_what_it_does_and_that_it_is_safe_to_rerun(tock):
    code, out, _ = tock("migrate", "--help")
    assert code == 0 and out.startswith("usage: tock migrate")
    text = " ".join(out.split())
    for words in ("Apply the database migrations", "idempotent and safe to re-run",
                  "--dry-run", "0007_history.sql", "in the background",
                  "in bounded batches", "TOCK_RETENTION_BATCH_SIZE"):
        assert words in text, words


def test_dry_run_on_an_empty_database_lists_everything_pending_and_applies_nothing(
        tock, empty_url):
    code, out, err = tock("migrate", "--dry-run", "--database-url", empty_url)
    assert code == 0, err
    assert _listed(out, "pending") == SHIPPED and _listed(out, "applied") == []
    assert f"0 applied, {len(SHIPPED)} pending: `tock migrate` applies them" in out
    assert missing_migrations(empty_url) == SHIPPED
    with psycopg.connect(empty_url) as conn:
        row = conn.execute("SELECT to_regclass('tock_migrations')").fetchone()
    assert row == (None,), "a dry run created nothing, not even tock_migrations"


def test_an_upgrade_past_the_history_migration_lists_then_applies_and_says_what_next(
        tock, empty_url):
    migrate(empty_url, up_to=BEFORE_HISTORY)
    done = SHIPPED[:SHIPPED.index(BEFORE_HISTORY) + 1]
    code, out, _ = tock("migrate", "--list", "--database-url", empty_url)
    assert code == 0
    assert _listed(out, "applied") == done
    assert _listed(out, "pending") == SHIPPED[len(done):]
    assert missing_migrations(empty_url) == SHIPPED[len(done):], "nothing applied"

    code, out, _ = tock("migrate", "--database-url", empty_url)
    assert code == 0
    assert f"applied {len(SHIPPED) - len(done)} migration(s): 0007_history.sql" in out
    assert "next: a timer of this version moves the finished jobs" in out
    assert len(out.splitlines()) == 2

    code, out, _ = tock("migrate", "--database-url", empty_url)
    assert code == 0 and out == "applied 0 migration(s); database is up to date\n"
    code, out, _ = tock("migrate", "--dry-run", "--database-url", empty_url)
    assert code == 0 and _listed(out, "applied") == SHIPPED and _listed(out, "pending") == []
    assert out.endswith(f"{len(SHIPPED)} applied, 0 pending: the database is up to date\n")


def test_json_lists_and_applies_for_scripts(tock, empty_url):
    migrate(empty_url, up_to=BEFORE_HISTORY)
    done = SHIPPED[:SHIPPED.index(BEFORE_HISTORY) + 1]
    code, out, _ = tock("migrate", "--dry-run", "--json", "--database-url", empty_url)
    assert code == 0 and json.loads(out) == {"applied": done, "pending": SHIPPED[len(done):],
                                             "not_shipped": []}
    code, out, _ = tock("migrate", "--json", "--database-url", empty_url)
    assert code == 0 and json.loads(out) == {"applied": SHIPPED[len(done):],
                                             "moves_history": True}
    code, out, _ = tock("migrate", "--json", "--database-url", empty_url)
    assert code == 0 and json.loads(out) == {"applied": [], "moves_history": False}


def test_a_fresh_install_has_nothing_to_move(tock, empty_url):
    code, out, _ = tock("migrate", "--database-url", empty_url)
    assert code == 0 and f"applied {len(SHIPPED)} migration(s)" in out
    assert "next:" not in out


def test_dry_run_names_a_migration_of_a_newer_version(tock, database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tock_migrations (name) VALUES ('9999_future.sql')")
    code, out, _ = tock("migrate", "--dry-run", "--database-url", database_url)
    assert code == 0
    assert "applied  9999_future.sql  (not shipped with this version of tock)" in out
    assert _listed(out, "pending") == []


def test_dry_run_of_an_unreachable_database_exits_3(tock):
    code, _, err = tock("migrate", "--dry-run", "--database-url",
                        "postgresql://nobody@127.0.0.1:1/none")
    assert code == 3 and "Traceback" not in err


def test_a_bad_url_given_as_the_option_is_blamed_on_the_option(tock):
    code, _, err = tock("migrate", "--database-url", "garbage")
    assert code == 2 and "argument --database-url: 'garbage' is not a Postgres" in err
    assert "TOCK_DATABASE_URL" not in err
    code, _, err = tock("migrate", "--database-url", "")
    assert code == 2 and "argument --database-url: the value is empty" in err


BEFORE_FAIR_INDEX = "0013_cancelled_attempts.sql"
"""0014 rebuilds an index on tock_jobs: it needs a lock no reader may share."""


def test_a_migration_behind_a_long_transaction_does_not_hold_writers_up(empty_url):
    """A migration waiting for its lock behind a long transaction used to queue every
    write to tock_jobs behind it (10 s insert timeouts in a walkthrough, until the long
    transaction ended); it now rolls back after its lock timeout, says who holds the
    table, and tries again."""
    migrate(empty_url, up_to=BEFORE_FAIR_INDEX)
    heard: list[tuple[str, str]] = []
    done: list[list[str]] = []
    with psycopg.connect(empty_url) as long_reader, \
            psycopg.connect(empty_url, autocommit=True) as writer:
        long_reader.execute("SELECT count(*) FROM tock_jobs")  # its transaction stays open
        runner = threading.Thread(target=lambda: done.append(migrate(
            empty_url, lock_timeout=0.2, waiting=lambda name, who: heard.append((name, who)))))
        runner.start()
        wait_for(lambda: len(heard) >= 2, timeout=30, message="the migration to retry")
        writer.execute("SET statement_timeout = '5s'")
        writer.execute("INSERT INTO tock_jobs (kind, run_at) VALUES ('k', now())")
        assert heard[0][0] == "0014_fair_index_by_queue.sql"
        assert "oldest open transactions: pid" in heard[0][1]
        assert "SELECT count(*) FROM tock_jobs" in heard[0][1], heard[0][1]
        assert not done, "still waiting for the long transaction"
        long_reader.rollback()
        runner.join(30)
    assert done == [SHIPPED[SHIPPED.index(BEFORE_FAIR_INDEX) + 1:]]


def test_a_migration_that_never_gets_its_lock_gives_up_naming_the_holder(empty_url):
    migrate(empty_url, up_to=BEFORE_FAIR_INDEX)
    with psycopg.connect(empty_url) as long_reader:
        long_reader.execute("SELECT count(*) FROM tock_jobs")
        with pytest.raises(MigrationBlocked, match="could not take its locks within 1 s") as info:
            migrate(empty_url, lock_timeout=0.2, give_up_after=1)
        assert "SELECT count(*) FROM tock_jobs" in str(info.value)
    assert missing_migrations(empty_url) == SHIPPED[SHIPPED.index(BEFORE_FAIR_INDEX) + 1:]


def test_a_migration_whose_connection_is_cut_while_it_waits_says_so_and_exits_3(
        tock, empty_url):
    """The retry loop meets a lost connection (the server restarted, an operator ended the
    session): one line naming the database, exit 3, nothing half applied."""
    migrate(empty_url, up_to=BEFORE_FAIR_INDEX)
    result: list[tuple[int, str, str]] = []
    with psycopg.connect(empty_url) as long_reader, \
            psycopg.connect(empty_url, autocommit=True) as admin:
        long_reader.execute("SELECT count(*) FROM tock_jobs")
        runner = threading.Thread(target=lambda: result.append(tock(
            "migrate", "--lock-timeout", "0.2", "--database-url", empty_url)))
        runner.start()
        migrating = ("SELECT pid FROM pg_stat_activity WHERE application_name = "
                     "'tock-migrate' AND datname = current_database()")
        wait_for(lambda: admin.execute(migrating).fetchall(), timeout=30,
                 message="the migration to start")
        wait_for(lambda: len(result) or admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name "
            "= 'tock-migrate' AND datname = current_database()").fetchall(), timeout=30,
            message="the migration's session ended")
        runner.join(60)
        long_reader.rollback()
    (code, _, err), = result
    assert code == 3, err
    assert "Traceback" not in err and "database unavailable" in err, err
    assert missing_migrations(empty_url) == SHIPPED[SHIPPED.index(BEFORE_FAIR_INDEX) + 1:]
