"""`--isolation process`: handlers run in child processes, one job each at a time. A child
that ignores its deadline is killed and replaced, a child that dies is replaced, and
either way the attempt is recorded and the job retried; sync and async handlers, errors
and `ctx.cancelled` cross the process boundary; shutdown leaves no child behind. Real
consumers (all loops on their threads), real Postgres and SQS, real child processes."""

from __future__ import annotations

import os

import psutil
import pytest

from consumer.service import Consumer
from shared.core.errors import ConfigError
from shared.core.states import AttemptOutcome, JobState
from tests.integration.readings import metric
from tests.support import isolated_tasks as tasks
from tests.support.drive import dispatch, settle
from tests.support.wait import wait_for

PROCESS = {"isolation": "process", "kill_grace_seconds": 0.3, "concurrency": 1,
           "backoff_base_seconds": 0.1, "backoff_cap_seconds": 0.1}



def test_a_handler_ignoring_its_deadline_is_killed_and_the_retry_succeeds(
        client, timer, registry, running, notes_file):
    registry.add("spin", tasks.spin_first)
    consumer = running(**PROCESS)
    killed = metric("tock_handler_processes_replaced_total", reason="killed")
    job = client.schedule("spin", {"notes": str(notes_file)}, timeout=0.5, max_attempts=3)
    settle(client, timer, job.id)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT,
                                                   AttemptOutcome.SUCCEEDED]
    error = final.attempts[0].error or ""
    assert error.startswith("timed out after 0.5 s (handler process killed (SIGKILL)"), error
    assert "deadline passed" in error
    first, second = tasks.notes(notes_file, "started")
    assert first["pid"] != second["pid"], "the killed child was replaced"
    assert os.getpid() not in (first["pid"], second["pid"])
    assert metric("tock_handler_processes_replaced_total", reason="killed") == killed + 1
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


@pytest.mark.parametrize(("how", "words"), [("exit", "handler process died: exit 9"),
                                            ("sigkill", "handler process died: exit -9 (SIGKILL)")])
def test_a_handler_process_that_dies_mid_job_is_replaced_and_the_job_retried(
        client, timer, registry, running, notes_file, how, words):
    registry.add("die", tasks.die_first)
    consumer = running(**PROCESS)
    job = client.schedule("die", {"notes": str(notes_file), "how": how}, max_attempts=3)
    settle(client, timer, job.id)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED,
                                                   AttemptOutcome.SUCCEEDED]
    assert final.attempts[0].error == words
    assert len({n["pid"] for n in tasks.notes(notes_file, "started")}) == 2
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


def test_sync_and_async_handlers_and_their_errors_cross_the_process_boundary(
        client, timer, registry, running, notes_file):
    registry.add("sync", tasks.record)
    registry.add("async", tasks.record_async)
    registry.add("refuse", tasks.refuse)
    running(**{**PROCESS, "concurrency": 2})
    payload = {"notes": str(notes_file), "to": "nobody"}
    jobs = [client.schedule(kind, payload) for kind in ("sync", "async", "sync", "async")]
    refused = client.schedule("refuse", payload)
    for job in jobs:
        settle(client, timer, job.id)
    settle(client, timer, refused.id, JobState.DEAD)
    dead = client.get(refused.id, with_attempts=True)
    assert [a.outcome for a in dead.attempts] == [AttemptOutcome.PERMANENT]
    assert dead.last_error == "NotAnAddress: no @ in 'nobody'"
    assert "isolated_tasks.py" in (dead.attempts[0].traceback or ""), "the child's traceback"
    ran = tasks.notes(notes_file, "ran")
    assert sorted(n["job_id"] for n in ran) == sorted(j.id for j in jobs)
    assert os.getpid() not in {n["pid"] for n in ran}
    assert {n["thread"] for n in ran} == {"MainThread"}, "asyncio.run in the child's main thread"


def test_a_lost_lease_sets_ctx_cancelled_in_the_child_and_the_result_is_discarded(
        client, timer, registry, running, notes_file):
    registry.add("coop", tasks.until_cancelled)
    running(**{**PROCESS, "kill_grace_seconds": 1.5}, lease_seconds=2, heartbeat_seconds=0.2,
            visibility_timeout_seconds=2)
    stale = metric("tock_stale_completions_total")
    job = client.schedule("coop", {"notes": str(notes_file)})
    dispatch(timer)
    wait_for(lambda: tasks.notes(notes_file, "started"), message="the handler started")
    client.cancel(job.id)
    wait_for(lambda: tasks.notes(notes_file, "cancelled"), message="the child saw the signal")
    wait_for(lambda: metric("tock_stale_completions_total") == stale + 1,
             message="its result discarded")
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.CANCELLED
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.CANCELLED], \
        "the attempt the cancel ended, not the handler's result"


def test_an_async_handler_in_a_child_is_cancelled_at_its_deadline(
        client, timer, registry, running, notes_file):
    registry.add("sleepy", tasks.sleep_async)
    running(**{**PROCESS, "kill_grace_seconds": 5})  # it stops when cancelled: no kill
    job = client.schedule("sleepy", {"notes": str(notes_file)}, timeout=0.3, max_attempts=1)
    settle(client, timer, job.id, JobState.DEAD)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert "CancelledError: tock cancelled the handler: deadline passed" in final.last_error
    assert [n["event"] for n in tasks.notes(notes_file)] == ["started", "cancelled"]


def test_shutdown_releases_a_stubborn_job_and_leaves_no_child_behind(
        client, timer, registry, consumer_settings, transport, notes_file):
    registry.add("spin", tasks.spin)
    consumer = Consumer(consumer_settings.model_copy(update={
        **PROCESS, "concurrency": 2, "shutdown_grace_seconds": 0.3}), registry, transport)
    consumer.start()
    try:
        children = consumer.executor.pool.pids() if consumer.executor.pool else []
        assert len(children) == 2
        job = client.schedule("spin", {"notes": str(notes_file)})
        dispatch(timer)
        wait_for(lambda: tasks.notes(notes_file, "started"), message="the handler started")
    finally:
        consumer.shutdown()
    released = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert released.state is JobState.SCHEDULED and released.attempt == 0
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                             for p in children), timeout=10, message="every child gone")


def test_a_handler_that_cannot_be_named_is_refused_at_start(
        registry, consumer_settings, transport):
    registry.add("local", lambda payload, ctx: None)
    consumer = Consumer(consumer_settings.model_copy(update=PROCESS), registry, transport)
    with pytest.raises(ConfigError, match=r"kind 'local'.*module-level functions"):
        consumer.start()
    consumer.close()


def test_a_task_module_that_cannot_import_in_a_child_is_refused_at_start(
        registry, consumer_settings, transport):
    from tests.support import parent_only_tasks

    registry.add("parent-only", parent_only_tasks.handler)
    consumer = Consumer(consumer_settings.model_copy(update=PROCESS), registry, transport)
    with pytest.raises(ConfigError, match="a handler process could not start: cannot import "
                                          "task module: ImportError: this module refuses"):
        consumer.start()
    consumer.close()
