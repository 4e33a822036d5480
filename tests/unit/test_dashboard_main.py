"""`python -m dashboard` refuses a port that cannot be one before touching anything."""

from __future__ import annotations

import pytest

from dashboard.__main__ import main


@pytest.mark.parametrize(("port", "says"), [
    ("70000", "70000 is not a port (1-65535)"),
    ("0", "0 is not a port (1-65535)"),
    ("eighty", "not a port number: 'eighty'"),
    ("80_80", "not a port number: '80_80'"),  # int() takes it
])
def test_a_port_out_of_range_is_a_usage_error_naming_the_option(capsys, port, says):
    with pytest.raises(SystemExit) as exited:
        main(["--port", port])
    assert exited.value.code == 2
    assert f"argument --port: {says}" in capsys.readouterr().err
