"""Limits through the HTTP API: listed for any role, set and removed by operators, bad
ones refused with the reason (real Postgres)."""

from __future__ import annotations


def test_set_list_and_remove(operator, viewer, client):
    client.schedule("email")
    res = operator.put("/api/limits", json={"scope": "kind", "key": "email",
                                            "max_running": 3, "rate": 10, "per": 2})
    assert res.status_code == 200, res.text
    body = res.json()
    assert (body["max_running"], body["in_flight"], body["rate_per_second"], body["burst"],
            body["waiting"]) == (3, 0, 5.0, 5, 1)
    operator.put("/api/limits", json={"scope": "tenant", "key": None, "max_running": 0})
    listed = viewer.get("/api/limits").json()
    assert [(x["scope"], x["key"]) for x in listed] == [("kind", "email"), ("tenant", None)]
    assert viewer.delete("/api/limits", params={"scope": "kind", "key": "email"}
                         ).status_code == 403
    assert operator.delete("/api/limits", params={"scope": "kind", "key": "email"}
                           ).json() == {"removed": True}
    assert operator.delete("/api/limits", params={"scope": "tenant"}).json() == {
        "removed": True}
    assert operator.get("/api/limits").json() == []
    gone = operator.delete("/api/limits", params={"scope": "kind", "key": "email"})
    assert gone.status_code == 404, gone.text
    assert gone.json()["detail"] == "kind email has no limit; nothing removed"
    gone = operator.delete("/api/limits", params={"scope": "tenant"})
    assert gone.json()["detail"] == "tenant (no tenant) has no limit; nothing removed"


def test_a_set_says_what_the_limit_it_replaced_had_and_it_has_not(operator):
    def put(**parts):
        res = operator.put("/api/limits", json={"scope": "tenant", "key": None, **parts})
        assert res.status_code == 200, res.text
        return res.json()["dropped"]

    assert put(max_running=5, rate=30, per=60) == []
    assert put(max_running=5) == ["a rate of 30/min"]
    assert put(rate=2) == ["max running 5"]
    assert put(rate=3) == []


def test_a_limit_on_a_kind_no_consumer_announced_says_so_as_the_cli_does(operator):
    res = operator.put("/api/limits", json={"scope": "kind", "key": "emial",
                                            "max_running": 3})
    assert res.status_code == 200 and res.json()["unknown_kind"] is True, res.text
    res = operator.put("/api/limits", json={"scope": "tenant", "key": "acme",
                                            "max_running": 3})
    assert res.json()["unknown_kind"] is False, "tenants are not announced"


def test_bad_limits_say_why(operator):
    for body, status, says in (
            ({"scope": "kind", "key": "email"}, 400, "give max_running, a rate, or both"),
            ({"scope": "kind", "key": "email", "max_running": -2}, 400,
             "max_running must be between 0"),
            ({"scope": "kind", "key": "email", "burst": 2}, 400, "burst needs a rate"),
            ({"scope": "kind", "key": None, "max_running": 1}, 400, "key is required"),
            ({"scope": "kind", "key": "email", "rate": 1e9}, 400, "at most 1,000,000"),
            ({"scope": "queue", "key": "x", "max_running": 1}, 422, "pattern"),
            ({"scope": "kind", "key": "email", "rate": 0}, 422, "greater than 0"),
            ({"scope": "kind", "key": "email", "max_running": "3"}, 422, "valid integer"),
            ({"scope": "tenant", "key": "", "max_running": 1}, 422,
             "the key is empty: name the kind or tenant, or for the jobs without a tenant "
             "send null")):
        res = operator.put("/api/limits", json=body)
        assert res.status_code == status and says in res.text, (body, res.text)
    assert operator.delete("/api/limits", params={"scope": "kind"}).status_code == 400


def test_limits_have_gauges(operator, client, db):
    client.set_limit("kind", "email", max_running=3, rate=2)
    client.schedule("email")
    db.execute("INSERT INTO tock_jobs (kind, state, run_at, payload) "
               "VALUES ('email', 'running', now(), '{}')")
    text = operator.get("/metrics").text
    assert 'tock_limit_max_running{key="email",scope="kind"} 3.0' in text
    assert 'tock_limit_in_flight{key="email",scope="kind"} 1.0' in text
    assert 'tock_limit_rate_per_second{key="email",scope="kind"} 2.0' in text
    assert 'tock_limit_waiting{key="email",scope="kind"} 1.0' in text


def test_a_per_key_limit_through_the_api_with_its_gauges(operator, viewer, client, db):
    res = operator.post("/api/jobs", json={"kind": "sync", "concurrency_key": "acct-1"})
    assert res.status_code == 201 and res.json()["concurrency_key"] == "acct-1", res.text
    db.execute("INSERT INTO tock_jobs (kind, state, run_at, payload, concurrency_key) "
               "VALUES ('sync', 'running', now(), '{}', 'acct-1')")
    res = operator.put("/api/limits", json={"scope": "kind_key", "key": "sync",
                                            "max_running": 1})
    assert res.status_code == 200, res.text
    assert {k: res.json()[k] for k in ("scope", "in_flight", "keys_at_limit", "waiting")} == {
        "scope": "kind_key", "in_flight": 1, "keys_at_limit": 1, "waiting": 1}
    job = viewer.get("/api/jobs", params={"kind": "sync"}).json()["jobs"][0]
    assert "concurrency_key" in job
    text = operator.get("/metrics").text
    assert 'tock_limit_keys_at_limit{key="sync",scope="kind_key"} 1.0' in text
    assert 'tock_limit_max_running{key="sync",scope="kind_key"} 1.0' in text
    res = operator.put("/api/limits", json={"scope": "kind_key", "key": "sync", "rate": 2})
    assert res.status_code == 400 and "takes max_running only" in res.text
    res = operator.post("/api/jobs", json={"kind": "sync", "concurrency_key": ""})
    assert res.status_code == 422 and "concurrency_key" in res.text
    assert operator.delete("/api/limits", params={"scope": "kind_key", "key": "sync"}
                           ).json() == {"removed": True}
