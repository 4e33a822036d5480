"""The `procs` fixture: real timer and consumer processes on the test's database and SQS
server, with short leases and backoffs so crashes and retries show within seconds."""

from __future__ import annotations

import pytest

from tests.support.e2e_tasks import DDL
from tests.support.processes import Processes, process_env


@pytest.fixture
def procs(database_url, queue_prefix, transport, sqs_server, db, tmp_path):
    db.execute(DDL)
    p = Processes(process_env(database_url, queue_prefix, sqs_server.env(),
                              lease_seconds="3", heartbeat_seconds="1",
                              visibility_timeout_seconds="5", receive_wait_seconds="1",
                              backoff_base_seconds="0.2", backoff_cap_seconds="0.5",
                              shutdown_grace_seconds="2", kill_grace_seconds="0.5"), tmp_path)
    yield p
    p.stop_all()
