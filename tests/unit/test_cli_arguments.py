"""The CLI's argument types: `--at`/`--since`/`--until` times, whose hints must name values
the parser then accepts, and filter values, where '' is refused rather than meaning "no
filter". Nothing here reaches a database: argparse refuses before a command runs."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

import pytest

from cli.arguments import parse_time
from cli.main import build_parser, main

# What a suggested time looks like in a message: a date, T, a time, then Z or an offset.
SUGGESTED = re.compile(r"\b\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:\d{2})")

REFUSED = [
    "2027-01-01", "20270101", "2027-01-01Z", "2027-01-01z", "2027-01-01+00:00",
    "2027-01-01-05:00", "2027-01-01+05", "20270101+0530", "2027-01-01+99:99",
    "2027-01-01T00:00", "2027-01-01T09:30:15.250", "2027-01-01 10:00", "20270101T1000",
    "2027-01-01T00:00:00+00:00+00:00", "2027-01-01-05:00+02:00", "2027-13-01", "nope", "",
    "0001-01-01T00:00+01:00",
]


def _refusal(text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_time(text)
    return str(info.value)


@pytest.mark.parametrize("text", [
    "2027-01-01T05:00:00xZ", "2027-01-01x05:00Z", "2027-01-01T05:00:00 +09:00",
    "2027-01-01+05:00+01:00", "2027-01-01T00:00:00\x00Z", "2027-01-01T05:00:00.123456789Z"])
def test_a_time_python_would_read_as_another_is_refused(text):
    """fromisoformat takes each of these as some instant (a stray character, a second
    offset, nanoseconds cut): `--at` would have used that one."""
    assert "is not an ISO 8601 time" in _refusal(text)


def test_more_than_six_decimals_of_a_second_says_so():
    assert _refusal("2027-01-01T05:00:00.1234567Z").endswith(
        "(seconds take at most 6 decimals)")
    assert "decimals" not in _refusal("2027-01-01T05:00:00xZ")


@pytest.mark.parametrize(("text", "says"), [
    ("2027-02-29T00:00Z", "is not a real date and time: day is out of range for month"),
    ("2027-01-01T24:00:00Z", "is not a real date and time: hour must be in 0..23"),
    ("2027-01-01T23:59:60Z", "is not a real date and time: second must be in 0..59 (leap "
                             "seconds are not kept: write :59)"),
    ("2027-01-01T00:00:00+25:00", "is not a real date and time: its UTC offset is out of "
                                  "range (offsets run from -23:59 to +23:59)"),
])
def test_a_time_of_the_right_shape_that_does_not_exist_says_which_part(text, says):
    assert f"{text!r} {says}" in _refusal(text)


@pytest.mark.parametrize("text", ["2027-01-01T05:00Z", "2027-01-01 05:00:00+09:00",
                                  "20270101T0500Z", "2027-01-01T05:00:00.5-03:30",
                                  "2027-01-01t05Z"])
def test_iso_8601_times_in_their_usual_shapes_are_accepted(text):
    assert parse_time(text).tzinfo is not None


@pytest.mark.parametrize("text", REFUSED)
def test_every_suggested_time_is_accepted(text):
    message = _refusal(text)
    for example in SUGGESTED.findall(message.replace(repr(text), "")):  # not the input
        assert parse_time(example).tzinfo is not None, (text, example)
    assert "datetime" not in message and "None" not in message


@pytest.mark.parametrize(("text", "suggestions"), [
    ("2027-01-01", ["2027-01-01T00:00:00+00:00", "2027-01-01T00:00Z"]),
    ("2027-01-01Z", ["2027-01-01T00:00:00Z"]),
    ("2027-01-01+00:00", ["2027-01-01T00:00:00+00:00"]),
    ("2027-01-01-05", ["2027-01-01T00:00:00-05:00"]),
    ("20270101+0530", ["2027-01-01T00:00:00+05:30"]),
    ("2027-01-01T09:30", ["2027-01-01T09:30:00+00:00", "2027-01-01T09:30:00Z"]),
])
def test_hints_keep_the_date_time_and_zone_given(text, suggestions):
    assert SUGGESTED.findall(_refusal(text)) == suggestions


def test_a_date_with_a_timezone_but_no_time_is_refused_with_the_reason():
    # Python would read 2027-01-01-05:00 as 05:00 on a naive date; ISO 8601 has no such form.
    assert "has a timezone but no time of day" in _refusal("2027-01-01-05:00")
    assert "has a timezone but no time of day" in _refusal("2027-01-01Z")
    assert "without a time of day or timezone" in _refusal("2027-01-01")


@pytest.mark.parametrize(("text", "expected"), [
    ("2027-01-01T00:00Z", datetime(2027, 1, 1, tzinfo=UTC)),
    ("2027-01-01T00:00:00+00:00", datetime(2027, 1, 1, tzinfo=UTC)),
    ("2027-01-01 09:00+02:00", datetime(2027, 1, 1, 7, tzinfo=UTC)),
    ("20270101T0000Z", datetime(2027, 1, 1, tzinfo=UTC)),
    ("2027-01-01T00:00-05:00", datetime(2027, 1, 1, 5, tzinfo=UTC)),
])
def test_times_with_a_timezone_come_back_in_utc(text, expected):
    value = parse_time(text)
    assert value == expected and value.utcoffset() == timedelta(0)
    assert value.tzinfo is UTC


@pytest.mark.parametrize("argv", [
    ["jobs", "--tenant", ""], ["jobs", "--kind", ""], ["jobs", "--queue", ""],
    ["jobs", "--key", ""], ["jobs", "--state", ""], ["jobs", "--state", " , "],
    ["retry", "--tenant", "", "--dry-run"], ["cancel", "--state", "", "--dry-run"],
    ["enqueue", "email", "--payload-file", ""],
])
def test_empty_filter_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "the value is empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["limits", "set", "tenant", "", "--max-running", "0"], ["limits", "remove", "tenant", ""],
])
def test_an_empty_tenant_is_refused_before_the_no_tenant_limit_is_touched(argv, capsys):
    """An unset shell variable ("$TENANT") must not pause every job without a tenant."""
    assert main([*argv, "--database-url", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    assert "the tenant is empty: for the jobs without a tenant, say --no-tenant" \
        in capsys.readouterr().err


def test_a_mistyped_setting_is_named_as_the_processes_name_it(monkeypatch, capsys):
    monkeypatch.setenv("TOCK_DATABSE_URL", "postgresql://somewhere/else")
    main(["stats", "--database-url", "postgresql://nobody@127.0.0.1:1/none"])
    assert ("tock: note: TOCK_DATABSE_URL is set but no tock setting has that name; did "
            "you mean TOCK_DATABASE_URL?") in capsys.readouterr().err


def test_tock_dashboard_leaves_the_mistyped_setting_to_the_dashboard_s_own_warning(
        monkeypatch, capsys):
    """The dashboard logs `unknown_setting` at its start, as every process does: the CLI's
    note would say it twice."""
    monkeypatch.setenv("TOCK_DASHBOARD_PORTT", "1")
    monkeypatch.setattr("cli.cluster._dashboard", lambda args: 0)  # not the server itself
    assert main(["dashboard", "--port", "8098"]) == 0
    assert "TOCK_DASHBOARD_PORTT" not in capsys.readouterr().err


@pytest.mark.parametrize("states", ["dead,", "dead,,cancelled", ",dead"])
def test_a_state_list_with_an_empty_name_is_a_usage_error(states, capsys):
    with pytest.raises(SystemExit) as info:
        main(["jobs", "--state", states])
    assert info.value.code == 2
    assert "has an empty state name between its commas" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["601", "1e9"])
def test_a_lock_timeout_past_the_give_up_time_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["migrate", "--lock-timeout", value, "--database-url", URL])
    assert info.value.code == 2
    assert "must be at most 600 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--since", "--until"])
def test_time_filters_say_what_to_write(flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(["jobs", flag, "2027-01-01"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '2027-01-01' is a date without a time of day" in err
    assert f"{flag}: {flag}" not in err  # the name once, from argparse


URL = "postgresql://me@db.example:5432/tock"


@pytest.mark.parametrize(("argv", "json_flag"), [
    (["limits", "--database-url", URL, "--json", "set", "kind", "k", "--max-running", "1"],
     True),
    (["limits", "--database-url", URL, "--json", "list"], True),
    (["limits", "--database-url", URL, "remove", "kind", "k"], False),
    (["limits", "list", "--database-url", URL, "--json"], True),
    (["tenants", "--database-url", URL, "--json", "list"], True),
    (["tenants", "--database-url", URL, "weight", "acme", "2"], False),
    (["tenants", "--database-url", URL, "reset", "--no-tenant"], False),
    (["tenants", "reset", "acme", "--database-url", URL], False),
    (["schedules", "--database-url", URL, "--json", "show", "nightly"], True),
    (["schedules", "show", "nightly", "--database-url", URL, "--json"], True),
    # README: these take --json before or after the action, each of them.
    (["limits", "remove", "kind", "k", "--database-url", URL, "--json"], True),
    (["limits", "--json", "remove", "kind", "k", "--database-url", URL], True),
    (["tenants", "weight", "acme", "2", "--database-url", URL, "--json"], True),
    (["tenants", "--json", "--database-url", URL, "weight", "acme", "2"], True),
    (["tenants", "reset", "--no-tenant", "--json", "--database-url", URL], True),
])
def test_options_before_or_after_the_action_are_kept(argv, json_flag):
    args = build_parser().parse_args(argv)
    assert args.database_url == URL
    assert args.json is True or not json_flag


def test_an_option_after_the_action_wins_over_one_before():
    args = build_parser().parse_args(["limits", "--database-url", "postgresql://a@x/a",
                                      "list", "--database-url", URL])
    assert args.database_url == URL


@pytest.mark.parametrize("argv", [
    ["stats"], ["jobs"], ["migrate"], ["limits"], ["limits", "list"],
    ["limits", "remove", "kind", "k"], ["tenants"], ["tenants", "weight", "a", "2"],
    ["schedules", "list"], ["workers"], ["cancel", "1"],
])
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_database_url_is_a_usage_error(argv, value, capsys):
    # '' used to mean "not given": the command ran against TOCK_DATABASE_URL's database
    with pytest.raises(SystemExit) as info:
        main([*argv, "--database-url", value])
    assert info.value.code == 2
    assert "argument --database-url: the value is empty" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["migrate", "stats", "schedules"])
def test_a_bad_database_url_is_blamed_on_the_option(command, monkeypatch, capsys):
    monkeypatch.setenv("TOCK_DATABASE_URL", URL)
    with pytest.raises(SystemExit) as info:
        main([command, "--database-url", "host=x password=hush garbage",
              *(["list"] if command == "schedules" else [])])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert ("argument --database-url: 'host=x password=*** garbage' is not a Postgres "
            "connection URL") in err
    assert "TOCK_DATABASE_URL" not in err and "hush" not in err


@pytest.mark.parametrize(("value", "says"), [
    ("-1", "must be a finite number of seconds above 0, got '-1'"),
    ("0", "above 0, got '0'"), ("nan", "got 'nan'"), ("inf", "got 'inf'"),
    ("-inf", "got '-inf'"), ("soon", "'soon' is not a number of seconds"),
])
def test_stale_seconds_must_be_a_positive_finite_number(value, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(["workers", f"--stale-seconds={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --stale-seconds: " in err and says in err, err


def test_stale_seconds_takes_a_fraction():
    assert build_parser().parse_args(["workers", "--stale-seconds", "2.5"]).stale_seconds == 2.5


@pytest.mark.parametrize(("argv", "usage"), [
    (["schedules", "list", "--bogus"], "usage: tock schedules list"),
    (["tenants", "weight", "acme", "2", "--bogus"], "usage: tock tenants weight"),
    (["limits", "remove", "kind", "mail", "--bogus"], "usage: tock limits remove"),
    (["jobs", "--bogus", "x"], "usage: tock jobs"),
])
def test_an_unknown_option_is_named_with_the_usage_of_the_action_it_followed(
        argv, usage, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(usage), err
    assert f"unrecognized arguments: {' '.join(argv[argv.index('--bogus'):])}" in err


@pytest.mark.parametrize("command", ["schedules", "tenants", "limits"])
def test_help_shows_the_action_as_optional_as_it_is(command, capsys):
    """With no action these list; their usage line said `ACTION ...` as if required."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert f"usage: tock {command} [-h] [--database-url URL] [--json] [ACTION] ..." in out
    assert "actions (none: list)" in out
    assert out.split("\n\n")[1].strip(), "a description under the usage line"


NUMERIC_OPTIONS = [
    (["enqueue", "email"], "--delay"), (["enqueue", "email"], "--priority"),
    (["enqueue", "email"], "--max-attempts"), (["enqueue", "email"], "--timeout"),
    (["jobs"], "--limit"), (["jobs"], "--before-id"), (["workers"], "--stale-seconds"),
    (["migrate"], "--lock-timeout"), (["schedules", "preview", "nightly"], "-n"),
    (["limits", "set", "kind", "email"], "--max-running"),
    (["limits", "set", "kind", "email"], "--rate"),
    (["limits", "set", "kind", "email", "--rate", "1"], "--per"),
    (["limits", "set", "kind", "email", "--rate", "1"], "--burst"),
    (["dashboard"], "--port"),
]


@pytest.mark.parametrize("written", ["1_000", " 5", "5 ", "+5", "\uff15", "\u0665"])
@pytest.mark.parametrize(("command", "option"), NUMERIC_OPTIONS)
def test_numbers_python_would_bend_are_usage_errors(command, option, written, capsys):
    """int() and float() read each of these as a number (1000, 5, ...); the HTTP API
    refuses them, and so does every numeric option."""
    with pytest.raises(SystemExit) as info:
        main([*command, option, written, "--database-url", URL])
    assert info.value.code == 2
    assert f"argument {option}: {written!r} is not " in capsys.readouterr().err


@pytest.mark.parametrize("written", ["1_000", " 5", "+5", "\uff15"])
@pytest.mark.parametrize("argv", [["show"], ["retry"], ["cancel"], ["tenants", "weight", "a"]])
def test_job_ids_and_weights_python_would_bend_are_usage_errors(argv, written, capsys):
    try:
        code = main([*argv, written, "--database-url", URL])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert repr(written) in capsys.readouterr().err


@pytest.mark.parametrize(("option", "written", "value"), [
    ("--delay", "1000", 1000.0), ("--delay", "0.5", 0.5), ("--delay", ".5", 0.5),
    ("--timeout", "1e3", 1000.0), ("--priority", "7", 7), ("--max-attempts", "-1", -1)])
def test_plain_numbers_are_read(option, written, value):
    args = build_parser().parse_args(["enqueue", "email", option, written])
    assert getattr(args, option[2:].replace("-", "_")) == value


@pytest.mark.parametrize(("argv", "says"), [
    (["--database-url", "postgresql://x@127.0.0.1:1/y", "stats"],
     "--database-url goes after the command: tock stats --database-url "
     "postgresql://x@127.0.0.1:1/y"),
    (["--json", "stats"], "--json goes after the command: tock stats --json"),
    (["--json"], "--json goes after a command, as in: tock stats --json ..."),
    # One no command takes is not sent after one (which then said "unrecognized").
    (["-v"], "no tock command takes -v: tock --help lists the commands"),
    (["--foo", "stats"], "no tock command takes --foo"),
])
def test_an_option_before_the_command_is_shown_where_it_goes(argv, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["jobs", "--stat", "dead"],
                                  ["retry", "--state", "dead", "--y"],
                                  ["schedules", "list", "--js"]])
def test_abbreviated_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--database-url", "postgresql://nobody@127.0.0.1:1/none"])
    assert info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "option"), [
    (["cancel", "--kind", "email", "--kind", "sync", "--dry-run"], "--kind"),
    (["retry", "--queue", "a", "--queue", "b", "--dry-run"], "--queue"),
    (["jobs", "--tenant", "a", "--tenant", "b"], "--tenant"),
    (["jobs", "--since", "2027-01-01T00:00Z", "--since", "2027-02-01T00:00Z"], "--since"),
    (["enqueue", "email", "--payload", '{"a": 1}', "--payload", '{"b": 2}'], "--payload"),
    (["enqueue", "email", "--key", "k-a", "--key", "k-b"], "--key"),
    (["enqueue", "email", "--priority", "1", "--priority", "9"], "--priority"),
    (["enqueue", "email", "--delay", "5", "--delay", "600"], "--delay"),
    (["limits", "set", "kind", "k", "--max-running", "1", "--max-running", "2"],
     "--max-running"),
])
def test_a_single_value_option_given_twice_is_refused(argv, option, capsys):
    # Kept last, `cancel --kind email --kind sync` cancelled the sync jobs alone.
    with pytest.raises(SystemExit) as info:
        main([*argv, "--database-url", "postgresql://nobody@127.0.0.1:1/none"])
    assert info.value.code == 2
    assert f"{option} was given more than once; it takes one value" in capsys.readouterr().err


def test_states_may_be_repeated():
    args = build_parser().parse_args(["jobs", "--state", "dead", "--state", "scheduled"])
    assert len(args.state) == 2


def test_tock_version_says_the_installed_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("tock 0.")
