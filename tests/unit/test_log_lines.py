"""The processes' log lines: JSON with a millisecond UTC timestamp, and a consumer's lines
for a batch of outcomes written with one write, not one write per job."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from shared.runtime.logs import HumanFormatter, JsonFormatter, emit, line_handler, one_write


class CountingStream(io.StringIO):
    """A stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, CountingStream]]:
    stream = CountingStream()
    handler = line_handler(stream, "json", "test")
    log = logging.getLogger("tock.test-lines")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield log, stream
    finally:
        log.removeHandler(handler)
        log.propagate = True


def _events(stream: CountingStream) -> list[str]:
    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


def test_a_batch_of_lines_is_held_and_written_at_once(logged):
    log, stream = logged
    with one_write():
        for job_id in range(50):
            emit(log, "job_succeeded", job_id=job_id)
        assert stream.writes == 0, "held until the block ends"
    assert stream.writes == 1
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["job_id"] for line in lines] == list(range(50))


def test_outside_a_block_each_line_is_written_at_once(logged):
    log, stream = logged
    emit(log, "job_succeeded", job_id=1)
    assert _events(stream) == ["job_succeeded"]
    emit(log, "job_failed", logging.WARNING, job_id=2)
    assert stream.writes == 2


def test_nested_blocks_write_once_at_the_outer_end(logged):
    log, stream = logged
    with one_write():
        emit(log, "a")
        with one_write():
            emit(log, "b")
        assert stream.writes == 0
    assert stream.writes == 1
    assert _events(stream) == ["a", "b"]


def test_lines_held_before_an_exception_are_still_written(logged):
    log, stream = logged
    with pytest.raises(RuntimeError), one_write():
        emit(log, "job_succeeded", job_id=7)
        raise RuntimeError("the batch broke")
    assert _events(stream) == ["job_succeeded"]
    emit(log, "after")  # and the thread no longer holds its lines
    assert stream.writes == 2


@pytest.mark.parametrize("created", [0.0, 1_764_000_000.0, 1_764_000_000.9996,
                                     1_764_000_001.25, 1_764_000_000.0005])
def test_the_timestamp_is_utc_to_the_millisecond(created):
    record = logging.LogRecord("tock.x", logging.INFO, __file__, 1, "m", (), None)
    record.created = created
    stamp = json.loads(JsonFormatter().format(record))["ts"]
    whole = int(created)
    expected = (datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
                + f".{int((created - whole) * 1000):03d}+00:00")
    assert stamp == expected
    assert datetime.fromisoformat(stamp).tzinfo is not None


def test_a_library_records_extra_fields_still_appear():
    record = logging.LogRecord("botocore", logging.WARNING, __file__, 1, "retrying %s",
                               ("SendMessage",), None)
    record.attempt = 3
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "retrying SendMessage"
    assert line["attempt"] == 3
    assert line["event"] == "log"


class BrokenStream(io.StringIO):
    """A stream whose reader went away (EPIPE)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_stream_that_fails_does_not_break_the_batch(monkeypatch, capsys):
    # The completer logs its batch inside one_write: a dead stderr must not raise into it.
    monkeypatch.setattr(logging, "raiseExceptions", True)  # report it, as logging does
    handler = line_handler(BrokenStream(), "json", "test")
    log = logging.getLogger("tock.test-broken")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        with one_write():
            emit(log, "job_succeeded", job_id=1)
            emit(log, "job_succeeded", job_id=2)
        emit(log, "after")  # outside a block too
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert "Broken pipe" in capsys.readouterr().err


def test_a_human_log_entry_is_one_line_whatever_its_message_holds():
    """libpq's hint comes on a line of its own ("\\n\\tIs the server running ..."): a chaos
    walkthrough found such second lines in `make run`'s log without a time or process."""
    pool = logging.LogRecord("psycopg.pool", logging.WARNING, "", 0,
                             "error connecting: refused\n\tIs the server running?", (), None)
    ours = logging.LogRecord("tock.timer", logging.WARNING, "", 0, "x", (), None)
    ours.event = "loop_failed"
    ours.fields = {"error": "connection failed\n\tIs the server running?"}
    for record in (pool, ours):
        line = HumanFormatter("timer").format(record)
        assert "\n" not in line and "Is the server running?" in line, line


def test_a_human_log_line_keeps_a_detail_whole_and_cuts_other_long_fields():
    """A walkthrough read `queue_recreated`'s detail as "... the messages it held are...":
    the part saying what happens next was cut."""
    record = logging.LogRecord("tock.sqs", logging.WARNING, "", 0, "x", (), None)
    record.event = "queue_recreated"
    detail = "the queue was gone " + "and is created again " * 10 + "THE END"
    record.fields = {"queue": "q" * 200, "detail": detail}
    line = HumanFormatter("timer").format(record)
    assert json.dumps(detail) in line
    assert f"queue={'q' * 117}..." in line
