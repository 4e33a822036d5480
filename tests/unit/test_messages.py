"""SQS message bodies: whatever arrives, `decode` returns a JobMessage or raises
InvalidMessage, never another error."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.errors import InvalidMessage
from shared.core.messages import MAX_BODY_BYTES, MAX_JOB_ID, VERSION, JobMessage, decode

TOKEN = "0b7f7a52-4a35-4c1e-9c55-0d3d6f7d3a10"
GOOD = {"v": VERSION, "job": 42, "token": TOKEN, "kind": "email.send"}
class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def body(**changes):
    data = dict(GOOD)
    for key, value in changes.items():
        if value is MISSING:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


def test_a_good_message_decodes():
    assert decode(body()) == JobMessage(42, uuid.UUID(TOKEN), "email.send")


@pytest.mark.parametrize("message", [
    JobMessage(1, uuid.uuid4(), "a"),
    JobMessage(MAX_JOB_ID, uuid.uuid4(), "billing:invoice-v2.send_"),
    JobMessage(7, uuid.UUID(int=0), "_" + "k" * 127),
])
def test_encode_round_trips(message):
    assert decode(message.encode()) == message


@pytest.mark.parametrize("value", [None, b'{"v":1}', bytearray(b"{}"), 1, 1.5, ["x"],
                                   {"v": 1}], ids=repr)
def test_a_body_that_is_not_text_is_refused(value):
    with pytest.raises(InvalidMessage, match="not text"):
        decode(value)


def test_a_too_long_body_is_refused():
    padded = json.dumps({**GOOD, "pad": "x" * MAX_BODY_BYTES})
    with pytest.raises(InvalidMessage, match="at most"):
        decode(padded)


def test_absurdly_nested_json_is_refused():
    with pytest.raises(InvalidMessage):
        decode("[" * 5000 + "]" * 5000)  # too long anyway


def test_short_but_deep_json_is_refused_not_a_recursion_error():
    deep = "[" * 2000 + "]" * 2000
    assert len(deep) <= MAX_BODY_BYTES
    with pytest.raises(InvalidMessage):
        decode(deep)


def test_a_deep_value_inside_an_object_is_refused():
    deep = json.dumps({**GOOD, "kind": "KIND"}).replace('"KIND"', "[" * 1900 + "]" * 1900)
    assert len(deep) <= MAX_BODY_BYTES
    with pytest.raises(InvalidMessage):
        decode(deep)


@pytest.mark.parametrize("text", ["", " ", "{", "not json", '{"v":1', "\x00", "\ud800",
                                  "{'v': 1}", '{"v":1}garbage', "NaN-ish"], ids=repr)
def test_text_that_is_not_json_is_refused(text):
    with pytest.raises(InvalidMessage):
        decode(text)


@pytest.mark.parametrize("text", ["[]", "[1,2]", '"text"', "1", "null", "true", "1.5"])
def test_json_that_is_not_an_object_is_refused(text):
    with pytest.raises(InvalidMessage, match="not a JSON object"):
        decode(text)


@pytest.mark.parametrize("version", [MISSING, None, 0, 2, "1", [1], True], ids=repr)
def test_a_wrong_version_is_refused(version):
    with pytest.raises(InvalidMessage, match="version"):
        decode(body(v=version))


@pytest.mark.parametrize("job", [MISSING, None, True, False, 1.0, 42.5, 0, -1, -(2**63),
                                 2**63, 10**20, "42", [42], {"id": 42}], ids=repr)
def test_a_bad_job_id_is_refused(job):
    with pytest.raises(InvalidMessage, match="job id"):
        decode(body(job=job))


@pytest.mark.parametrize(("job", "shown"), [(-1, "got -1"), ("5", 'got "5"'),
                                             (None, "got null"), (1.5, "got 1.5"),
                                             ("\u202e1", 'got "\\u202e1"')])
def test_a_bad_job_id_is_shown_as_json_wrote_it(job, shown):
    """A number bare and a string quoted: a wrong type and a number out of range read
    differently in the drop's log line; nothing in it can drive a terminal."""
    with pytest.raises(InvalidMessage) as refused:
        decode(body(job=job))
    assert str(refused.value).endswith(shown)


def test_the_largest_bigint_job_id_is_accepted():
    assert decode(body(job=2**63 - 1)).job_id == 2**63 - 1


def test_a_job_id_with_thousands_of_digits_is_refused():
    text = body(job=0).replace('"job": 0', '"job": ' + "9" * 3000)
    assert len(text) <= MAX_BODY_BYTES
    with pytest.raises(InvalidMessage, match="job id"):
        decode(text)


@pytest.mark.parametrize("token", [MISSING, None, 123, True, ["x"], {"t": TOKEN}, "",
                                   "not-a-uuid", TOKEN[:-1], TOKEN + "0", "\ud800",
                                   "g" * 32], ids=repr)
def test_a_bad_token_is_refused(token):
    with pytest.raises(InvalidMessage, match="token"):
        decode(body(token=token))


@pytest.mark.parametrize("kind", [MISSING, None, "", 7, True, ["email"], {"k": "v"},
                                  "has space", "1starts-with-digit", "-dash", "a/b",
                                  "k" * 129, "\ud800", "email\ud800", "é", "email\x00",
                                  "email\n"], ids=repr)
def test_a_bad_kind_is_refused(kind):
    with pytest.raises(InvalidMessage, match="kind"):
        decode(body(kind=kind))


def test_a_lone_surrogate_escaped_in_json_is_refused():
    text = body(kind="KIND").replace('"KIND"', '"\\ud800"')
    with pytest.raises(InvalidMessage, match="kind"):
        decode(text)


def decodes_or_refuses(text):
    try:
        result = decode(text)
    except InvalidMessage:
        return None
    assert isinstance(result, JobMessage)
    return result


@given(st.text())
def test_any_text_decodes_or_is_refused(text):
    decodes_or_refuses(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30)


@given(json_values)
def test_any_json_decodes_or_is_refused(value):
    decodes_or_refuses(json.dumps(value))


@given(st.fixed_dictionaries({}, optional={
    "v": st.one_of(st.just(VERSION), json_values),
    "job": st.one_of(st.integers(), json_values),
    "token": st.one_of(st.uuids().map(str), st.text(), json_values),
    "kind": st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,140}", fullmatch=True),
                      json_values),
}))
def test_any_message_shaped_json_decodes_or_is_refused(data):
    result = decodes_or_refuses(json.dumps(data))
    if result is not None:
        assert 1 <= result.job_id <= MAX_JOB_ID
        assert type(result.job_id) is int
        assert isinstance(result.token, uuid.UUID)
        assert len(result.kind) <= 128


def test_tenant_and_priority_round_trip_and_are_left_out_when_default():
    message = JobMessage(5, uuid.UUID(TOKEN), "k", "acme", 7)
    assert decode(message.encode()) == message
    plain = JobMessage(5, uuid.UUID(TOKEN), "k", None, 0)
    assert json.loads(plain.encode()).keys() == {"v", "job", "token", "kind"}
    assert json.loads(JobMessage(5, uuid.UUID(TOKEN), "k", "").encode()).keys() == {
        "v", "job", "token", "kind"}


def test_a_body_without_tenant_or_priority_still_decodes():
    assert decode(body()) == JobMessage(42, uuid.UUID(TOKEN), "email.send", None, 0)


def test_a_tenant_longer_than_allowed_is_cut_when_sent():
    long = "t" * 300
    assert decode(JobMessage(5, uuid.UUID(TOKEN), "k", long).encode()).tenant == long[:128]


@pytest.mark.parametrize("tenant", [None, "", 7, True, ["a"], {"t": 1}, "t" * 129, "\ud800",
                                    "a\x00"], ids=repr)
def test_a_bad_tenant_is_refused(tenant):
    if tenant is None:  # null: as good as absent
        assert decode(body(tenant=tenant)).tenant is None
        return
    with pytest.raises(InvalidMessage, match="tenant"):
        decode(body(tenant=tenant))


@pytest.mark.parametrize("priority", [None, True, -1, 10, 1.0, "3", [1]], ids=repr)
def test_a_bad_priority_is_refused(priority):
    with pytest.raises(InvalidMessage, match="priority"):
        decode(body(pri=priority))
