"""Process isolation per kind: `@task(..., isolation=)` decides where a kind's handler
runs, whatever the consumer's `--isolation`, so one consumer runs most kinds in threads
and a few in handler processes that are killed and replaced when they overrun or crash.
Real consumers (all loops on their threads), real Postgres and SQS, real child processes."""

from __future__ import annotations

import os
import threading

import pytest

from consumer.service import Consumer
from shared.core.errors import ConfigError
from shared.core.states import AttemptOutcome, JobState
from tests.integration.readings import metric
from tests.support import isolated_tasks as tasks
from tests.support.drive import dispatch, settle
from tests.support.wait import wait_for

MIXED = {"kill_grace_seconds": 0.3, "concurrency": 2, "backoff_base_seconds": 0.1,
         "backoff_cap_seconds": 0.1}
"""A consumer that defaults to threads (the fixture's setting)."""



def test_a_process_kind_overrunning_is_killed_and_retried_while_a_thread_kind_succeeds(
        client, timer, registry, running, notes_file):
    registry.add("spin", tasks.spin_first, isolation="process")
    registry.add("record", tasks.record)
    consumer = running(**MIXED)
    assert consumer.settings.isolation == "thread"
    assert consumer.executor.pool is not None and len(consumer.executor.pool.pids()) == 2
    killed = metric("tock_handler_processes_replaced_total", reason="killed")
    payload = {"notes": str(notes_file)}
    spun = client.schedule("spin", payload, timeout=0.5, max_attempts=3)
    dispatch(timer)
    wait_for(lambda: tasks.notes(notes_file, "started"), message="the child spins")
    recorded = client.schedule("record", payload)
    settle(client, timer, recorded.id)
    settle(client, timer, spun.id)

    final = client.get(spun.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT,
                                                   AttemptOutcome.SUCCEEDED]
    assert (final.attempts[0].error or "").startswith(
        "timed out after 0.5 s (handler process killed (SIGKILL)"), final.attempts[0].error
    first, second = tasks.notes(notes_file, "started")
    assert first["pid"] != second["pid"], "the killed child was replaced"
    assert os.getpid() not in (first["pid"], second["pid"])
    assert metric("tock_handler_processes_replaced_total", reason="killed") == killed + 1
    assert metric("tock_stuck_handlers", kind="spin") == 0, "killed, never stuck"

    (ran,) = [n for n in tasks.notes(notes_file, "ran") if n["job_id"] == recorded.id]
    assert ran["pid"] == os.getpid() and ran["thread"] != "MainThread", \
        "the thread kind ran in an executor thread of the consumer itself"
    assert [a.outcome for a in client.get(recorded.id, with_attempts=True).attempts] == [
        AttemptOutcome.SUCCEEDED]
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


def test_a_process_kind_whose_child_crashes_is_a_failed_attempt_and_retried(
        client, timer, registry, running, notes_file):
    registry.add("die", tasks.die_first, isolation="process")
    registry.add("record", tasks.record)
    consumer = running(**MIXED)
    died = metric("tock_handler_processes_replaced_total", reason="died")
    job = client.schedule("die", {"notes": str(notes_file), "how": "exit"}, max_attempts=3)
    settle(client, timer, job.id)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED,
                                                   AttemptOutcome.SUCCEEDED]
    assert final.attempts[0].error == "handler process died: exit 9"
    pids = {n["pid"] for n in tasks.notes(notes_file, "started")}
    assert len(pids) == 2 and os.getpid() not in pids
    assert metric("tock_handler_processes_replaced_total", reason="died") == died + 1
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


def test_consumer_wide_process_isolation_still_isolates_every_kind_that_does_not_say(
        client, timer, registry, running, notes_file):
    registry.add("sync", tasks.record)
    registry.add("async", tasks.record_async)
    registry.add("local", tasks.record, isolation="thread")  # its own choice wins
    consumer = running(**{**MIXED, "isolation": "process"})
    assert consumer.executor.pool is not None and len(consumer.executor.pool.pids()) == 2
    payload = {"notes": str(notes_file)}
    jobs = {kind: client.schedule(kind, payload) for kind in ("sync", "async", "local")}
    for job in jobs.values():
        settle(client, timer, job.id)
    pid_of = {n["job_id"]: n["pid"] for n in tasks.notes(notes_file, "ran")}
    assert pid_of[jobs["sync"].id] != os.getpid()
    assert pid_of[jobs["async"].id] != os.getpid()
    assert pid_of[jobs["local"].id] == os.getpid()


def test_a_thread_kind_in_a_process_consumer_is_reported_stuck_as_in_a_thread_consumer(
        client, timer, registry, running):
    started, let_go = threading.Event(), threading.Event()

    def ignores_its_deadline(payload, ctx):  # a closure: fine, it is never sent to a child
        started.set()
        let_go.wait(60)

    registry.add("stuck", ignores_its_deadline, isolation="thread")
    registry.add("sync", tasks.record)
    running(isolation="process", concurrency=1, kill_grace_seconds=0.3, lease_seconds=2,
            heartbeat_seconds=0.4, visibility_timeout_seconds=2)
    before = metric("tock_stuck_handlers", kind="stuck")
    job = client.schedule("stuck", timeout=0.2, max_attempts=1)
    dispatch(timer)
    assert started.wait(30), "it ran in this process"
    try:
        wait_for(lambda: metric("tock_stuck_handlers", kind="stuck") == before + 1,
                 message="the stuck thread counted")
        row = client.get(job.id)
        assert row.state is JobState.RUNNING and row.lease_detached
    finally:
        let_go.set()
    wait_for(lambda: metric("tock_stuck_handlers", kind="stuck") == before,
             message="the gauge went down when it returned")
    final = wait_for(lambda: (j := client.get(job.id, with_attempts=True)).last_error and j,
                     message="its late outcome written")
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert "returned after its deadline" in (final.last_error or "")


def test_a_kill_grace_as_long_as_the_lease_is_refused_at_start_if_a_kind_uses_processes(
        registry, consumer_settings, transport):
    settings = consumer_settings.model_copy(update={"kill_grace_seconds": 30})  # lease 30
    registry.add("local", lambda payload, ctx: None)  # thread kinds need no pickling
    threads_only = Consumer(settings, registry, transport)
    threads_only.executor.prepare()
    assert threads_only.executor.pool is None, "no process-isolated kind: no child"
    threads_only.close()

    registry.add("risky", tasks.record, isolation="process")
    consumer = Consumer(settings, registry, transport)
    with pytest.raises(ConfigError, match=r"TOCK_LEASE_SECONDS, TOCK_KILL_GRACE_SECONDS: "
                                          r".* with process-isolated kind\(s\) \['risky'\]"):
        consumer.start()
    assert consumer.executor.pool is None
    consumer.close()


def test_a_process_kind_that_cannot_be_named_is_refused_at_start(
        registry, consumer_settings, transport):
    registry.add("fine", tasks.record)
    registry.add("local", lambda payload, ctx: None, isolation="process")
    consumer = Consumer(consumer_settings.model_copy(update=MIXED), registry, transport)
    with pytest.raises(ConfigError, match=r"kind 'local'.*module-level functions"):
        consumer.start()
    consumer.close()
