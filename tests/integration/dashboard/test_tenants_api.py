"""Fair share through the HTTP API: tenants' weights and unfinished work for any role,
weights changed by operators only, bad weights refused with the reason (real Postgres)."""

from __future__ import annotations


def test_list_and_change_weights(operator, viewer, client):
    client.schedule("k", tenant="acme")
    client.schedule("k", tenant="acme")
    client.schedule("k")
    assert operator.put("/api/tenants/weight", json={"tenant": "acme", "weight": 4}).json() \
        == {"tenant": "acme", "weight": 4}
    assert operator.put("/api/tenants/weight",
                        json={"tenant": None, "weight": 2}).status_code == 200
    rows = {t["tenant"]: t for t in viewer.get("/api/tenants").json()}
    assert (rows["acme"]["weight"], rows["acme"]["due"]) == (4, 2)
    assert (rows[None]["weight"], rows[None]["due"]) == (2, 1)
    assert client.tenant_weights() == {"acme": 4, None: 2}
    reset = operator.put("/api/tenants/weight", json={"tenant": "acme", "weight": None})
    assert reset.json() == {"tenant": "acme", "weight": 1}
    assert client.tenant_weights() == {None: 2}


def test_only_operators_change_weights_and_bad_ones_say_why(operator, viewer):
    assert viewer.put("/api/tenants/weight",
                      json={"tenant": "acme", "weight": 3}).status_code == 403
    for body, says in (({"tenant": "acme", "weight": 0}, "greater than or equal to 1"),
                       ({"tenant": "acme", "weight": 1001}, "less than or equal to 1000"),
                       ({"tenant": "acme", "weight": "3"}, "valid integer"),
                       ({"tenant": "", "weight": 3}, "at least 1 character"),
                       ({"tenant": "acme"}, "Field required"),
                       ({"tenant": "acme", "weight": 3, "extra": 1}, "Extra inputs")):
        res = operator.put("/api/tenants/weight", json=body)
        assert res.status_code == 422 and says in res.text, (body, res.text)


def test_an_invisible_character_in_a_new_tenant_is_refused_but_found_by_filters(operator, db):
    for res in (operator.put("/api/tenants/weight", json={"tenant": "a\u200bb", "weight": 3}),
                operator.post("/api/jobs", json={"kind": "k", "tenant": "a\u200bb"}),
                operator.put("/api/limits", json={"scope": "tenant", "key": "a\u200bb",
                                                  "max_running": 1})):
        assert res.status_code == 400, res.text
        assert res.json()["detail"] == ("tenant contains U+200B (ZERO WIDTH SPACE), which "
                                        "does not show where the name is shown; remove it")
    assert db.execute("SELECT count(*) FROM tock_jobs").fetchone()[0] == 0
    # One stored before the check is still found, and its weight can be reset.
    db.execute("INSERT INTO tock_jobs (kind, queue, tenant, run_at) VALUES ('k', 'default', "
               "'a\u200bb', now())")
    db.execute("INSERT INTO tock_tenant_weights (tenant, weight) VALUES ('a\u200bb', 3)")
    found = operator.get("/api/jobs?tenant=a%E2%80%8Bb").json()["jobs"]
    assert [j["tenant"] for j in found] == ["a\u200bb"]
    assert operator.put("/api/tenants/weight",
                        json={"tenant": "a\u200bb", "weight": None}).status_code == 200
