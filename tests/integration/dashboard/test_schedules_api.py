"""Recurring schedules through the HTTP API (shared.recurring underneath, real Postgres)."""

from __future__ import annotations


def test_list_get_preview_pause_resume(operator, viewer, client):
    client.recurring("nightly", "report", {"format": "pdf"}, cron="0 2 * * *", tz="Europe/Berlin")
    client.recurring("beat", "ping", every=15)
    listed = operator.get("/api/schedules").json()
    assert [s["name"] for s in listed] == ["beat", "nightly"]
    assert listed[1]["timing"] == "cron '0 2 * * *' in Europe/Berlin"
    assert listed[0]["every_seconds"] == 15.0 and listed[0]["paused"] is False
    detail = viewer.get("/api/schedules/nightly").json()
    fires = detail["next_fires"]
    assert len(fires) == 5 and all(f["local"].endswith(("+01:00", "+02:00")) for f in fires)
    assert all("T02:00:00" in f["local"] for f in fires)
    assert detail["runs"] == [] and detail["schedule"]["payload"] == {"format": "pdf"}
    assert len(viewer.get("/api/schedules/beat/preview", params={"n": 3}).json()) == 3
    assert viewer.post("/api/schedules/beat/pause").status_code == 403
    paused = operator.post("/api/schedules/beat/pause").json()
    assert paused["paused"] is True
    assert operator.get("/api/schedules/beat").json()["next_fires"] == []
    assert operator.post("/api/schedules/beat/resume").json()["paused"] is False


def test_unknown_and_invalid_names(operator):
    res = operator.get("/api/schedules/nope")
    assert res.status_code == 404 and "no schedule named 'nope'" in res.json()["detail"]
    assert operator.post("/api/schedules/nope/pause").status_code == 404
    res = operator.get("/api/schedules/bad:name")
    assert res.status_code == 422
    assert res.json()["detail"][0]["msg"] == (
        "schedule name 'bad:name' is not valid: 1-100 letters, digits and . _ - (starting "
        "with a letter or digit)")  # in words, not the regular expression
    res = operator.get("/api/schedules/" + "x" * 5000)
    assert res.status_code == 422 and len(res.json()["detail"][0]["msg"]) < 200
    assert operator.get("/api/schedules/beat/preview", params={"n": 0}).status_code == 422


def test_a_schedule_whose_slots_reach_the_end_of_the_calendar_is_shown(operator, db, client):
    # Stored before start= was bounded: its first slot is its last one in the calendar.
    client.recurring("far", "report", every=366 * 86400)
    db.execute("UPDATE tock_schedules SET anchor = '9999-12-31T00:00:00Z', "
               "next_slot = '9999-12-31T00:00:00Z', next_fire_at = '9999-12-31T00:00:00Z' "
               "WHERE name = 'far'")
    res = operator.get("/api/schedules/far")
    assert res.status_code == 200, res.text
    assert [f["slot"] for f in res.json()["next_fires"]] == ["9999-12-31T00:00:00Z"]
    assert len(operator.get("/api/schedules/far/preview", params={"n": 10}).json()) == 1
