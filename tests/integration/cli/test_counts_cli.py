"""`tock stats`, `tock tenants list` and `tock limits list` on a backlog past the count
bound: estimated figures are marked, a limit's waiting count says "more than", and a
one-job queue beside the backlog is counted exactly."""

from __future__ import annotations

import json

import pytest

from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO


@pytest.fixture
def backlog(db):
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload, tenant) "
               "SELECT 'email', 'mail', now() - interval '1 minute', '{}', 'acme' "
               "FROM generate_series(1, %s)", [UNFINISHED_EXACT_UP_TO + 500])
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload) "
               "VALUES ('sms', 'rare', now() - interval '5 s', '{}')")
    db.execute("ANALYZE tock_jobs")


def test_stats_marks_the_estimated_pair_and_counts_the_rare_one(tock, backlog):
    code, out, _ = tock("stats")
    assert code == 0
    mail = next(line for line in out.splitlines() if line.startswith("mail"))
    rare = next(line for line in out.splitlines() if line.startswith("rare"))
    assert "~" in mail and "~" not in rare
    assert mail.split()[2].startswith("~") and mail.split()[3:6] == ["0", "0", "0"], \
        "only the estimated figure is marked: the exact zeros beside it are not"
    assert "scheduled ~" in out and "(queue, kind, state) ranges past 10,000" in out
    code, out, _ = tock("stats", "--json")
    data = json.loads(out)
    assert data["estimated"] == ["scheduled"]
    by_queue = {q["queue"]: q for q in data["queues"]}
    assert by_queue["mail"]["estimated"] and by_queue["mail"]["due"] > UNFINISHED_EXACT_UP_TO
    assert 59 <= by_queue["mail"]["oldest_due_age_seconds"] < 300  # exact, not estimated
    assert (by_queue["rare"]["estimated"], by_queue["rare"]["due"]) == (False, 1)


def test_a_backlog_younger_than_the_statistics_shows_as_more_than_the_bound(tock, db):
    """Right after a burst the planner's statistics predate it: the estimate was the bound
    plus one, shown as "~10001" where 12,000 waited."""
    db.execute("ANALYZE tock_jobs")  # of an empty table
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload) "
               "SELECT 'email', 'mail', now() + interval '1 hour', '{}' "
               "FROM generate_series(1, %s)", [UNFINISHED_EXACT_UP_TO + 2000])
    code, out, _ = tock("stats")
    assert code == 0
    mail = next(line for line in out.splitlines() if line.startswith("mail")).split()
    assert mail[2:5] == ["0", "0", "0"]
    assert mail[5] == f">{UNFINISHED_EXACT_UP_TO:,}" or (
        mail[5].startswith("~") and int(mail[5][1:]) > UNFINISHED_EXACT_UP_TO + 1), mail


def test_tenants_are_marked_as_sampled(tock, backlog):
    code, out, _ = tock("tenants", "list")
    assert code == 0 and "~" in out and "sampled" in out
    code, out, _ = tock("tenants", "list", "--json")
    assert {t["estimated"] for t in json.loads(out)} == {True}


def test_a_limit_past_the_bound_shows_more_than(tock, backlog):
    assert tock("limits", "set", "kind", "email", "--max-running", "5")[0] == 0
    code, out, _ = tock("limits", "list")
    assert code == 0 and f"more than {UNFINISHED_EXACT_UP_TO:,}" in out



@pytest.mark.parametrize("command", ["stats", "tenants"])
def test_estimated_counts_stay_right_aligned(tock, backlog, command):
    out = tock(command)[1]
    assert "~" in out
    table = out[out.index("QUEUE" if command == "stats" else "TENANT"):].splitlines()
    end = table[0].index("DUE") + len("DUE")
    for row in table[1:]:
        if not row.startswith("(~"):  # the footnote
            assert row[end - 1].isdigit() and row[end:end + 1] in ("", " "), table


def test_stats_shows_the_age_of_jobs_waiting_in_sqs(tock, db):
    # Nothing due, but jobs sent long ago and never claimed (a queue no consumer takes):
    # their age is the one to see, as the API and the gauge give it.
    db.execute("INSERT INTO tock_jobs (kind, queue, state, run_at, payload, dispatched_at) "
               "VALUES ('k', 'orphan', 'dispatched', now() - interval '10 minutes', '{}', "
               "now() - interval '10 minutes')")
    out = tock("stats")[1]
    [row] = [r.split() for r in out.splitlines() if r.startswith("orphan")]
    assert row[:4] == ["orphan", "k", "0", "1"] and float(row[-1]) >= 599, out
