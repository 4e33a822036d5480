"""The HTTP API's refusals say what is wrong and what to send: a body that is not UTF-8,
a JSON body sent without a JSON Content-Type, a limit without its key, and a limit's `per`
or `burst` without a rate (refused, never dropped)."""

from __future__ import annotations

import gzip
import re

import pytest

from shared.core.errors import InvalidInput
from tests.integration.dashboard.guard_helpers import jobs
from tests.support.dashboard import OPERATOR

JSON = {"Content-Type": "application/json"}


def test_a_body_that_is_not_utf8_is_a_clear_400(operator, db):
    res = operator.post("/api/jobs", content=b'{"kind": "email", "payload": "caf\xe9"}',
                        headers=JSON)
    assert res.status_code == 400
    assert res.json()["detail"] == ("request body must be JSON encoded as UTF-8, but byte "
                                    "0xe9 at offset 33 is not UTF-8")
    assert jobs(db) == 0


@pytest.mark.parametrize(("headers", "sent"), [
    ({"Content-Type": "application/x-www-form-urlencoded"},
     "sent as application/x-www-form-urlencoded"),
    ({"Content-Type": "text/plain"}, "sent as text/plain"),
    ({}, "sent without a Content-Type"),
])
def test_a_body_not_sent_as_json_is_415_naming_the_header(operator, db, headers, sent):
    # What `curl -d '{"kind":"email"}'` sends: JSON text under a form type.
    res = operator.post("/api/jobs", content=b'{"kind": "email"}', headers=headers)
    assert res.status_code == 415
    detail = res.json()["detail"]
    assert f"request body must be JSON, but it was {sent}: send the header " \
           "Content-Type: application/json" in detail
    assert jobs(db) == 0


@pytest.mark.parametrize("charset", ["latin-1", '"utf-16"'])
def test_a_json_body_in_another_charset_is_415_naming_it(operator, db, charset):
    # "é" in Latin-1 is one byte that UTF-8 would refuse (or worse, read as other text).
    res = operator.post("/api/jobs", content='{"kind": "café"}'.encode("latin-1"),
                        headers={"Content-Type": f"application/json; charset={charset}"})
    assert res.status_code == 415
    assert res.json()["detail"] == (
        "request body must be JSON encoded as UTF-8, but it was sent as "
        f"charset={charset.strip(chr(34))}: send UTF-8 (Content-Type: application/json)")
    assert jobs(db) == 0


@pytest.mark.parametrize("headers", [JSON, {"Content-Type": "application/json; charset=utf-8"},
                                     {"Content-Type": "application/json;charset=UTF8"},
                                     {"Content-Type": "application/merge-patch+json"}])
def test_json_bodies_and_bodies_without_a_type_pass(operator, db, headers):
    res = operator.post("/api/jobs", content=b'{"kind": "email"}', headers=headers)
    assert res.status_code == 201, res.text
    assert jobs(db) == 1


def test_a_bodyless_post_with_a_form_type_passes(operator, client):
    job = client.schedule("email")
    client.cancel(job.id)
    res = operator.post(f"/api/jobs/{job.id}/retry", content=b"",
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert res.status_code == 200, res.text


@pytest.mark.parametrize("body", [b'{"reason": "customer asked"}', b'[1]', b'"now"'])
def test_an_action_that_takes_no_body_refuses_one_that_says_something(operator, client, body):
    """`{"reason": ...}` on a cancel would be dropped unread: the caller meant it to count."""
    job = client.schedule("email")
    res = operator.post(f"/api/jobs/{job.id}/cancel", content=body, headers=JSON)
    assert res.status_code == 400
    assert res.json()["detail"] == (
        f"POST /api/jobs/{job.id}/cancel takes no request body (got {len(body)} bytes): "
        "send none; what it acts on is named in the path and the query string")
    assert client.get(job.id).state.value == "scheduled", "nothing was done"
    client.set_limit("kind", "email", max_running=2)
    res = operator.request("DELETE", "/api/limits", params={"scope": "kind", "key": "email"},
                           content=b'{"scope": "tenant"}', headers=JSON)
    assert res.status_code == 400
    assert [limit.key for limit in client.limits()] == ["email"], "the limit is kept"


@pytest.mark.parametrize("body", [b"", b"{}", b" {} ", b"null"])
def test_an_action_that_takes_no_body_accepts_an_empty_one(operator, client, body):
    job = client.schedule("email")
    res = operator.post(f"/api/jobs/{job.id}/cancel", content=body, headers=JSON)
    assert res.status_code == 200, res.text


def test_the_login_form_still_posts_as_a_form(anon):
    anon.get("/login")
    res = anon.post("/login", data={"token": "wrong", "csrf_token":
                                    anon.cookies["tock_login_csrf"]}, follow_redirects=False)
    assert res.status_code != 415


def test_a_login_posted_as_json_says_so_and_a_pasted_newline_is_forgiven(anon):
    """A JSON login was refused as "form expired or posted from another site" (its fields
    read as empty); a token pasted with its newline was "Wrong token.", though the API's
    Bearer header takes it (a bad-input walkthrough)."""
    anon.get("/login")
    csrf = anon.cookies["tock_login_csrf"]
    res = anon.post("/login", json={"token": OPERATOR, "csrf_token": csrf})
    assert res.status_code == 415
    assert res.json()["detail"].startswith("the login form posts as "
                                           "application/x-www-form-urlencoded")
    res = anon.post("/login", data={"token": f" {OPERATOR}\n", "csrf_token": csrf},
                    follow_redirects=False)
    assert res.status_code == 303, res.text
    assert anon.get("/api/me").json()["role"] == "operator"


def test_a_login_form_that_repeats_a_field_is_refused(anon):
    """FastAPI takes the last of repeated form fields: `token=wrong&token=<right>` logged
    in. Each field must come once; a form with each once still logs in."""
    anon.get("/login")
    csrf = anon.cookies["tock_login_csrf"]
    res = anon.post("/login", content=f"token=wrong&token={OPERATOR}&csrf_token={csrf}",
                    headers={"content-type": "application/x-www-form-urlencoded"},
                    follow_redirects=False)
    assert res.status_code == 400
    assert res.json()["detail"] == ("form field(s) token sent more than once: send each "
                                    "field once")
    assert anon.get("/api/me").status_code == 401
    res = anon.post("/login", files={"token": (None, OPERATOR), "csrf_token": (None, csrf)},
                    follow_redirects=False)
    assert res.status_code == 303, res.text  # multipart, each field once
    res = anon.post("/logout", content="csrf_token=a&csrf_token=b",
                    headers={"content-type": "application/x-www-form-urlencoded"},
                    follow_redirects=False)
    assert res.status_code == 400 and "csrf_token" in res.json()["detail"]
    assert anon.get("/api/me").json()["role"] == "operator"


def test_a_limit_without_its_key_says_the_key_is_required(operator):
    for scope in ("kind", "kind_key"):
        res = operator.delete("/api/limits", params={"scope": scope})
        assert res.status_code == 400 and res.json()["detail"].startswith(
            f"key is required: a {scope} limit needs the name of the kind"), res.text
        res = operator.put("/api/limits", json={"scope": scope, "key": None,
                                                "max_running": 1})
        assert res.status_code == 400 and "key is required" in res.json()["detail"], res.text
    res = operator.put("/api/limits", json={"scope": "tenant", "key": None, "max_running": 1})
    assert res.status_code == 200, res.text


@pytest.mark.parametrize(("extra", "says"), [
    ({"per": 60}, "per needs a rate (per is the rate's period): give a rate too, or "
                  "leave per out"),
    ({"burst": 3}, "burst needs a rate"),
    ({"per": 60, "burst": 3}, "per and burst need a rate"),
    ({"per": 1}, "per needs a rate"),  # the default's value, given: still refused
])
def test_per_or_burst_without_a_rate_is_refused_not_dropped(operator, client, extra, says):
    res = operator.put("/api/limits", json={"scope": "kind", "key": "report",
                                            "max_running": 1, **extra})
    assert res.status_code == 400 and says in res.json()["detail"], res.text
    with pytest.raises(InvalidInput, match=says.split(" (")[0]):
        client.set_limit("kind", "report", max_running=1, **extra)
    assert client.limits() == []
    # With a rate, both are kept exactly.
    res = operator.put("/api/limits", json={"scope": "kind", "key": "report",
                                            "max_running": 1, "rate": 6, **extra})
    assert res.status_code == 200, res.text
    assert res.json()["rate_per_second"] == 6 / extra.get("per", 1)


OUT_OF_RANGE = "out of range: in UTC it falls outside years 1 to 9999"


def test_states_given_with_commas_say_to_repeat_the_parameter(operator, db):
    """The CLI takes --state dead,retrying; the API's list takes state= repeated."""
    res = operator.get("/api/jobs", params={"state": "dead, succeeded"})
    assert res.status_code == 422, res.text
    [error] = res.json()["detail"]
    assert error["loc"] == ["query", "state", 0]
    assert error["msg"].endswith("; for several, repeat the parameter "
                                 "(state=dead&state=succeeded), not commas")
    assert operator.get("/api/jobs", params=[("state", "dead"), ("state", "succeeded")]
                        ).status_code == 200
    bogus = operator.get("/api/jobs", params={"state": "bogus"}).json()["detail"][0]
    assert "repeat" not in bogus["msg"]


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_a_time_outside_the_calendar_in_utc_is_a_422_naming_the_field(operator, db, when):
    # Valid ISO 8601 with its offset, but past year 9999 (or before year 1) in UTC.
    answers = {
        ("body", "at"): operator.post("/api/jobs", json={"kind": "email", "at": when}),
        ("query", "created_after"): operator.get("/api/jobs",
                                                 params={"created_after": when}),
        ("body", "filter", "created_after"): operator.post(
            "/api/jobs/bulk/cancel", json={"filter": {"created_after": when}}),
    }
    for loc, res in answers.items():
        assert res.status_code == 422, res.text
        [error] = res.json()["detail"]
        assert tuple(error["loc"]) == loc and OUT_OF_RANGE in error["msg"], error
    assert jobs(db) == 0


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("DELETE", "/api/jobs/1", "GET"),
    ("PUT", "/api/jobs", "GET, POST"),
    ("GET", "/api/jobs/1/cancel", "POST"),
    ("POST", "/healthz", "GET"),
])
def test_a_405_lists_the_methods_the_path_takes(operator, method, path, allowed):
    res = operator.request(method, path)
    assert res.status_code == 405
    assert res.headers["Allow"] == allowed


@pytest.mark.parametrize(("body", "key"), [
    (b'{"kind": "email", "kind": "report"}', "kind"),
    (b'{"kind": "email", "payload": {"to": "a@example.com", "to": "b@example.com"}}', "to"),
    (b'{"kind": "email", "payload": [{"n": 1}, {"n": 1, "x": 0, "n": 2}]}', "n"),
])
def test_a_json_object_that_repeats_a_key_is_refused_naming_it(operator, db, body, key):
    res = operator.post("/api/jobs", content=body, headers=JSON)
    assert res.status_code == 400, res.text
    assert res.json()["detail"] == (f"request body has the key {key!r} twice in one JSON "
                                    "object: send each key once")
    assert jobs(db) == 0


def test_every_api_route_with_a_body_parses_it_strictly(operator):
    """Each route taking a JSON body (from the OpenAPI schema, so a new router is covered)
    refuses a repeated key before its body is validated."""
    schema = operator.get("/openapi.json").json()
    routes = [(method, re.sub(r"\{[^}]+\}", "1", path))
              for path, item in schema["paths"].items()
              for method, operation in item.items() if "requestBody" in operation]
    assert ("post", "/api/jobs") in routes and ("put", "/api/limits") in routes
    for method, path in routes:
        res = operator.request(method.upper(), path, content=b'{"a": 1, "a": 2}',
                               headers=JSON)
        assert res.status_code == 400, (method, path, res.text)
        assert "'a' twice" in res.json()["detail"], (method, path)


@pytest.mark.parametrize("body", [
    '{"kind": "email", "payload": ' + "9" * 5000 + "}",
    '{"kind": "email", "priority": ' + "9" * 5000 + "}",
])
def test_an_integer_too_long_to_read_is_a_clear_400(operator, db, body):
    res = operator.post("/api/jobs", content=body, headers=JSON)
    assert res.status_code == 400
    assert res.json()["detail"].startswith("request body has an integer of more than 4300 "
                                           "digits, which is not read")
    assert jobs(db) == 0
    res = operator.put("/api/limits", headers=JSON, content='{"scope": "kind", "key": "k", '
                       '"max_running": ' + "9" * 5000 + "}")
    assert res.status_code == 400 and "more than 4300 digits" in res.json()["detail"]


@pytest.mark.parametrize("query", ["tenant=%FF", "tenant=a%ED%A0%80", "key=caf%E9",
                                   "kind=%C3"])
def test_a_query_value_that_is_not_utf8_is_refused_not_replaced(operator, client, query):
    client.schedule("email", tenant="\ufffd")  # what U+FFFD in its place would have matched
    res = operator.get(f"/api/jobs?{query}")
    assert res.status_code == 400
    name = query.split("=")[0]
    assert res.json()["detail"].startswith(f"query parameter '{name}' is not UTF-8 text "
                                           "once %-decoded")
    res = operator.delete("/api/limits?scope=tenant&key=%FF")
    assert res.status_code == 400 and "'key' is not UTF-8" in res.json()["detail"]
    # Text that is UTF-8, percent-encoded or in a form's + for a space, still passes.
    assert operator.get("/api/jobs?tenant=%EF%BF%BD").json()["jobs"][0]["tenant"] == "\ufffd"
    assert operator.get("/api/jobs?tenant=caf%C3%A9+bar").status_code == 200


def _mistyped(digits: str) -> list[str]:
    """What int() reads as the same number: underscores, a sign, a space, full width."""
    full_width = "".join(chr(0xFF10 + int(d)) for d in digits)
    return [f"{digits[0]}_{digits[1:]}" if len(digits) > 1 else f"0_{digits}",
            f"+{digits}", f"%20{digits}", full_width]


@pytest.mark.parametrize("path", [
    "/api/jobs/{n}", "/api/jobs/{n}/explain", "/api/jobs?limit={n}", "/api/jobs?before_id={n}",
])
def test_a_number_in_a_url_is_decimal_digits_only(operator, client, path):
    """int() reads "1_0" as 10 and "+10", " 10" and full-width digits as 10 too: a
    mistyped id would have acted on another job (POST .../1_0/cancel cancelled job 10)."""
    job = client.schedule("email")
    for written in _mistyped(str(job.id)):
        res = operator.get(path.format(n=written))
        assert res.status_code == 422, (written, res.text)
        assert "is not a whole number in decimal digits" in res.text
    assert operator.get(path.format(n=job.id)).status_code == 200


def test_a_cancel_of_a_mistyped_id_cancels_nothing(operator, client):
    job = client.schedule("email", delay=3600)
    for written in _mistyped(str(job.id)):
        assert operator.post(f"/api/jobs/{written}/cancel").status_code == 422
    assert client.get(job.id).state.value == "scheduled"


@pytest.mark.parametrize(("number", "becomes", "why"), [
    ("1e-400", "0", "is out of a float's range"),
    ("-1e400", "infinity", "is out of a float's range"),
    ("1.00000000000000000001", "1.0", "has more digits than a float keeps"),
])
def test_a_number_a_float_would_not_keep_is_a_400_not_stored_changed(operator, db, number,
                                                                     becomes, why):
    res = operator.post("/api/jobs", content=f'{{"kind": "email", "payload": {{"x": '
                                             f'{number}}}}}'.encode(), headers=JSON)
    assert res.status_code == 400, res.text
    assert res.json()["detail"] == (f"request body: 'payload.x': the number {number} {why} "
                                    f"(it would be read as {becomes}): "
                                    "send it as a string: a payload keeps such a number only "
                                    "as text")
    assert jobs(db) == 0
    res = operator.post("/api/jobs", content=b'{"kind": "email", "timeout": '
                        b'30.00000000000000000001}', headers=JSON)
    assert res.json()["detail"].endswith("(it would be read as 30.0): send fewer digits")


@pytest.mark.parametrize(("body", "path"), [
    ('{"kind": "email", "delay": 1e400}', "'delay'"),
    ('{"kind": "email", "payload": [1, {"deep": [2, 1e-400]}]}', "'payload[1].deep[1]'"),
])
def test_a_lost_number_is_named_by_its_field(operator, db, body, path):
    res = operator.post("/api/jobs", content=body.encode(), headers=JSON)
    assert res.status_code == 400, res.text
    detail = res.json()["detail"]
    assert detail.startswith(f"request body: {path}: the number "), detail
    # A string is the way out in a payload; a delay as a string is refused (422).
    assert ("send it as a string" in detail) == ("payload" in path)
    res = operator.put("/api/tenants/weight", content=b'{"tenant": "acme", "weight": 1e400}',
                       headers=JSON)
    assert res.status_code == 400
    assert res.json()["detail"].endswith("no field takes a number that large or that small")
    assert jobs(db) == 0


@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_a_body_sent_compressed_is_415_naming_the_encoding(operator, db, encoding):
    """Nothing decodes it: a plain JSON body marked br was taken as it was, and a gzip one
    refused as "byte 0x8b ... is not UTF-8" (a bad-input walkthrough)."""
    body = gzip.compress(b'{"kind": "email"}') if encoding == "gzip" else b'{"kind": "email"}'
    res = operator.post("/api/jobs", content=body,
                        headers={**JSON, "Content-Encoding": encoding})
    assert res.status_code == 415
    assert res.json()["detail"] == (f"request body is sent with Content-Encoding: '{encoding}'"
                                    ", which is not decoded here: send it uncompressed, "
                                    "without that header")
    assert jobs(db) == 0
    res = operator.post("/api/jobs", content=b'{"kind": "email"}',
                        headers={**JSON, "Content-Encoding": "identity"})
    assert res.status_code == 201
