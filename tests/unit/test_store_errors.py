"""What a database error means (shared.store.errors.classify), from constructed psycopg
exceptions: no server involved."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from psycopg_pool import PoolTimeout

from shared.core.errors import (
    DatabaseBug,
    DatabaseError,
    DatabaseUnavailable,
    DataRejected,
    LockTimeout,
    Retryable,
)
from shared.store.errors import classify, translated


def pg_error(sqlstate: str, message: str = "x") -> psycopg.Error:
    err = psycopg.errors.lookup(sqlstate)(message)
    assert err.sqlstate == sqlstate  # carried as a class attribute
    return err


@pytest.mark.parametrize(("sqlstate", "expected"), [
    ("08006", DatabaseUnavailable),  # connection_failure
    ("08001", DatabaseUnavailable),  # sqlclient_unable_to_establish_sqlconnection
    ("57P01", DatabaseUnavailable),  # admin_shutdown
    ("57P02", DatabaseUnavailable),  # crash_shutdown
    ("57P03", DatabaseUnavailable),  # cannot_connect_now
    ("55P03", LockTimeout),  # lock_not_available
    ("40001", Retryable),  # serialization_failure
    ("40P01", Retryable),  # deadlock_detected
    ("57014", Retryable),  # query_canceled (statement_timeout)
    ("53300", Retryable),  # too_many_connections
    ("53200", Retryable),  # out_of_memory
    ("22003", DataRejected),  # numeric_value_out_of_range
    ("22P02", DataRejected),  # invalid_text_representation
    ("22021", DataRejected),  # character_not_in_repertoire
    ("23505", DataRejected),  # unique_violation
    ("23514", DataRejected),  # check_violation
    ("42601", DatabaseBug),  # syntax_error
    ("42703", DatabaseBug),  # undefined_column
    ("42P01", DatabaseBug),  # undefined_table
])
def test_errors_with_a_sqlstate(sqlstate, expected):
    result = classify(pg_error(sqlstate, "the server said so\nDETAIL: more"))
    assert type(result) is expected
    assert isinstance(result, DatabaseError)
    assert result.sqlstate == sqlstate
    assert "the server said so" in str(result)
    assert "DETAIL" not in str(result)  # the first line only


@pytest.mark.parametrize("sqlstate", ["40001", "40P01", "57014", "53300"])
def test_transient_errors_are_retryable_but_not_unavailable(sqlstate):
    result = classify(pg_error(sqlstate))
    assert isinstance(result, Retryable)
    assert not isinstance(result, DatabaseUnavailable)
    assert not isinstance(result, LockTimeout)


def test_lock_timeout_is_retryable():
    assert isinstance(classify(pg_error("55P03")), Retryable)


@pytest.mark.parametrize("sqlstate", ["22003", "22P02", "23505"])
def test_rejected_data_is_not_retryable(sqlstate):
    assert not isinstance(classify(pg_error(sqlstate)), Retryable)


def test_a_bug_names_its_sqlstate():
    result = classify(pg_error("42703", 'column "nope" does not exist'))
    assert str(result) == 'column "nope" does not exist (SQLSTATE 42703)'


def test_operational_error_without_sqlstate_is_unavailable():
    result = classify(psycopg.OperationalError("no sqlstate"))
    assert type(result) is DatabaseUnavailable
    assert result.sqlstate is None
    assert "no sqlstate" in str(result)


def test_interface_error_without_sqlstate_is_unavailable():
    result = classify(psycopg.InterfaceError("the connection is closed"))
    assert type(result) is DatabaseUnavailable


def test_data_error_without_sqlstate_is_rejected_data():
    result = classify(psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"))
    assert type(result) is DataRejected
    assert result.sqlstate is None
    assert "NUL" in str(result)


def test_other_errors_without_sqlstate_are_bugs():
    result = classify(psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters"))
    assert type(result) is DatabaseBug
    assert result.sqlstate is None


def test_a_pool_timeout_is_unavailable():
    result = classify(PoolTimeout("t"))
    assert type(result) is DatabaseUnavailable
    assert result.sqlstate is None
    assert "t" in str(result)


def test_an_encoding_error_is_rejected_data():
    err = UnicodeEncodeError("utf-8", "a\ud800b", 1, 2, "surrogates not allowed")
    result = classify(err)
    assert type(result) is DataRejected
    assert result.sqlstate is None
    assert "surrogates not allowed" in str(result)


def test_an_empty_message_falls_back_to_the_type_name():
    assert "OperationalError" in str(classify(psycopg.OperationalError("")))


def test_translated_raises_the_tock_error_from_the_psycopg_one():
    original = pg_error("40P01", "deadlock detected")
    with pytest.raises(Retryable) as caught, translated():
        raise original
    assert caught.value.sqlstate == "40P01"
    assert caught.value.__cause__ is original


def test_translated_leaves_other_errors_alone():
    with pytest.raises(KeyError), translated():
        raise KeyError("not a database error")
