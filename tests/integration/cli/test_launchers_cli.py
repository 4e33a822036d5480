"""`tock timer` and `tock consumer` take the process's own options, --help included, as
`python -m timer_service` and `python -m consumer` do."""

from __future__ import annotations


def test_consumer_options_reach_the_consumer(tock):
    code, _, err = tock("consumer", "--tasks", "no_such_module_anywhere")
    assert code == 2
    assert "cannot import task module 'no_such_module_anywhere'" in err


def test_consumer_help_is_the_consumers(tock):
    code, out, _ = tock("consumer", "--help")
    assert code == 0
    assert out.startswith("usage: tock consumer") and "--tasks MODULE" in out


def test_timer_help_and_unknown_options(tock):
    code, out, _ = tock("timer", "--help")
    assert code == 0 and out.startswith("usage: tock timer")
    code, _, err = tock("timer", "--no-such-option")
    assert code == 2 and "unrecognized arguments: --no-such-option" in err


def test_both_are_listed_in_tock_help(tock):
    code, out, _ = tock("--help")
    assert code == 0
    assert "run a timer instance" in out and "run a consumer" in out
