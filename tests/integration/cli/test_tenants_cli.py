"""`tock tenants`: weights set and reset from the command line, and each tenant's
unfinished work, against a real Postgres."""

from __future__ import annotations

import json

from devstack.ports import free_port


def test_weights_set_list_and_reset(tock, db):
    db.execute("""INSERT INTO tock_jobs (kind, state, run_at, payload, tenant)
                  SELECT 'k', 'scheduled', now() - interval '1 minute', '{}', t
                  FROM unnest(ARRAY['acme', 'acme', NULL]) t""")
    assert tock("tenants", "weight", "acme", "5")[:2] == (0, "acme: weight 5\n")
    code, out, _ = tock("tenants", "weight", "--no-tenant", "2")
    assert code == 0 and out == "(no tenant): weight 2\n"
    code, out, _ = tock("tenants", "weight", "idle", "3")
    code, out, _ = tock("tenants", "--json")
    rows = {t["tenant"]: t for t in json.loads(out)}
    assert (rows["acme"]["weight"], rows["acme"]["due"]) == (5, 2)
    assert (rows[None]["weight"], rows[None]["due"]) == (2, 1)
    assert (rows["idle"]["weight"], rows["idle"]["due"]) == (3, 0), "a weight with no jobs"
    code, out, _ = tock("tenants", "list")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TENANT", "WEIGHT", "DUE"]
    assert lines[1].split()[:3] == ["acme", "5", "2"], "busiest first"
    assert tock("tenants", "reset", "acme")[1] == "acme: weight 1 (the default)\n"
    assert "had no weight set" in tock("tenants", "reset", "acme")[1]


def test_bad_weights_and_tenants_are_refused_with_the_reason(tock):
    code, _, err = tock("tenants", "weight", "acme", "0")
    assert code == 2 and "weight must be between 1 and 1000, got 0" in err
    for written in ("many", " 5", "1_0", "\u0665"):  # int() takes the last three
        code, _, err = tock("tenants", "weight", "acme", written)
        assert code == 2 and "weight must be an integer" in err, written
    code, _, err = tock("tenants", "weight", "acme")
    assert code == 2 and "expected TENANT N, got acme; the weight N (1..1000) is missing" in err
    code, _, err = tock("tenants", "weight", "5")
    assert code == 2 and "expected TENANT N, got 5" in err
    code, _, err = tock("tenants", "reset")
    assert code == 2 and "expected TENANT, got nothing" in err
    code, _, err = tock("tenants", "weight", "--no-tenant", "acme", "5")
    assert code == 2 and "give a TENANT or --no-tenant, one of the two" in err
    code, _, err = tock("tenants", "weight", "acme", "3", "extra")
    assert code == 2 and "expected TENANT N, got acme 3 extra; 1 argument(s) too many" in err
    code, _, err = tock("tenants", "weight", "x" * 200, "5")
    assert code == 2 and "tenant must be at most 128 characters" in err


def _right_aligned(lines: list[str], header: str) -> bool:
    """Whether every row's cell in the column `header` ends where the header does."""
    end = lines[0].index(header) + len(header)
    return all(row[end - 1] != " " and row[end:end + 1] in ("", " ") for row in lines[1:])


def test_counts_are_right_aligned(tock, db):
    db.execute("""INSERT INTO tock_jobs (kind, state, run_at, payload, tenant)
                  SELECT 'k', 'scheduled', now() + s * interval '1 minute', '{}', 'acme'
                  FROM generate_series(-11, 11) s""")
    tock("tenants", "weight", "idle", "3")
    lines = tock("tenants")[1].splitlines()
    assert [line.split()[:3] for line in lines[1:]] == [["acme", "1", "12"],
                                                         ["idle", "3", "0"]]
    for header in ("WEIGHT", "DUE", "IN SQS", "RUNNING", "LATER", "OLDEST DUE S"):
        assert _right_aligned(lines, header), (header, lines)
    # Nothing due: no age, not an age of 0.0 s.
    assert lines[1].split()[-1] != "-" and lines[2].split()[-1] == "-", lines


def test_options_before_the_action_are_not_dropped(tock):
    # The action's own copies of --database-url and --json used to reset these to their
    # defaults: the weight went to TOCK_DATABASE_URL's database, and no JSON came out.
    port = free_port()
    down = f"postgresql://me@127.0.0.1:{port}/x"
    code, _, err = tock("tenants", "--database-url", down, "weight", "acme", "5")
    assert code == 3 and f"port {port} failed" in err
    code, out, _ = tock("tenants", "--json", "list")
    assert code == 0 and json.loads(out) == [], "nothing written to TOCK_DATABASE_URL's"
    assert tock("tenants", "--database-url", down, "reset", "acme")[0] == 3
    assert tock("tenants", "--database-url", down, "list")[0] == 3


def test_weight_and_reset_print_json_with_json_before_or_after_the_action(tock):
    # --json used to be refused after `weight`/`reset` (exit 2) and ignored before them.
    code, out, _ = tock("tenants", "weight", "acme", "5", "--json")
    assert code == 0 and json.loads(out) == {"tenant": "acme", "weight": 5}
    code, out, _ = tock("tenants", "--json", "weight", "--no-tenant", "2")
    assert code == 0 and json.loads(out) == {"tenant": None, "weight": 2}
    code, out, _ = tock("tenants", "reset", "acme", "--json")
    assert code == 0 and json.loads(out) == {"tenant": "acme", "weight": 1, "was_set": True}
    code, out, _ = tock("tenants", "--json", "reset", "acme")
    assert code == 0 and json.loads(out)["was_set"] is False


def test_an_invisible_character_in_a_new_tenant_is_refused_but_found_by_filters(tock, db):
    for argv in (("enqueue", "email", "--tenant", "a\u200bb"),
                 ("tenants", "weight", "a\u200bb", "3"),
                 ("limits", "set", "tenant", "a\u200bb", "--max-running", "1")):
        code, _, err = tock(*argv)
        assert code == 2 and "tenant contains U+200B (ZERO WIDTH SPACE)" in err, (argv, err)
    db.execute("INSERT INTO tock_jobs (kind, queue, tenant, run_at) VALUES ('email', "
               "'default', 'a\u200bb', now())")
    code, out, _ = tock("jobs", "--tenant", "a\u200bb", "--json")
    assert code == 0 and [j["tenant"] for j in json.loads(out)["jobs"]] == ["a\u200bb"]
