"""The `tock` fixture: the operator commands run in-process through cli.main.main (the
same function the `tock` entry point calls), on the test's database, with no terminal."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from cli.main import main


@pytest.fixture
def tock(database_url, capsys, monkeypatch):
    monkeypatch.setenv("TOCK_DATABASE_URL", database_url)
    # A command that configures logging (TOCK_LOG_LEVEL, `tock dashboard`) points the
    # root handler at this test's captured stderr, closed once the test ends: later tests
    # would get "--- Logging error ---" in theirs. Undone after each test; the audit lines
    # themselves are tested with the CLI as a process (test_audit_cli.py).
    monkeypatch.delenv("TOCK_LOG_LEVEL", raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", root.handlers[:])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: no prompts

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err
    return run
