"""The `tock` operator commands against a real Postgres, run in-process through
cli.main.main (the same function the `tock` entry point calls)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid

import psycopg
import pytest

from devstack.ports import free_port
from tests.support.dashboard import make_dead, run_to
from tests.support.history import fill_history


def test_enqueue_list_and_show(tock, db):
    code, out, _ = tock("enqueue", "email", "--payload", '{"to": "a@b"}', "--delay", "600",
                        "--tenant", "acme")
    assert code == 0 and out.startswith("enqueued job 1 (email) on queue default")
    code, out, _ = tock("enqueue", "report", "--key", "r:1", "--json")
    made = json.loads(out)
    assert code == 0 and (made["id"], made["key"], made["created"]) == (2, "r:1", True)
    assert "unique_key" not in made, "named as the HTTP API names it"
    code, out, _ = tock("enqueue", "report", "--key", "r:1", "--json")
    assert (json.loads(out)["id"], json.loads(out)["created"]) == (2, False)
    code, out, _ = tock("enqueue", "report", "--key", "r:1")
    assert code == 0 and "already exists with key 'r:1' (report, scheduled)" in out
    code, out, _ = tock("show", "2", "--json")
    shown = json.loads(out)["job"]
    assert shown["key"] == "r:1" and "created" not in shown, "a read creates nothing"
    code, out, _ = tock("jobs")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ID", "KIND", "QUEUE", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "1"]
    code, out, _ = tock("jobs", "--tenant", "acme", "--json")
    listed = json.loads(out)
    assert [j["id"] for j in listed["jobs"]] == [1] and listed["next_cursor"] is None
    assert listed["jobs"][0]["tenant"] == "acme" and "created" not in listed["jobs"][0]
    code, out, _ = tock("jobs", "--limit", "1")
    assert "more: add --before-id 2" in out
    code, out, _ = tock("jobs", "--limit", "1", "--before-id", "2", "--json")
    assert [j["id"] for j in json.loads(out)["jobs"]] == [1]
    code, out, _ = tock("show", "1")
    assert code == 0 and "Not due until" in out and '"to": "a@b"' in out
    code, out, _ = tock("enqueue", "sync", "--concurrency-key", "acct-1")
    assert code == 0, out
    _, out, _ = tock("show", out.split()[2])
    starts = set()  # where each field's value starts: one column, the longest label's too
    for line in out.splitlines():
        for label in ("queue", "priority", "attempt", "run at", "concurrency key", "created",
                      "payload"):
            if line.startswith(f"  {label} "):
                rest = line[2 + len(label):]
                starts.add(2 + len(label) + len(rest) - len(rest.lstrip(" ")))
    assert len(starts) == 1 and "acct-1" in out, out
    code, out, _ = tock("show", "1", "--json")
    shown = json.loads(out)
    assert shown["job"]["tenant"] == "acme"
    assert shown["explanation"]["summary"].startswith("Not due until")
    # GET /api/jobs/{id}'s shape: attempts beside the job, the explanation with its text.
    assert list(shown) == ["job", "attempts", "explanation"] and shown["attempts"] == []
    assert "attempts" not in shown["job"]
    assert shown["explanation"]["text"].startswith("Not due until")


def test_show_json_gives_the_attempts_as_the_api_does(tock, db, client):
    job = client.schedule("email")
    run_to(db, job.id, "dead", "upstream said no")
    _, out, _ = tock("show", str(job.id), "--json")
    shown = json.loads(out)
    assert [(a["attempt"], a["error"]) for a in shown["attempts"]] == [(1, "upstream said no")]
    assert set(shown["attempts"][0]) == {"attempt", "worker", "started_at", "finished_at",
                                         "outcome", "error", "traceback"}
    assert shown["explanation"]["can_retry"] is True


def test_control_and_bidi_characters_in_job_data_are_shown_as_escapes(tock, db, client):
    # A producer (or a handler's error text) chooses these: printed raw, ESC sequences
    # would clear and rewrite the operator's screen, U+202E reverse what follows.
    key = "k\x1b[2K\x1b[1Astate: succeeded\x07\u202egnp.exe"
    job = client.schedule("email", key=key, tenant="acme")
    # A tenant stored before new tenants were refused such characters.
    db.execute("UPDATE tock_jobs SET last_error = %s, tenant = %s WHERE id = %s",
               ("boom \x1b]0;owned\x07 \u2066x", "acme\x9b", job.id))
    for argv in (("show", str(job.id)), ("jobs",)):
        code, out, _ = tock(*argv)
        assert code == 0
        assert not any(c in out for c in "\x1b\x07\x9b\u202e\u2066"), repr(out)
    _, out, _ = tock("show", str(job.id))
    assert "k\\x1b[2K\\x1b[1Astate: succeeded\\x07\\u202egnp.exe" in out
    assert "acme\\x9b" in out
    _, out, _ = tock("show", str(job.id), "--json")  # JSON escapes them itself
    assert json.loads(out)["job"]["key"] == key


@pytest.mark.parametrize(("argv", "code", "words"), [
    (["enqueue", "bad kind!"], 2, "not a valid kind"),
    (["enqueue", "email", "--payload", "{nope"], 2, "--payload is not JSON"),
    (["enqueue", "email", "--at", "2030-01-01T00:00:00"], 2, "has no timezone"),
    (["enqueue", "email", "--priority", "12"], 2, "between 0 and 9"),
    (["jobs", "--state", "sleeping"], 2, "unknown state 'sleeping'"),
    (["jobs", "--limit", "0"], 2, "between 1 and 500"),
    (["show", "999"], 1, "no job with id 999"),
    (["show", "abc"], 2, "'abc' is not a job id"),
    (["show", "1_000"], 2, "'1_000' is not a job id"),
    (["show", "9223372036854775808"], 2, "job ids are at most 9223372036854775807"),
    (["show", "9223372036854775807"], 1, "no job with id 9223372036854775807"),
    (["cancel", "1", "99999999999999999999"], 2, "argument JOB: job ids are at most"),
    (["jobs", "--before-id", "99999999999999999999"], 2,
     "argument --before-id: job ids are at most 9223372036854775807 (a Postgres bigint)"),
    (["cancel"], 2, "say which jobs to cancel"),
    (["retry", "1", "--state", "dead"], 2, "not both"),
    (["jobs", "--tenant", ""], 2, "argument --tenant: the value is empty"),
    (["jobs", "--state", ""], 2, "argument --state: the value is empty"),
    (["jobs", "--tenant", "\udcff"], 2, "tenant is not valid UTF-8 text: the byte 0xFF"),
    (["enqueue", "email", "--at", "2030-01-01Z"], 2, "2030-01-01T00:00:00Z"),
    (["enqueue", "email", "--payload-file", "/no/such/file.json"], 2, "does not exist"),
])
def test_bad_input_exits_with_meaning(tock, argv, code, words):
    got, out, err = tock(*argv)
    assert got == code
    assert words in out + err


def test_enqueue_a_payload_too_large_for_the_command_line(tock, db, tmp_path, monkeypatch):
    payload = {"blob": "x" * (200 * 1024)}  # the OS refuses one argument over 128 KiB
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload))
    code, out, _ = tock("enqueue", "email", "--payload-file", str(path), "--json")
    assert code == 0
    first = json.loads(out)["id"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    code, out, _ = tock("enqueue", "email", "--payload-file", "-", "--json")
    assert code == 0
    stored = db.execute("SELECT payload FROM tock_jobs WHERE id IN (%s, %s)",
                        (first, json.loads(out)["id"])).fetchall()
    assert [row[0] for row in stored] == [payload, payload]


def test_show_marks_where_a_retry_began(tock, db, client):
    job = client.schedule("flaky")
    for n in (1, 2, 1):  # two attempts, an operator's retry, its first attempt again
        db.execute("INSERT INTO tock_attempts (job_id, attempt, worker, started_at, "
                   "finished_at, outcome, error) VALUES (%s, %s, 'w1', now(), now(), "
                   "'failed', 'boom')", (job.id, n))
    code, out, _ = tock("show", str(job.id))
    assert code == 0
    firsts = [line.split()[0:2] for line in out.splitlines()[-3:]]
    assert firsts == [["1", "failed"], ["2", "failed"], ["1", "(retried)"]], out


def test_show_of_a_job_cancelled_while_running_names_its_worker_not_a_lease(tock, db,
                                                                             client):
    job = client.schedule("email")
    db.execute("UPDATE tock_jobs SET state = 'running', attempt = 1, lease_owner = 'w1', "
               "lease_expires_at = now() + interval '1 min', dispatch_token = "
               "gen_random_uuid(), started_at = now() WHERE id = %s", (job.id,))
    code, out, _ = tock("show", str(job.id))
    assert code == 0 and "  lease " in out and "w1 until" in out
    assert tock("cancel", str(job.id))[0] == 0
    code, out, _ = tock("show", str(job.id))
    assert code == 0 and "[cancelled]" in out, out
    assert "  lease " not in out and "until" not in out, out
    assert "  last worker     w1" in out, out


def test_retry_and_cancel_by_id(tock, db):
    tock("enqueue", "email")
    code, _, err = tock("retry", "1")
    assert code == 1 and "cannot retry job 1: it is scheduled" in err
    code, out, _ = tock("cancel", "1", "--dry-run")
    assert code == 0 and "job 1: would cancel" in out
    code, out, _ = tock("cancel", "1")
    assert code == 0 and out.strip() == "job 1: cancelled"
    code, out, _ = tock("retry", "1", "--json")
    assert code == 0 and json.loads(out)[0]["state"] == "scheduled"
    assert "created" not in json.loads(out)[0] and "key" in json.loads(out)[0]


def test_a_call_that_times_out_waiting_for_a_lock_exits_3_not_refused(
        tock, db, database_url, monkeypatch):
    """A fault walkthrough: a statement or lock timeout exited 1, which the README gives
    to a refusal (not found, not allowed), so a script would not try again. It is a
    database too busy to answer in time: 3, as unavailable, and nothing was written."""
    tock("enqueue", "email")
    monkeypatch.setenv("TOCK_CALL_TIMEOUT_SECONDS", "1")
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM tock_jobs WHERE id = 1 FOR UPDATE")
        code, _, err = tock("cancel", "1")
    assert code == 3, err
    assert "ran longer than the call timeout" in err and "nothing was written" in err
    assert tock("cancel", "1")[0] == 0


def test_a_read_only_database_is_said_to_be_one(tock, pg_server):
    """Up, but taking no writes (a standby, default_transaction_read_only): the URL is
    right, so 'is that server up?' would send the reader the wrong way."""
    url = pg_server.create_database(f"ro_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(url, autocommit=True) as admin:
        name = admin.info.dbname
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    code, _, err = tock("jobs", "--database-url", url)
    assert code == 3, err
    assert "takes no writes: a standby, or default_transaction_read_only is on" in err
    assert "is that server up" not in err


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_a_job_id_given_twice_is_acted_on_once(tock, db, action):
    tock("enqueue", "email")
    tock("enqueue", "email")
    if action == "retry":
        tock("cancel", "1", "2")
    code, out, _ = tock(action, "2", "1", "2", "--dry-run")
    assert code == 0 and out.splitlines() == [f"job 2: would {action}", f"job 1: would {action}"]
    state = "cancelled" if action == "cancel" else "scheduled"
    code, out, err = tock(action, "2", "1", "2")
    assert (code, out.splitlines(), err) == (0, [f"job 2: {state}", f"job 1: {state}"], "")
    code, out, _ = tock(action, "1", "1", "--json")  # the others came first: refused once
    assert code == 1 and json.loads(out) == []


def test_bulk_retry_counts_first_and_needs_confirmation(tock, db):
    for kind in ("flaky", "flaky", "email"):
        tock("enqueue", kind)
    for job_id in (1, 2, 3):
        make_dead(db, job_id)
    code, out, _ = tock("retry", "--state", "dead", "--kind", "flaky", "--dry-run")
    assert code == 0 and out.strip() == "would retry 2 job(s) (state dead, kind flaky)"
    code, _, err = tock("retry", "--state", "dead", "--kind", "flaky")
    assert code == 2 and "pass --yes" in err
    assert db.execute("SELECT count(*) FROM tock_jobs_all WHERE state = 'dead'").fetchone()[0] == 3
    code, out, _ = tock("retry", "--kind", "flaky", "--yes", "--json")
    assert code == 0 and json.loads(out)["count"] == 2
    states = dict(db.execute("SELECT id, state::text FROM tock_jobs_all").fetchall())
    assert states == {1: "scheduled", 2: "scheduled", 3: "dead"}
    code, out, _ = tock("retry", "--all", "--dry-run")  # said with what retry applies to
    assert code == 0 and out.strip() == "would retry 1 job(s) (state dead/cancelled)"
    code, out, _ = tock("cancel", "--all", "--yes")
    assert code == 0 and out.strip() == "cancelled 2 job(s)"


def test_a_time_filter_that_no_job_could_match_is_refused(tock):
    code, _, err = tock("jobs", "--since", "2030-01-01T00:00Z", "--until", "2020-01-01T00:00Z")
    assert code == 2
    assert ("--since 2030-01-01T00:00:00+00:00 is not earlier than --until "
            "2020-01-01T00:00:00+00:00: no job could match") in err


def test_a_bulk_filter_naming_only_states_the_action_cannot_touch_is_refused(tock, db):
    tock("enqueue", "email")
    code, _, err = tock("retry", "--state", "scheduled", "--dry-run")
    assert code == 2
    assert "retry applies to dead and cancelled jobs only; the filter asks for scheduled" in err
    code, _, err = tock("cancel", "--state", "succeeded", "--yes")
    assert code == 2 and "cancel applies to" in err
    # A filter with one state the action applies to counts as before.
    code, out, _ = tock("retry", "--state", "scheduled,dead", "--dry-run")
    assert code == 0 and "would retry 0 job(s)" in out


class _Terminal(io.StringIO):
    """Standard input as a terminal that has reached its end (Ctrl-D)."""

    def isatty(self) -> bool:
        return True


def _interrupt(prompt: str = "") -> str:
    raise KeyboardInterrupt


@pytest.mark.parametrize("key", ["Ctrl-D", "Ctrl-C"])
def test_backing_out_of_the_prompt_changes_nothing(tock, db, monkeypatch, key):
    tock("enqueue", "email")
    monkeypatch.setattr(sys, "stdin", _Terminal(""))
    if key == "Ctrl-C":
        monkeypatch.setattr("builtins.input", _interrupt)
    try:
        code, out, err = tock("cancel", "--kind", "email")
    except KeyboardInterrupt:  # escaping, it would end the test session too
        pytest.fail("Ctrl-C at the prompt escaped as a KeyboardInterrupt")
    assert code == 1 and "Traceback" not in err, err
    assert out.endswith("\nnothing changed\n"), out
    assert db.execute("SELECT state::text FROM tock_jobs").fetchall() == [("scheduled",)]


def test_a_dry_run_past_the_count_cap_says_more_than(tock, db, monkeypatch):
    monkeypatch.setattr("shared.ops.jobs.BULK_COUNT_CAP", 2)
    for _ in range(3):
        tock("enqueue", "flaky")
    for job_id in (1, 2, 3):
        make_dead(db, job_id)
    code, out, _ = tock("retry", "--state", "dead", "--dry-run")
    assert code == 0 and out.strip() == "would retry more than 2 job(s) (state dead)"
    code, _, err = tock("retry", "--state", "dead")
    assert code == 2 and "more than 2 job(s) match" in err


def test_stats_marks_estimated_finished_counts(tock, db):
    fill_history(db, n=25000, state="dead", kind="email")
    db.execute("ANALYZE tock_history_jobs_dead")
    code, out, _ = tock("stats")
    assert code == 0 and "succeeded 0  dead ~25000  cancelled 0" in out
    assert "estimated" in out
    code, out, _ = tock("stats", "--json")
    assert json.loads(out)["estimated"] == ["dead"]


def test_stats_and_workers(tock, db):
    tock("enqueue", "email", "--queue", "mail")
    tock("enqueue", "email", "--queue", "mail", "--delay", "3600")
    db.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency) "
               "VALUES ('w1', 'h', 1, '{mail}', 4)")
    code, out, _ = tock("stats")
    assert code == 0 and out.startswith("scheduled 2  retrying 0")
    assert "mail   email" in out
    code, out, _ = tock("stats", "--json")
    (row,) = json.loads(out)["queues"]
    assert (row["due"], row["future"], row["depth"]) == (1, 1, 1)
    code, out, _ = tock("workers")
    assert code == 0 and "w1" in out and "alive" in out and "0/4" in out


def test_database_down_exits_3_naming_the_cause_and_the_setting(tock):
    port = free_port()
    code, _, err = tock("jobs", "--database-url", f"postgresql://me:secret@127.0.0.1:{port}/x")
    assert code == 3
    assert f"cannot use the database at postgresql://me:***@127.0.0.1:{port}/x" in err
    assert "Connection refused" in err and "TOCK_DATABASE_URL" in err
    assert "secret" not in err


def test_a_url_the_server_refuses_exits_2_not_3(tock, database_url):
    base = database_url.rsplit("/", 1)[0]
    for url, words in [(f"{database_url}?options=-c%20statement_timeout%3Dabc",
                        'invalid value for parameter "statement_timeout"'),
                       (f"{base}/no_such_database_here", "does not exist"),
                       # the test server has no SSL: retrying will not give it one
                       (f"{database_url}?sslmode=require", "SSL was required")]:
        code, _, err = tock("jobs", "--database-url", url)
        assert code == 2, err
        assert "refuses what the URL asks for" in err and words in err
        assert "(fix TOCK_DATABASE_URL or --database-url)" in err


@pytest.mark.parametrize("command", [("schedules", "list"), ("schedules", "show", "x"),
                                     ("schedules", "pause", "x")])
def test_schedule_commands_check_the_database_as_every_command_does(tock, pg_server, command):
    """They used to skip the check: their errors named the Python client's setting
    (ClientSettings.database_url) and an unmigrated database got no `tock migrate` hint."""
    port = free_port()
    code, _, err = tock(*command, "--database-url", f"postgresql://me@127.0.0.1:{port}/x")
    assert code == 3
    assert "(is that server up? TOCK_DATABASE_URL or --database-url says where it is)" in err
    assert "ClientSettings" not in err
    url = pg_server.create_database(f"empty_{uuid.uuid4().hex[:8]}")
    code, _, err = tock(*command, "--database-url", url)
    assert code == 2 and "run `tock migrate` first" in err and "Traceback" not in err


def test_an_unmigrated_database_says_run_migrate_and_migrate_fixes_it(tock, pg_server):
    url = pg_server.create_database(f"empty_{uuid.uuid4().hex[:8]}")
    code, _, err = tock("jobs", "--database-url", url)
    assert code == 2 and "lacks migration(s) 0001_core.sql" in err
    assert "run `tock migrate` first" in err and "Traceback" not in err
    code, out, _ = tock("migrate", "--database-url", url)
    assert code == 0 and "applied" in out
    code, out, _ = tock("jobs", "--database-url", url)
    assert code == 0 and "no jobs match" in out


@pytest.mark.parametrize("command", ["enqueue", "jobs", "show", "retry", "cancel", "stats",
                                     "workers", "dashboard"])
def test_help_for_every_command(tock, command):
    code, out, _ = tock(command, "--help")
    assert code == 0 and out.startswith(f"usage: tock {command}")
    description = out.split("\n\n")[1]
    assert not description.endswith(":") and not description.startswith(
        ("options:", "positional arguments:")), f"{command} has no description"


def test_tock_entry_point_runs_as_a_program(database_url):
    res = subprocess.run([sys.executable, "-m", "cli.main", "stats", "--json",
                          "--database-url", database_url],
                         check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["totals"]["scheduled"] == 0
