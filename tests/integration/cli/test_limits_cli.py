"""`tock limits`: concurrency and rate limits set, listed and removed from the command
line, and bad ones refused with the reason, against a real Postgres."""

from __future__ import annotations

import json

from devstack.ports import free_port


def test_set_list_and_remove(tock, db):
    db.execute("""INSERT INTO tock_jobs (kind, state, run_at, payload, tenant)
                  SELECT 'email', s::tock_job_state, now() - interval '1 minute', '{}', NULL
                  FROM unnest(ARRAY['running', 'scheduled', 'scheduled']) s""")
    code, out, _ = tock("limits", "set", "kind", "email", "--max-running", "5")
    assert code == 0 and out.splitlines()[1].split() == ["kind", "email", "1/5", "-", "-", "2"]
    code, out, _ = tock("limits", "set", "tenant", "--no-tenant", "--rate", "100", "--per",
                        "60", "--json")
    limit = json.loads(out)
    # As GET /api/limits names them: the jobs without a tenant are the key null.
    assert (limit["scope"], limit["key"], limit["burst"]) == ("tenant", None, 2)
    assert abs(limit["rate_per_second"] - 100 / 60) < 1e-9
    assert set(limit) == {"scope", "key", "max_running", "in_flight", "keys_at_limit",
                          "lingering", "rate_per_second", "burst", "tokens",
                          "seconds_to_next_token", "waiting", "waiting_more"}
    assert [x["key"] for x in json.loads(tock("limits", "--json")[1])] == ["email", None]
    code, out, _ = tock("limits")
    lines = out.splitlines()
    assert lines[0].split() == ["SCOPE", "KEY", "RUNNING/MAX", "RATE", "TOKENS", "WAITING"]
    assert lines[2].split()[:5] == ["tenant", "(no", "tenant)", "-", "1.67/s"]
    tock("limits", "set", "kind", "report", "--rate", "1", "--per", "3600")
    [report] = [r.split() for r in tock("limits")[1].splitlines() if "report" in r]
    assert report[3] == "1/h"  # not 0.000277778/s
    # What the list shows can be typed back.
    tock("limits", "set", "kind", "report", "--rate", "30/min")
    [report] = [r.split() for r in tock("limits")[1].splitlines() if "report" in r]
    assert report[3] == "30/min"
    tock("limits", "remove", "kind", "report")
    assert tock("limits", "remove", "kind", "email")[1] == "kind email: limit removed\n"
    assert tock("limits", "remove", "tenant", "--no-tenant")[0] == 0
    assert "no limits" in tock("limits", "list")[1]


def test_bad_limits_are_refused_with_the_reason(tock):
    for argv, says in (
            (["kind", "email"], "give --max-running N, --rate R (per --per SECONDS"),
            (["kind", "email", "--max-running", "-1"], "max_running must be between 0"),
            (["kind", "email", "--burst", "3"], "burst needs a rate"),
            (["kind", "email", "--per", "60"], "per needs a rate"),
            (["kind", "email", "--max-running", "2", "--per", "60"], "per needs a rate"),
            (["kind", "email", "--rate", "0"], "rate must be > 0"),
            (["kind", "email", "--rate", "10/day"], "the period after '/' is one of s, min, h"),
            (["kind", "email", "--rate", "ten/min"], "is not a number, or a number per s"),
            (["kind", "email", "--rate", "10/min", "--per", "60"],
             "give the rate's period once"),
            (["kind", "email", "--rate", "5", "--per", "0"], "per must be > 0 s"),
            (["kind", "email", "--rate", "1e-300"], "rate must be at least 1 per day"),
            (["kind", "email", "--rate", "0.5", "--per", "86400"],
             "rate must be at least 1 per day"),
            (["kind", "bad kind!", "--max-running", "1"], "is not a valid kind"),
            (["kind", "--no-tenant", "--max-running", "1"], "--no-tenant goes with"),
            (["tenant", "--max-running", "1"], "give a KEY or --no-tenant"),
            (["queue", "x", "--max-running", "1"], "invalid choice: 'queue'"),
            (["kind", "email", "--max-running", "many"], "'many' is not an integer"),
            (["kind", "email", "--max-running", " 5"], "' 5' is not an integer")):
        code, _, err = tock("limits", "set", *argv)
        assert code == 2 and says in err, (argv, err)


def test_a_per_key_limit_from_the_command_line(tock, db):
    code, out, _ = tock("enqueue", "sync", "--concurrency-key", "acct-1")
    assert code == 0, out
    job_id = int(out.split()[2])
    db.execute("UPDATE tock_jobs SET state = 'running' WHERE id = %s", (job_id,))
    tock("enqueue", "sync", "--concurrency-key", "acct-1")
    code, out, _ = tock("limits", "set", "kind_key", "sync", "--max-running", "1")
    assert code == 0 and "1 (1 key full)/1 per key" in out, out
    code, out, _ = tock("show", str(job_id))
    assert "concurrency key" in out and "acct-1" in out, out
    code, _, err = tock("limits", "set", "kind_key", "sync", "--rate", "2")
    assert code == 2 and "takes max_running only" in err
    assert tock("limits", "remove", "kind_key", "sync")[1] == "kind_key sync: limit removed\n"


def test_a_set_that_replaces_a_limit_says_what_it_no_longer_has(tock):
    assert tock("limits", "set", "kind", "report", "--max-running", "2")[0] == 0
    code, _, err = tock("limits", "set", "kind", "report", "--rate", "10", "--per", "60")
    assert code == 0
    assert err.startswith("tock: note: this replaced the limit, which no longer has max "
                          "running 2; give every part of a limit in one set\n")
    code, _, err = tock("limits", "set", "kind", "report", "--rate", "5", "--max-running", "1")
    assert code == 0 and "replaced" not in err, "nothing dropped: no note"
    code, _, err = tock("limits", "set", "kind", "report", "--max-running", "1")
    assert "no longer has a rate of 5/s" in err


def test_removing_a_limit_that_does_not_exist_is_refused(tock):
    # as `tock schedules delete` of a schedule that does not exist
    code, out, err = tock("limits", "remove", "kind", "nosuch")
    assert (code, out) == (1, "")
    assert err == "tock: kind nosuch has no limit; nothing removed\n"
    code, _, err = tock("limits", "remove", "tenant", "--no-tenant")
    assert code == 1 and "tenant (no tenant) has no limit" in err


def test_options_before_the_action_are_not_dropped(tock):
    # The action's own copies of --database-url and --json used to reset these to their
    # defaults: the limit went to TOCK_DATABASE_URL's database, and no JSON came out.
    port = free_port()
    down = f"postgresql://me@127.0.0.1:{port}/x"
    code, _, err = tock("limits", "--database-url", down, "set", "kind", "foo",
                        "--max-running", "3")
    assert code == 3 and f"port {port} failed" in err
    code, out, _ = tock("limits", "--json", "list")
    assert code == 0 and json.loads(out) == [], "nothing written to TOCK_DATABASE_URL's"
    code, out, _ = tock("limits", "--json", "set", "kind", "foo", "--max-running", "3")
    assert code == 0 and json.loads(out)["max_running"] == 3
    assert tock("limits", "--database-url", down, "remove", "kind", "foo")[0] == 3


def test_the_waiting_count_is_right_aligned(tock, db):
    db.execute("""INSERT INTO tock_jobs (kind, state, run_at, payload)
                  SELECT 'email', 'scheduled', now() - interval '1 minute', '{}'
                  FROM generate_series(1, 12)""")
    tock("limits", "set", "kind", "email", "--max-running", "0")
    tock("limits", "set", "kind", "sms", "--max-running", "0")
    lines = tock("limits")[1].splitlines()
    end = len(lines[0])  # WAITING is the last column
    assert [line[end - 2:] for line in lines[1:]] == ["12", " 0"], lines


def test_a_limit_on_a_kind_no_consumer_knows_is_set_with_a_note(tock, db):
    # A typo'd kind would otherwise limit nothing, silently.
    code, _, err = tock("limits", "set", "kind", "emial", "--max-running", "3")
    assert code == 0
    assert "no consumer has announced a handler for kind 'emial'" in err
    db.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, kinds) "
               "VALUES ('w1', 'h', 1, '{default}', 1, '{email}')")
    code, _, err = tock("limits", "set", "kind_key", "email", "--max-running", "1")
    assert code == 0 and err == "", err
    code, _, err = tock("limits", "set", "tenant", "acme", "--max-running", "1")
    assert code == 0 and err == "", err


def test_remove_prints_json_with_json_before_or_after_the_action(tock):
    # --json used to be refused after `remove` (exit 2) and ignored before it.
    tock("limits", "set", "kind", "email", "--max-running", "1")
    code, out, _ = tock("limits", "remove", "kind", "email", "--json")
    assert code == 0 and json.loads(out) == {"scope": "kind", "key": "email", "removed": True}
    code, out, err = tock("limits", "--json", "remove", "kind", "email")
    assert code == 1 and json.loads(out)["removed"] is False  # as DELETE /api/limits
    assert "kind email has no limit" in err
    tock("limits", "set", "tenant", "--no-tenant", "--max-running", "1")
    code, out, _ = tock("limits", "remove", "tenant", "--no-tenant", "--json")
    assert code == 0 and json.loads(out) == {"scope": "tenant", "key": None, "removed": True}
