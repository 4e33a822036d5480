"""Two consumer processes given one TOCK_WORKER_ID: the second is refused (exit 2, one
line naming the variable and the live holder) while the first beats, and the first goes
on. A worker's jobs are known by its id alone; sharing one, each consumer took the
other's jobs for ones it had lost and discarded their results (found by a walkthrough).
Real processes, real Postgres and LocalStack."""

from __future__ import annotations


def test_a_second_consumer_with_a_worker_id_in_use_exits_2(procs, db):
    first = procs.consumer("first", TOCK_WORKER_ID="shared-id")
    procs.wait_for(lambda: db.execute(
        "SELECT 1 FROM tock_workers WHERE id = 'shared-id' AND pid = %s", (first.pid,)
    ).fetchone(), timeout=60, message="the first consumer announced")
    second = procs.consumer("second", TOCK_WORKER_ID="shared-id")
    assert second.wait(60) == 2, procs.logs()
    log = (procs.log_dir / "second.log").read_text()
    assert "TOCK_WORKER_ID 'shared-id' is in use by a live consumer" in log, log
    assert f"pid {first.pid}" in log and "Traceback" not in log, log
    assert first.poll() is None, "the first consumer goes on"
    pid = db.execute("SELECT pid FROM tock_workers WHERE id = 'shared-id'").fetchone()[0]
    assert pid == first.pid
