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
