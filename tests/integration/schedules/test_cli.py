"""`tock schedules ...` against a real Postgres."""

import json
from datetime import UTC, datetime

import pytest

from cli.main import main


@pytest.fixture
def env(monkeypatch, database_url):
    monkeypatch.setenv("TOCK_DATABASE_URL", database_url)


def run(capsys, *argv):
    code = main(["schedules", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_show_preview_pause_resume_delete(env, client, capsys):
    client.recurring("nightly", "report", {"format": "pdf"}, cron="30 2 * * *", tz="Europe/Berlin")
    client.recurring("pulse", "report", every=15, overlap="skip")

    code, out, _ = run(capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["NAME", "KIND", "WHEN"]
    assert "cron '30 2 * * *' in Europe/Berlin" in out and "overlap=skip" in out

    assert run(capsys) == (code, out, ""), "no action lists them, as tock tenants does"

    code, out, _ = run(capsys, "--json", "list")
    data = json.loads(out)
    assert [d["name"] for d in data] == ["nightly", "pulse"]
    assert data[1]["every"] == 15.0
    assert "changed" not in data[0], "what a pause or recurring() did, not a listing's"

    code, out, _ = run(capsys, "show", "nightly")
    assert code == 0 and "Europe/Berlin" in out and "slots not run:" in out

    code, out, _ = run(capsys, "preview", "nightly", "-n", "3", "--json")
    fires = json.loads(out)
    assert len(fires) == 3
    for fire in fires:
        local = datetime.fromisoformat(fire["local"])
        assert (local.hour, local.minute) in ((2, 30), (3, 0))  # 03:00 only on a DST night
        assert datetime.fromisoformat(fire["fire_at"]).astimezone(UTC) > datetime.now(UTC)

    code, out, _ = run(capsys, "preview", "nightly", "-n", "2")
    assert code == 0 and len(out.splitlines()) == 3

    assert run(capsys, "pause", "pulse")[:2] == (0, "paused pulse\n")
    assert run(capsys, "pause", "pulse")[:2] == (
        0, "pulse was already paused; nothing changed\n")
    code, out, _ = run(capsys, "--json", "show", "pulse")
    assert json.loads(out)["schedule"]["paused"] is True
    assert "changed" not in json.loads(out)["schedule"]
    # Paused, it fires nothing: no stale next fire time, and a preview says so.
    code, out, _ = run(capsys, "list")
    assert out.splitlines()[2].split()[-4:-2] == ["-", "(paused)"], out
    code, out, _ = run(capsys, "show", "pulse")
    assert "next fire:     - (paused)" in out, out
    code, out, _ = run(capsys, "preview", "pulse", "-n", "2")
    assert out.splitlines()[-1] == ("paused: the fire times it would have; none fires until "
                                    "`tock schedules resume pulse`"), out
    code, out, _ = run(capsys, "resume", "pulse")
    assert code == 0 and out.startswith("resumed pulse; next fire")
    code, out, _ = run(capsys, "resume", "pulse")
    assert code == 0 and out.startswith("pulse was not paused; nothing changed (next fire")
    assert run(capsys, "delete", "pulse")[:2] == (0, "deleted pulse\n")


def test_errors_have_exit_codes(env, capsys):
    code, _, err = run(capsys, "show", "nope")
    assert code == 1 and "no schedule named 'nope'" in err
    code, _, err = run(capsys, "preview", "bad:name")
    assert code == 2 and "schedule name" in err
    with pytest.raises(SystemExit) as info:
        main(["schedules", "frobnicate"])
    assert info.value.code == 2
