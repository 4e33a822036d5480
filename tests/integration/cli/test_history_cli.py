"""The `tock` commands over jobs that moved to the history (migration 0007): `tock jobs`
lists them, `tock show` tells their story with their attempts, `tock retry` brings them
back, `tock cancel` moves one, and `tock stats` counts both sides."""

from __future__ import annotations

import json

from tests.support.dashboard import run_to


def test_jobs_show_retry_cancel_and_stats_over_moved_jobs(tock, db):
    for kind in ("email", "email", "report"):
        tock("enqueue", kind)
    run_to(db, 1, "succeeded")
    run_to(db, 2, "dead", error="ValueError: nope")
    code, out, _ = tock("jobs", "--json")
    assert code == 0
    assert [(j["id"], j["state"]) for j in json.loads(out)["jobs"]] == [
        (3, "scheduled"), (2, "dead"), (1, "succeeded")]
    code, out, _ = tock("jobs", "--state", "dead")
    assert code == 0 and "ValueError: nope" in out
    code, out, _ = tock("show", "2")
    assert code == 0 and out.startswith("job 2  email  [dead]")
    assert "Dead since" in out and "permanent" in out
    code, out, _ = tock("stats", "--json")
    totals = json.loads(out)["totals"]
    assert (totals["succeeded"], totals["dead"], totals["scheduled"]) == (1, 1, 1)
    code, out, _ = tock("retry", "--state", "dead", "--dry-run")
    assert code == 0 and out.strip() == "would retry 1 job(s) (state dead)"
    code, out, _ = tock("retry", "2")
    assert code == 0 and out.strip() == "job 2: scheduled"
    code, out, err = tock("retry", "1")
    assert code == 1 and "it is succeeded" in err
    code, out, _ = tock("cancel", "3")
    assert code == 0 and out.strip() == "job 3: cancelled"
    assert db.execute("SELECT count(*) FROM tock_history_jobs WHERE id = 3").fetchone() == (1,)
