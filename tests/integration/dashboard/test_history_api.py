"""The HTTP API over jobs that moved to the history (migration 0007): listing with filters
and keyset pages across both sides, a job's detail with its attempts and explanation,
retry bringing a job back, cancel moving one, bulk actions with their dry-run counts, and
the overview's totals and timeline."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.support.dashboard import make_dead, run_to


def enqueue(client: TestClient, **body) -> int:
    res = client.post("/api/jobs", json={"kind": "email", **body})
    assert res.status_code == 201, res.text
    job_id: int = res.json()["id"]
    return job_id


def _in_history(db, job_id: int) -> bool:
    return db.execute("SELECT count(*) FROM tock_history_jobs WHERE id = %s",
                      (job_id,)).fetchone()[0] == 1


def test_list_reads_both_sides_with_filters_and_pages(operator, db):
    ids = [enqueue(operator, kind=k, tenant=t) for k, t in [
        ("email", "a"), ("report", "a"), ("email", "b"), ("email", None), ("report", "b")]]
    run_to(db, ids[0], "succeeded")
    run_to(db, ids[2], "dead")
    make_dead(db, ids[3])  # finished in place, as before 0007
    assert _in_history(db, ids[0]) and _in_history(db, ids[2])

    def listed(**params) -> list[int]:
        return [j["id"] for j in operator.get("/api/jobs", params=params).json()["jobs"]]

    assert listed() == ids[::-1]
    assert listed(state=["dead"]) == [ids[3], ids[2]]
    assert listed(state=["succeeded", "scheduled"], kind="email") == [ids[0]]
    assert listed(tenant="b") == [ids[4], ids[2]]
    seen, cursor = [], None
    while True:
        page = operator.get("/api/jobs", params={"limit": 2, **(
            {"before_id": cursor} if cursor else {})}).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]


def test_detail_and_explain_of_a_moved_job(operator, db):
    job = enqueue(operator, key="moved")
    run_to(db, job, "dead", error="ValueError: nope")
    detail = operator.get(f"/api/jobs/{job}").json()
    assert detail["job"]["state"] == "dead" and detail["job"]["key"] == "moved"
    assert [(a["attempt"], a["outcome"]) for a in detail["attempts"]] == [(1, "permanent")]
    why = operator.get(f"/api/jobs/{job}/explain").json()
    assert why["summary"].startswith("Dead since") and "permanent error" in why["summary"]
    assert why["can_retry"] is True
    again = operator.post("/api/jobs", json={"kind": "email", "key": "moved"}).json()
    assert (again["id"], again["created"]) == (job, False)


def test_retry_brings_a_moved_job_back_and_cancel_moves_one(operator, db):
    dead, done, waiting = (enqueue(operator) for _ in range(3))
    run_to(db, dead, "dead")
    run_to(db, done, "succeeded")
    res = operator.post(f"/api/jobs/{dead}/retry")
    assert res.status_code == 200 and res.json()["state"] == "scheduled"
    assert not _in_history(db, dead)
    assert len(operator.get(f"/api/jobs/{dead}").json()["attempts"]) == 1
    res = operator.post(f"/api/jobs/{done}/retry")
    assert res.status_code == 409 and "it is succeeded" in res.json()["detail"]
    res = operator.post(f"/api/jobs/{waiting}/cancel")
    assert res.status_code == 200 and res.json()["state"] == "cancelled"
    assert _in_history(db, waiting)
    res = operator.post(f"/api/jobs/{waiting}/cancel")
    assert res.status_code == 409 and "it is cancelled" in res.json()["detail"]


def test_bulk_actions_count_and_act_on_both_sides(operator, db):
    flaky = [enqueue(operator, kind="flaky") for _ in range(4)]
    for job in flaky[:3]:
        run_to(db, job, "dead")
    make_dead(db, flaky[3])
    body = {"filter": {"state": ["dead"], "kind": "flaky"}}
    plan = operator.post("/api/jobs/bulk/retry", json=body).json()
    assert (plan["count"], plan["up_to_id"]) == (4, flaky[3])
    late = enqueue(operator, kind="flaky")
    run_to(db, late, "dead")
    done = operator.post("/api/jobs/bulk/retry", json={
        **body, "dry_run": False, "up_to_id": plan["up_to_id"]}).json()
    assert done["count"] == 4
    states = dict(db.execute("SELECT id, state::text FROM tock_jobs").fetchall())
    assert [states[j] for j in flaky] == ["scheduled"] * 4
    assert _in_history(db, late), "died after the count: not part of it"
    plan = operator.post("/api/jobs/bulk/cancel", json={"filter": {"kind": "flaky"}}).json()
    assert plan["count"] == 4
    operator.post("/api/jobs/bulk/cancel", json={"filter": {"kind": "flaky"},
                                                 "dry_run": False})
    assert all(_in_history(db, j) for j in flaky)


def test_overview_counts_and_timeline_include_the_history(operator, db):
    jobs = [enqueue(operator) for _ in range(3)]
    run_to(db, jobs[0], "succeeded")
    run_to(db, jobs[1], "dead")
    overview = operator.get("/api/stats/overview").json()
    assert (overview["totals"]["succeeded"], overview["totals"]["dead"],
            overview["totals"]["scheduled"]) == (1, 1, 1)
    outcomes: dict[str, int] = {}
    for bucket in overview["timeline"]:
        for outcome, n in bucket["outcomes"].items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
    assert outcomes == {"succeeded": 1, "permanent": 1}
    assert sum(b["succeeded"] for b in overview["timeline"]) == 1
