"""`tock enqueue --payload-file PATH|-`: a payload too large for the command line read from
a file or standard input, with errors that say what is wrong with the file. The client is
a fake that records what it was asked to schedule."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from cli import connect, jobs
from cli.main import main

BIG = {"blob": "x" * (200 * 1024), "n": [1, 2.5, None, True], "é": "ü ✓"}


class FakeClient:
    def __init__(self) -> None:
        self.payloads: list[object] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def schedule(self, kind: str, payload: object, **_: object) -> SimpleNamespace:
        self.payloads.append(payload)
        return SimpleNamespace(id=1, kind=kind, queue="default", created=True,
                               run_at=datetime(2027, 1, 1, tzinfo=UTC))


@pytest.fixture
def fake(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(connect, "client", lambda args: client)
    return client


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_a_large_payload_from_a_file(fake, tmp_path, capsys):
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(BIG, indent=2), encoding="utf-8")
    assert main(["enqueue", "email", "--payload-file", str(path)]) == 0
    assert fake.payloads == [BIG]
    assert capsys.readouterr().out.startswith("enqueued job 1 (email)")


def test_a_payload_from_standard_input(fake, monkeypatch):
    _stdin(monkeypatch, b"\xef\xbb\xbf" + json.dumps(BIG).encode())  # a BOM is allowed
    assert main(["enqueue", "email", "--payload-file", "-"]) == 0
    assert fake.payloads == [BIG]


def test_standard_input_without_a_byte_buffer(fake, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"to": "a@b"}'))
    assert main(["enqueue", "email", "--payload-file", "-"]) == 0
    assert fake.payloads == [{"to": "a@b"}]


def test_payload_and_payload_file_are_exclusive(fake, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["enqueue", "email", "--payload", "{}", "--payload-file", str(tmp_path)])
    assert info.value.code == 2
    assert "not allowed with argument --payload" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "says"), [
    (None, "does not exist"),
    (b"", "is empty; it should hold the payload as JSON"),
    (b"  \n", "is empty"),
    (b'{"to": ', "is not JSON: Expecting value"),
    (b'{"to": "\xff"}', "is not valid UTF-8 text (byte 0xFF at offset 8)"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_bad_files_say_what_is_wrong(fake, tmp_path, capsys, content, says):
    path = tmp_path / "payload.json"
    if content is not None:
        path.write_bytes(content)
    assert main(["enqueue", "email", "--payload-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tock: --payload-file: {path}") and says in err, err
    assert fake.payloads == []


def test_a_directory_or_an_unreadable_file(fake, tmp_path, capsys, monkeypatch):
    assert main(["enqueue", "email", "--payload-file", str(tmp_path)]) == 2
    assert "is a directory, not a file" in capsys.readouterr().err

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("builtins.open", refuse)
    assert main(["enqueue", "email", "--payload-file", "p.json"]) == 2
    assert capsys.readouterr().err == "tock: --payload-file: cannot read p.json: " \
                                      "Permission denied\n"


def test_reading_stops_past_the_cap(fake, monkeypatch, capsys):
    monkeypatch.setattr(jobs, "MAX_PAYLOAD_FILE_BYTES", 10)
    _stdin(monkeypatch, b'{"blob": "' + b"x" * 20 + b'"}')
    assert main(["enqueue", "email", "--payload-file", "-"]) == 2
    assert "standard input is over" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "key"), [
    ('{"a": 1, "a": 2}', "'a'"),
    ('{"to": "x", "opts": [{"id": 1, "id": 1}]}', "'id'"),
    ('{"\\u00e9": 1, "é": 2}', "'é'"),  # the same key, once escaped
])
def test_a_key_given_twice_is_refused_naming_it(fake, tmp_path, capsys, text, key):
    # json.loads would keep the last value and drop the other without a word
    assert main(["enqueue", "email", "--payload", text]) == 2
    assert capsys.readouterr().err == f"tock: --payload has the key {key} twice in one " \
                                      "object; give each key once\n"
    path = tmp_path / "payload.json"
    path.write_text(text, encoding="utf-8")
    assert main(["enqueue", "email", "--payload-file", str(path)]) == 2
    assert f"tock: --payload-file: {path} has the key {key} twice" in capsys.readouterr().err
    assert fake.payloads == []


def test_the_same_key_in_different_objects_is_fine(fake):
    text = '{"a": {"id": 1}, "b": {"id": 2}, "c": [{"id": 3}, {"id": 4}]}'
    assert main(["enqueue", "email", "--payload", text]) == 0
    assert fake.payloads == [json.loads(text)]
