"""The HTTP API against a real Postgres: every call goes through FastAPI, auth, the client
and the operator queries into the per-test database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.settings import DEV_VIEWER_TOKEN, DashboardSettings
from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO
from tests.support.dashboard import METRICS, OPERATOR, TEST_HOSTS, VIEWER, make_dead
from tests.support.history import fill_history


def enqueue(client: TestClient, **body) -> dict:
    res = client.post("/api/jobs", json={"kind": "email", **body})
    assert res.status_code == 201, res.text
    return res.json()


def test_enqueue_get_and_explain(operator):
    job = enqueue(operator, payload={"to": "a@b"}, delay=3600, priority=4, tenant="acme")
    assert job["state"] == "scheduled" and job["created"] is True
    detail = operator.get(f"/api/jobs/{job['id']}").json()
    assert detail["job"]["payload"] == {"to": "a@b"}
    assert detail["job"]["tenant"] == "acme"
    assert "created" not in detail["job"], "only an enqueue says whether it made the job"
    assert detail["attempts"] == []
    assert detail["explanation"]["summary"].startswith("Not due until ")
    assert detail["explanation"]["can_cancel"] is True
    again = operator.get(f"/api/jobs/{job['id']}/explain").json()
    assert again["summary"].startswith("Not due until")


def test_any_utc_offset_python_accepts_is_stored(operator):
    # Found by the schemathesis tests: Postgres refuses offsets beyond +-15:59.
    job = enqueue(operator, at="2030-01-01T00:00:00+16:00")
    assert job["run_at"].startswith("2029-12-31T08:00:00")
    res = operator.get("/api/jobs", params={"created_after": "2000-01-01T00:00:00-20:00"})
    assert res.status_code == 200


# Python's fromisoformat read each of these as some instant; each was stored as that one
# (found by hand, feeding the running API bad input).
NOT_ISO = ["2027-01-01T00:00:00\u0000Z", "2027-01-01T05:00:00xZ", "2027-01-01x05:00Z",
           "2027-01-01T05:00:00 +09:00", "2027-01-01+05:00+01:00", "2027-01-01-05:00",
           "2027-01-01T05:00:00.123456789Z"]


@pytest.mark.parametrize("when", NOT_ISO)
def test_a_time_that_is_not_iso_8601_is_refused_not_read_as_another(operator, when):
    res = operator.post("/api/jobs", json={"kind": "email", "at": when})
    assert res.status_code == 422, res.text
    assert "is not an ISO 8601 date-time" in res.text
    res = operator.get("/api/jobs", params={"created_after": when})
    assert res.status_code == 422 and "is not an ISO 8601 date-time" in res.text


def test_a_time_that_names_no_real_one_or_lost_its_plus_says_so(operator):
    res = operator.post("/api/jobs", json={"kind": "email", "at": "2027-02-29T09:00:00Z"})
    assert res.status_code == 422
    assert "'2027-02-29T09:00:00Z' is not a real date and time: day is out of range for " \
           "month" in res.text
    # created_after=2027-01-01T00:00:00+01:00 unencoded: the query string reads + as space.
    res = operator.get("/api/jobs?created_after=2027-01-01T00:00:00+01:00")
    assert res.status_code == 422
    assert "has a space where its offset's + would be" in res.text and "%2B" in res.text
    res = operator.get("/api/jobs?created_after=2027-01-01T00:00:00%2B01:00")
    assert res.status_code == 200


def test_idempotent_key_returns_existing_job(operator):
    first = enqueue(operator, key="welcome:1")
    second = enqueue(operator, key="welcome:1")
    assert second["id"] == first["id"] and second["created"] is False


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"kind": "bad kind!"}, 422, "kind 'bad kind!' is not a valid kind: use letters, digits"),
    ({"kind": "email", "at": "2030-01-01T00:00:00"}, 400,
     "at must be timezone-aware: 2030-01-01T00:00:00 has no timezone"),
    ({"kind": "email", "at": "2030-01-01T00:00:00Z", "delay": 5}, 400, "either at= or delay="),
    ({"kind": "email", "queue": "no spaces"}, 422,
     "queue 'no spaces' is not a valid queue name: 1-61 letters, digits, - or _"),
    ({"kind": "email", "tenant": "a\u0000b"}, 400, "NUL"),
    ({"kind": "email", "priority": "3"}, 422, "valid integer"),
    ({"kind": "email", "payload": "x" * 300_000}, 400, "over the limit"),
    ({"kind": "email", "priority": 10}, 422, "less than or equal to 9"),
    ({"payload": {}}, 422, "kind"),
])
def test_bad_enqueue_says_what_is_wrong(operator, body, status, words):
    res = operator.post("/api/jobs", json=body)
    assert res.status_code == status
    assert words in res.text


@pytest.mark.parametrize("field", ["delay", "timeout"])
@pytest.mark.parametrize("number", ["NaN", "Infinity"])
def test_a_number_that_is_not_finite_is_refused_as_such(operator, field, number):
    """NaN failed the bound checks first, so the error named a bound, not the NaN."""
    res = operator.post("/api/jobs", content=f'{{"kind": "email", "{field}": {number}}}',
                        headers={"Content-Type": "application/json"})
    assert res.status_code == 422 and "finite number" in res.text, res.text


def test_authentication_and_roles(anon, viewer, operator):
    assert anon.get("/api/jobs").status_code == 401
    assert anon.get("/api/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    job = enqueue(operator)
    assert viewer.get(f"/api/jobs/{job['id']}").status_code == 200
    res = viewer.post("/api/jobs", json={"kind": "email"})
    assert res.status_code == 403 and "read-only" in res.json()["detail"]
    assert viewer.post(f"/api/jobs/{job['id']}/cancel").status_code == 403
    assert viewer.get("/api/me").json() == {"role": "viewer", "csrf_token": None}


def test_cancel_retry_and_refusals(operator, db):
    job = enqueue(operator)
    assert operator.post(f"/api/jobs/{job['id']}/retry").status_code == 409
    res = operator.post(f"/api/jobs/{job['id']}/cancel")
    assert res.status_code == 200 and res.json()["state"] == "cancelled"
    res = operator.post(f"/api/jobs/{job['id']}/cancel")
    assert res.status_code == 409 and "it is cancelled" in res.json()["detail"]
    res = operator.post(f"/api/jobs/{job['id']}/retry")
    assert res.status_code == 200 and res.json()["state"] == "scheduled"
    assert operator.get("/api/jobs/999999").status_code == 404
    assert operator.post("/api/jobs/999999/retry").status_code == 404
    assert operator.get(f"/api/jobs/{2**63}").status_code == 422
    assert operator.get("/api/jobs/0").status_code == 422


def test_list_pages_newest_first_with_filters(operator, db):
    ids = [enqueue(operator, kind=k, queue=q, tenant=t)["id"] for k, q, t in [
        ("email", "default", "a"), ("report", "default", "b"), ("email", "bulk", "a"),
        ("email", "default", None), ("report", "bulk", "a"), ("email", "default", "a"),
        ("email", "default", "b")]]
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"before_id": cursor} if cursor else {})}
        page = operator.get("/api/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)

    def listed(**params):
        return [j["id"] for j in operator.get("/api/jobs", params=params).json()["jobs"]]

    assert listed(kind="report") == [ids[4], ids[1]]
    assert listed(queue="bulk") == [ids[4], ids[2]]
    assert listed(tenant="a", kind="email") == [ids[5], ids[2], ids[0]]
    make_dead(db, ids[3])
    assert listed(state=["dead"]) == [ids[3]]
    assert listed(state=["dead", "scheduled"], queue="bulk") == [ids[4], ids[2]]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert listed(created_after=future) == []
    assert len(listed(created_before=future)) == 7
    res = operator.get("/api/jobs", params={"created_after": "2020-01-01T00:00:00"})
    assert res.status_code == 400 and "timezone-aware" in res.text
    res = operator.get("/api/jobs", params={"state": "sleeping"})
    assert res.status_code == 422
    assert operator.get("/api/jobs", params={"limit": 501}).status_code == 422


def test_bulk_retry_dry_run_then_only_what_was_counted(operator, db):
    dead = [enqueue(operator, kind="flaky")["id"] for _ in range(3)]
    other = enqueue(operator, kind="email")["id"]
    for job_id in dead:
        make_dead(db, job_id)
    make_dead(db, other)
    body = {"filter": {"state": ["dead"], "kind": "flaky"}}
    plan = operator.post("/api/jobs/bulk/retry", json=body).json()
    assert plan["dry_run"] is True and plan["count"] == 3
    assert plan["description"] == "state dead, kind flaky"
    # A job that dies after the dry run is not part of what the operator confirmed.
    late = enqueue(operator, kind="flaky")["id"]
    make_dead(db, late)
    done = operator.post("/api/jobs/bulk/retry",
                         json={**body, "dry_run": False, "up_to_id": plan["up_to_id"]}).json()
    assert done["count"] == 3
    states = dict(db.execute("SELECT id, state::text FROM tock_jobs_all").fetchall())
    assert [states[i] for i in dead] == ["scheduled"] * 3
    assert states[late] == "dead" and states[other] == "dead"


def test_a_job_older_than_the_dry_run_that_comes_to_match_after_it_is_included(operator,
                                                                                 db):
    dead = enqueue(operator, kind="flaky")["id"]
    make_dead(db, dead)
    newer = enqueue(operator, kind="flaky")["id"]  # created before the dry run, not dead yet
    body = {"filter": {"state": ["dead"], "kind": "flaky"}}
    plan = operator.post("/api/jobs/bulk/retry", json=body).json()
    assert plan["count"] == 1 and plan["up_to_id"] == newer
    make_dead(db, newer)
    late = enqueue(operator, kind="flaky")["id"]  # created after: left out
    make_dead(db, late)
    done = operator.post("/api/jobs/bulk/retry",
                         json={**body, "dry_run": False, "up_to_id": plan["up_to_id"]}).json()
    assert done["count"] == 2
    states = dict(db.execute("SELECT id, state::text FROM tock_jobs_all").fetchall())
    assert (states[dead], states[newer], states[late]) == ("scheduled", "scheduled", "dead")


def test_a_dry_run_given_a_bound_is_refused_not_counted_without_it(operator):
    res = operator.post("/api/jobs/bulk/retry", json={"filter": {"state": ["dead"]},
                                                      "up_to_id": 5})
    assert res.status_code == 400
    assert "up_to_id bounds the action (dry_run false)" in res.text


def test_a_time_filter_that_no_job_could_match_is_refused(viewer):
    res = viewer.get("/api/jobs", params={"created_after": "2030-01-01T00:00:00Z",
                                          "created_before": "2020-01-01T00:00:00Z"})
    assert res.status_code == 400
    assert res.json()["detail"] == (
        "created_after (2030-01-01T00:00:00+00:00) is not earlier than created_before "
        "(2020-01-01T00:00:00+00:00): no job could match")


def test_a_dry_run_that_matches_nothing_still_bounds_the_action(operator, db):
    """Its up_to_id is the newest job's, not null: passed back, it keeps out a job that
    died after the dry run, as any dry run's does."""
    before = enqueue(operator, kind="flaky")["id"]
    body = {"filter": {"state": ["dead"], "kind": "flaky"}}
    plan = operator.post("/api/jobs/bulk/retry", json=body).json()
    assert plan["count"] == 0 and plan["up_to_id"] == before
    late = enqueue(operator, kind="flaky")["id"]
    make_dead(db, late)
    done = operator.post("/api/jobs/bulk/retry",
                         json={**body, "dry_run": False, "up_to_id": plan["up_to_id"]}).json()
    assert done["count"] == 0
    state = db.execute("SELECT state::text FROM tock_jobs_all WHERE id = %s",
                       (late,)).fetchone()
    assert state == ("dead",)


def test_a_dry_run_past_the_count_cap_says_more_and_the_action_still_takes_all(
        operator, db, monkeypatch):
    monkeypatch.setattr("shared.ops.jobs.BULK_COUNT_CAP", 2)
    dead = [enqueue(operator, kind="flaky")["id"] for _ in range(3)]
    for job_id in dead:
        make_dead(db, job_id)
    body = {"filter": {"state": ["dead"]}}
    plan = operator.post("/api/jobs/bulk/retry", json=body).json()
    assert (plan["count"], plan["more"], plan["up_to_id"]) == (2, True, max(dead))
    done = operator.post("/api/jobs/bulk/retry",
                         json={**body, "dry_run": False, "up_to_id": plan["up_to_id"]}).json()
    assert done["count"] == 3 and done["more"] is False


def test_bulk_cancel_and_empty_filter_guard(operator, db):
    ids = [enqueue(operator, queue="q1")["id"] for _ in range(4)]
    make_dead(db, ids[0])
    res = operator.post("/api/jobs/bulk/cancel", json={"dry_run": False})
    assert res.status_code == 400 and "filter is empty" in res.json()["detail"]
    plan = operator.post("/api/jobs/bulk/cancel", json={"all": True}).json()
    assert plan["count"] == 3  # the dead one is not cancellable
    done = operator.post("/api/jobs/bulk/cancel",
                         json={"filter": {"queue": "q1"}, "dry_run": False}).json()
    assert done["count"] == 3
    assert db.execute("SELECT count(*) FROM tock_jobs_all WHERE state = 'cancelled'"
                      ).fetchone()[0] == 3


def test_queue_stats_workers_and_metrics(operator, anon, db):
    past = (datetime.now(UTC) - timedelta(seconds=90)).isoformat()
    enqueue(operator, kind="email", queue="mail", at=past)
    enqueue(operator, kind="email", queue="mail", delay=3600)
    db.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, in_flight, "
               "last_heartbeat) VALUES ('w-live', 'h', 1, '{mail}', 4, 1, now()), "
               "('w-old', 'h', 2, '{mail}', 4, 0, now() - interval '10 min')")
    stats = operator.get("/api/stats/queues").json()
    assert len(stats) == 1
    (row,) = stats
    assert (row["queue"], row["kind"], row["due"], row["future"], row["depth"]) == (
        "mail", "email", 1, 1, 1)
    assert 89 <= row["oldest_due_age_seconds"] < 300
    workers = {w["id"]: w for w in operator.get("/api/workers").json()}
    assert workers["w-live"]["status"] == "alive" and workers["w-old"]["status"] == "stale"
    overview = operator.get("/api/stats/overview").json()
    assert overview["totals"]["scheduled"] == 2
    assert overview["by_kind"] == {"email": {"scheduled": 2}}
    assert len(overview["timeline"]) == 60
    assert anon.get("/metrics").status_code == 401
    text = anon.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"}).text
    assert 'tock_jobs{kind="email",state="scheduled"} 2.0' in text
    assert 'tock_queue_depth{kind="email",queue="mail"} 1.0' in text
    age = next(line for line in text.splitlines()
               if line.startswith("tock_oldest_due_age_seconds{"))
    assert 89 <= float(age.rsplit(" ", 1)[1]) < 300
    assert 'tock_workers{status="stale"} 1.0' in text
    assert "tock_worker_slots 4.0" in text
    assert 'tock_tenant_due{tenant=""} 1.0' in text, "jobs without a tenant: one tenant"
    assert 'tock_tenant_weight{tenant=""} 1.0' in text
    assert [t["tenant"] for t in overview["tenants"]] == [None]


def test_a_big_history_partition_is_estimated_and_says_so(operator, anon, db):
    overview = operator.get("/api/stats/overview").json()
    assert overview["estimated"] == []
    fill_history(db, n=25000, kind="email")
    db.execute("ANALYZE tock_history_jobs_succeeded")
    fresh = operator.app.state.stats  # a new snapshot, finished counts included
    fresh._snapshot, fresh._finished_taken = None, None
    overview = operator.get("/api/stats/overview").json()
    assert overview["estimated"] == ["succeeded"]
    assert overview["totals"]["succeeded"] == 25000
    text = anon.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"}).text
    assert 'tock_jobs_estimated{state="succeeded"} 1.0' in text
    assert 'tock_jobs_estimated{state="dead"} 0.0' in text
    assert 'tock_jobs{kind="email",state="succeeded"} 25000.0' in text


def test_a_big_backlog_is_estimated_past_the_bound_with_its_oldest_age_exact(operator, anon,
                                                                            db):
    # One more due job than the bound, the oldest due 120 s ago, and one job on its own
    # queue: the big pair is estimated and says so, the rare one is counted.
    n = UNFINISHED_EXACT_UP_TO + 500
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload) "
               "SELECT 'email', 'mail', now() - interval '120 s' + g * interval '1 ms', '{}' "
               "FROM generate_series(1, %s) g", [n])
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload) "
               "VALUES ('sms', 'rare', now() - interval '30 s', '{}')")
    db.execute("ANALYZE tock_jobs")
    overview = operator.get("/api/stats/overview").json()
    assert overview["estimated"] == ["scheduled"]
    mail, rare = overview["queues"]
    assert mail["estimated"] and mail["due"] > UNFINISHED_EXACT_UP_TO
    assert 119 <= mail["oldest_due_age_seconds"] < 300
    assert (rare["estimated"], rare["due"]) == (False, 1)
    text = anon.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"}).text
    assert 'tock_jobs_estimated{state="scheduled"} 1.0' in text
    assert 'tock_jobs_estimated{state="running"} 0.0' in text
    assert 'tock_queue_depth{kind="sms",queue="rare"} 1.0' in text


def test_a_queue_emptied_of_work_reads_0_in_the_metrics_rather_than_vanishing(
        operator, anon):
    job = enqueue(operator, kind="email", queue="mail")["id"]
    scrape = {"Authorization": f"Bearer {METRICS}"}
    assert 'tock_queue_depth{kind="email",queue="mail"} 1.0' in anon.get(
        "/metrics", headers=scrape).text
    assert operator.post(f"/api/jobs/{job}/cancel").status_code == 200
    text = anon.get("/metrics", headers=scrape).text
    for gauge in ("tock_queue_depth", "tock_oldest_due_age_seconds", "tock_jobs_running",
                  "tock_jobs_scheduled_future"):
        assert f'{gauge}{{kind="email",queue="mail"}} 0.0' in text, gauge


def test_timeline_counts_finished_attempts(operator, db):
    job = enqueue(operator)["id"]
    db.execute("UPDATE tock_jobs SET state = 'succeeded', attempt = 1, "
               "run_at = now() - interval '3 s', created_at = now() - interval '5 s', "
               "started_at = now() - interval '1 s', finished_at = now() WHERE id = %s", (job,))
    db.execute("INSERT INTO tock_attempts (job_id, attempt, worker, started_at, finished_at, "
               "outcome) VALUES (%s, 1, 'w', now() - interval '1 s', now(), 'succeeded')",
               (job,))
    timeline = operator.get("/api/stats/overview").json()["timeline"]
    finished = [b for b in timeline if b["outcomes"]]
    assert len(finished) == 1 and finished[0]["outcomes"] == {"succeeded": 1}
    assert 1.5 < finished[0]["start_lag_p50"] < 2.5


def test_health_endpoints(anon, pg_server):
    assert anon.get("/healthz").text == "ok\n"
    assert anon.get("/readyz").status_code == 200
    broken = DashboardSettings(database_url=pg_server.url("no_such_database"),
                               dashboard_operator_token=OPERATOR,
                               dashboard_allowed_hosts=TEST_HOSTS)
    with TestClient(create_app(broken)) as c:
        assert c.get("/healthz").status_code == 200
        res = c.get("/readyz")
        assert res.status_code == 503 and "no_such_database" in res.text
        res = c.get("/api/jobs", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert res.status_code == 503
        res = c.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert "tock_cluster_stats_up 0.0" in res.text


def test_openapi_served_and_no_cdn_docs(anon):
    schema = anon.get("/openapi.json").json()
    assert "/api/jobs/{job_id}/explain" in schema["paths"]
    assert anon.get("/docs").status_code == 404


def login(client: TestClient, token: str) -> str:
    """Log in through the form; returns the session's CSRF token."""
    form = client.get("/login")
    csrf = client.cookies["tock_login_csrf"]
    assert f'value="{csrf}"' in form.text
    res = client.post("/login", data={"token": token, "csrf_token": csrf},
                      follow_redirects=False)
    assert res.status_code == 303, res.text
    return client.get("/api/me").json()["csrf_token"]


def test_login_session_and_csrf(anon, db):
    assert anon.get("/", follow_redirects=False).headers["location"] == "/login"
    form = anon.get("/login")
    assert form.status_code == 200
    res = anon.post("/login", data={"token": OPERATOR, "csrf_token": "forged"})
    assert res.status_code == 403
    csrf = anon.cookies["tock_login_csrf"]
    res = anon.post("/login", data={"token": "wrong", "csrf_token": csrf})
    assert res.status_code == 401 and "Wrong token" in res.text
    res = anon.post("/login", data={"token": " ", "csrf_token": anon.cookies["tock_login_csrf"]})
    assert res.status_code == 401 and "Enter a token." in res.text
    session_csrf = login(anon, OPERATOR)
    page = anon.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    # A state change with the cookie alone is refused; with the session's token it works.
    res = anon.post("/api/jobs", json={"kind": "email"})
    assert res.status_code == 403 and "X-CSRF-Token" in res.json()["detail"]
    res = anon.post("/api/jobs", json={"kind": "email"},
                    headers={"X-CSRF-Token": session_csrf})
    assert res.status_code == 201
    res = anon.post("/api/jobs", json={"kind": "email"},
                    headers={"X-CSRF-Token": session_csrf, "Origin": "http://evil.example"})
    assert res.status_code == 403 and "cross-site" in res.json()["detail"]
    res = anon.post("/logout", follow_redirects=False)  # same site, the field left out
    assert res.status_code == 403 and "csrf_token form field is missing or wrong" in res.text
    res = anon.post("/logout", data={"csrf_token": session_csrf}, follow_redirects=False)
    assert res.status_code == 303
    assert anon.get("/api/me").status_code == 401


def test_viewer_session_cannot_change_anything(anon, db):
    csrf = login(anon, VIEWER)
    res = anon.post("/api/jobs", json={"kind": "email"}, headers={"X-CSRF-Token": csrf})
    assert res.status_code == 403 and "read-only" in res.json()["detail"]


def test_settings_refuse_unsafe_configuration(database_url):
    from shared.core.errors import ConfigError

    with pytest.raises(ConfigError, match="OPERATOR_TOKEN is required"):
        DashboardSettings.load(database_url=database_url)
    with pytest.raises(ConfigError, match="at least 16 characters"):
        DashboardSettings.load(database_url=database_url, dashboard_operator_token="short")
    with pytest.raises(ConfigError, match="TOCK_DASHBOARD_SECRET_KEY must be at least 16"):
        DashboardSettings.load(database_url=database_url, dashboard_operator_token="o" * 16,
                               dashboard_secret_key="a")
    # A secret written with `echo` ends with a newline: no header could ever carry it.
    for name, token in (("OPERATOR", "o" * 16 + "\n"), ("OPERATOR", "o" * 8 + " " + "o" * 8),
                        ("VIEWER", "v" * 16 + "\u00e9")):
        with pytest.raises(ConfigError, match=f"TOCK_DASHBOARD_{name}_TOKEN must be "
                                              "printable ASCII without spaces"):
            DashboardSettings.load(database_url=database_url, **{
                "dashboard_operator_token": token if name == "OPERATOR" else "o" * 16,
                "dashboard_viewer_token": token if name == "VIEWER" else None})
    dev = DashboardSettings.load(database_url=database_url, dashboard_dev=True)
    assert dev.dashboard_operator_token and dev.dashboard_viewer_token
    assert dev.dashboard_host == "127.0.0.1" and dev.loopback_only
    # Dev mode fills in the tokens left unset (or empty) and takes short ones, but a token
    # given there must still be one a header can carry: nobody could log in with it.
    own = DashboardSettings.load(database_url=database_url, dashboard_dev=True,
                                 dashboard_operator_token="mine", dashboard_viewer_token="")
    assert (own.dashboard_operator_token, own.dashboard_viewer_token) == ("mine", DEV_VIEWER_TOKEN)
    with pytest.raises(ConfigError, match="TOCK_DASHBOARD_OPERATOR_TOKEN must be printable"):
        DashboardSettings.load(database_url=database_url, dashboard_dev=True,
                               dashboard_operator_token="mine\n")


def test_finished_counts_refresh_on_their_own_slower_clock(app, db, operator):
    from dashboard.stats import StatsCache

    job = enqueue(operator)["id"]
    cache = StatsCache(app.state.operator_store, ttl_seconds=0, stale_after_seconds=30,
                       finished_ttl_seconds=3600)
    assert cache.get().counts == {("scheduled", "email"): 1}
    db.execute("UPDATE tock_jobs SET state = 'succeeded', finished_at = now() WHERE id = %s",
               (job,))
    enqueue(operator, kind="report")
    # Unfinished counts are fresh on every computation; the history waits for its TTL.
    assert cache.get().counts == {("scheduled", "report"): 1}
    cache.finished_ttl_seconds = 0
    assert cache.get().counts == {("scheduled", "report"): 1, ("succeeded", "email"): 1}


def test_unknown_query_parameters_are_refused_not_ignored(operator):
    res = operator.get("/api/jobs", params={"stat": "dead"})
    assert res.status_code == 400
    assert res.json()["detail"].startswith(
        "unknown query parameter 'stat'; GET /api/jobs takes: before_id, created_after")
    res = operator.get("/api/jobs?=null&kind=email")
    assert res.status_code == 400 and "unknown query parameter ''" in res.json()["detail"]
    res = operator.get("/api/jobs?" + "&".join(f"p{i}=1" for i in range(3000)))
    assert res.status_code == 400 and len(res.text) < 400
    assert "unknown query parameter 'p0', 'p1', 'p10', 'p100', 'p1000' and 2995 more" \
        in res.json()["detail"]
    res = operator.get("/api/workers", params={"x": "1"})
    assert res.status_code == 400 and "GET /api/workers takes: none" in res.json()["detail"]
    assert operator.get("/api/jobs", params={"state": "dead"}).status_code == 200


def test_a_parameter_that_takes_one_value_is_refused_twice(operator):
    res = operator.get("/api/jobs?kind=email&kind=sms&limit=5&limit=6")
    assert res.status_code == 400
    assert res.json()["detail"] == (
        "query parameter 'kind' was given 2 times, but it takes one value; "
        "query parameter 'limit' was given 2 times, but it takes one value")
    assert operator.get("/api/jobs?state=dead&state=running").status_code == 200, \
        "state is a list: repeat it to ask for several"
