"""What a process says when it cannot use its database at start."""

from __future__ import annotations

from shared.runtime import startup

URL = "postgresql://me:secret@db:5432/tock"


def test_a_full_server_is_not_blamed_on_the_url(monkeypatch):
    # max_connections reached: the URL is right, and pointing at it sends people astray.
    monkeypatch.setattr(startup, "probe",
                        lambda url, timeout: "FATAL:  sorry, too many clients already")
    code, message = startup.database_problem(URL)
    assert code == startup.EXIT_UNAVAILABLE
    assert message == ("cannot use the database at postgresql://me:***@db:5432/tock: FATAL:  "
                       "sorry, too many clients already (it takes no more connections: "
                       "max_connections is reached; other clients' idle connections, or a "
                       "pooler, are the fix, not the URL)")
    assert "secret" not in message


def test_a_read_only_server_is_said_to_be_one(monkeypatch):
    monkeypatch.setattr(startup, "probe", lambda url, timeout: "session is read-only")
    code, message = startup.database_problem(URL)
    assert code == startup.EXIT_UNAVAILABLE
    assert message.endswith("(it answers but takes no writes: a standby, or "
                            "default_transaction_read_only is on; tock needs the primary)")


def test_an_unreachable_server_names_the_setting(monkeypatch):
    monkeypatch.setattr(startup, "probe", lambda url, timeout: "connection refused")
    code, message = startup.database_problem(URL)
    assert code == startup.EXIT_UNAVAILABLE
    assert message == ("TOCK_DATABASE_URL: cannot use postgresql://me:***@db:5432/tock: "
                       "connection refused")
