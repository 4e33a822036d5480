"""What make run says of the settings it inherits from the caller's shell."""

from __future__ import annotations

from devstack.run import inherited_settings, token_shown


def test_the_tock_settings_inherited_from_the_shell_are_named():
    shell = {"PATH": "/bin", "TOCK_QUEUES": "mine", "TOCK_DASHBOARD_PORT": "8081",
             "TOCK_DISPATCH_WINDOW": "10", "TOCK_LOG_LEVEL": "INFO"}
    own = {"TOCK_LOG_LEVEL": "DEBUG"}  # what make run sets itself wins: not passed on
    assert inherited_settings(shell, own) == ["TOCK_DISPATCH_WINDOW", "TOCK_QUEUES"]
    assert inherited_settings({"PATH": "/bin"}, own) == []


def test_a_token_from_the_shell_is_named_not_printed_and_the_dev_one_shown_otherwise():
    name = "TOCK_DASHBOARD_OPERATOR_TOKEN"
    assert token_shown({name: "s3cret-of-mine"}, name, "dev-operator-token") == f"your {name}"
    assert token_shown({name: ""}, name, "dev-operator-token") == "dev-operator-token"
    assert token_shown({}, name, "dev-operator-token") == "dev-operator-token"
