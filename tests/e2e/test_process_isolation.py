"""End to end: `python -m consumer --isolation process` kills a handler that hangs past
its timeout, replaces its process, and the job's retry succeeds in the new one; the
consumer then drains on SIGTERM and exits 0 with no handler process left. A consumer in
threads does the same for a kind registered with `isolation="process"` (its child
imports the --tasks module that says so), while its other kinds run in its threads."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from shared.core.states import AttemptOutcome, JobState
from tests.support.processes import process_env
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def test_a_handler_hanging_past_its_timeout_is_killed_and_retried(procs, client, db,
                                                                  tmp_path):
    procs.timer("timer")
    consumer = procs.consumer("consumer", "--isolation", "process", "--concurrency", "2")
    job = client.schedule("hang_first", timeout=1, max_attempts=3)
    procs.wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=60,
                   message="the retry succeeded in a fresh handler process")
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT,
                                                   AttemptOutcome.SUCCEEDED]
    assert "handler process killed (SIGKILL)" in (final.attempts[0].error or "")
    runs = db.execute("SELECT attempt, pid FROM e2e_runs WHERE job_id = %s ORDER BY at",
                      (job.id,)).fetchall()
    assert [r[0] for r in runs] == [1, 2]
    assert consumer.pid not in {r[1] for r in runs}, "handlers ran in child processes"
    assert not psutil.pid_exists(runs[0][1]) or \
        psutil.Process(runs[0][1]).status() == psutil.STATUS_ZOMBIE, "the hung child is gone"
    children = psutil.Process(consumer.pid).children(recursive=True)
    assert procs.terminate("consumer") == 0
    wait_for(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                             for c in children), timeout=10, message="no child left behind")
    events = [json.loads(line).get("event") for line in
              (tmp_path / "consumer.log").read_text().splitlines() if line.startswith("{")]
    assert "handler_process_killed" in events and "consumer_stopped" in events


def test_a_process_kind_is_killed_and_retried_while_the_others_run_in_the_consumer(
        procs, client, db, tmp_path):
    procs.timer("timer")
    consumer = procs.start("consumer", "-m", "consumer", "--tasks",
                           "tests.support.mixed_tasks", "--concurrency", "2")
    hung = client.schedule("hang_first_isolated", timeout=1, max_attempts=3)
    plain = client.schedule("record")
    procs.wait_for(lambda: all(client.get(j.id).state is JobState.SUCCEEDED
                               for j in (hung, plain)), timeout=60,
                   message="the plain job, and the hung one's retry in a fresh child")
    final = client.get(hung.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT,
                                                   AttemptOutcome.SUCCEEDED]
    assert "handler process killed (SIGKILL)" in (final.attempts[0].error or "")
    runs = db.execute("SELECT job_id, attempt, pid FROM e2e_runs ORDER BY at").fetchall()
    hung_pids = [pid for job_id, _, pid in runs if job_id == hung.id]
    assert len(set(hung_pids)) == 2 and consumer.pid not in hung_pids
    assert [pid for job_id, _, pid in runs if job_id == plain.id] == [consumer.pid], \
        "the thread kind ran in the consumer itself"
    assert procs.terminate("consumer") == 0
    lines = [json.loads(line) for line in (tmp_path / "consumer.log").read_text().splitlines()
             if line.startswith("{")]
    (started,) = [e for e in lines if e.get("event") == "consumer_started"]
    assert started["isolation"] == "thread"
    assert started["process_kinds"] == ["hang_first_isolated"]
    assert "handler_process_killed" in {e.get("event") for e in lines}


def test_a_consumer_whose_handler_processes_cannot_start_exits_2(database_url, queue_prefix,
                                                                 sqs_server):
    env = process_env(database_url, queue_prefix, sqs_server.env())
    done = subprocess.run([sys.executable, "-m", "consumer", "--tasks",
                           "tests.support.parent_only_tasks", "--isolation", "process"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "a handler process could not start: cannot import task module: ImportError" \
        in done.stderr
    assert "Traceback" not in done.stderr


def test_kill_9_of_the_consumer_takes_its_handler_processes_and_the_job_is_recovered(
        procs, client, db):
    procs.timer("timer")
    first = procs.consumer("first", "--isolation", "process", "--concurrency", "2")
    job = client.schedule("block_first", max_attempts=3)
    wait_for(lambda: db.execute("SELECT count(*) FROM e2e_runs WHERE job_id = %s",
                                (job.id,)).fetchone()[0] == 1,
             timeout=60, message="the first run started in a handler process")
    (child_pid,) = db.execute("SELECT pid FROM e2e_runs WHERE job_id = %s",
                              (job.id,)).fetchone()
    assert child_pid != first.pid
    child = psutil.Process(child_pid)
    procs.kill("first")
    # Its parent gone, the handler process leaves by itself: no orphan runs on.
    wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
             timeout=15, message="the orphaned handler process exited")
    procs.consumer("second", "--isolation", "process", "--concurrency", "2")
    procs.wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=60,
                   message="the job recovered from the lease and run again")
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.LEASE_EXPIRED,
                                                   AttemptOutcome.SUCCEEDED]
