"""`tock ... | head`: a reader that goes away ends the command quietly, as with any Unix
tool (exit 141, as for SIGPIPE), not with a BrokenPipeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from cli.main import EXIT_BROKEN_PIPE


def test_a_closed_pipe_ends_the_command_without_a_traceback(database_url, client):
    for _ in range(3):
        client.schedule("email")
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "jobs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TOCK_DATABASE_URL": database_url})
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the command writes a line
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == EXIT_BROKEN_PIPE
