"""`async def` handlers (thread isolation): they run on the consumer's one event loop, hold
handler slots like thread handlers, are cancelled at their deadline, on a lost lease and
when shutdown releases them, and whatever they raise is a recorded attempt. Real
consumers (all loops on their threads), real Postgres and SQS."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from consumer.async_executor import BLOCKED_LOG_SECONDS
from consumer.service import Consumer
from shared.core.states import AttemptOutcome, JobState
from tests.integration.readings import metric
from tests.support.drive import dispatch, receive, run_all
from tests.support.wait import wait_for


def _settle(client, timer, job_id, state=JobState.SUCCEEDED, timeout=30):
    return wait_for(lambda: dispatch(timer) >= 0 and client.get(job_id).state is state,
                    timeout=timeout, message=f"job {job_id} {state.value}")


def test_a_mixed_registry_runs_sync_handlers_in_threads_and_async_ones_on_the_loop(
        client, timer, registry, running):
    threads: dict[str, set[str]] = {"sync": set(), "async": set()}

    def plain(payload, ctx):
        threads["sync"].add(threading.current_thread().name)

    async def coroutine(payload, ctx):
        await asyncio.sleep(0.01)
        threads["async"].add(threading.current_thread().name)

    registry.add("sync", plain)
    registry.add("async", coroutine)
    assert registry.get("async").is_async and not registry.get("sync").is_async
    running(concurrency=3)
    jobs = [client.schedule(kind) for kind in ("sync", "async") * 3]
    dispatch(timer)
    for job in jobs:
        wait_for(lambda j=job: client.get(j.id).state is JobState.SUCCEEDED, timeout=30)
    assert threads["async"] == {"tock-async-0"}
    assert all(name.startswith("tock-execute-") for name in threads["sync"])


def test_async_jobs_share_one_thread_and_are_bounded_by_the_slots(
        client, timer, registry, running):
    now_running, peak, gate = [0], [0], threading.Event()

    async def waits(payload, ctx):
        now_running[0] += 1
        peak[0] = max(peak[0], now_running[0])
        while not gate.is_set():
            await asyncio.sleep(0.01)
        now_running[0] -= 1

    registry.add("wait", waits)
    running(concurrency=2)
    jobs = [client.schedule("wait") for _ in range(4)]
    dispatch(timer)
    wait_for(lambda: now_running[0] == 2, message="two at once on the event loop")
    gate.set()
    for job in jobs:
        wait_for(lambda j=job: client.get(j.id).state is JobState.SUCCEEDED, timeout=30)
    assert peak[0] == 2, "never more async jobs at once than concurrency"


def test_an_async_handler_past_its_deadline_is_cancelled_and_timed_out(
        client, timer, registry, running):
    seen: list[str] = []

    async def sleeps(payload, ctx):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append(f"cancelled, ctx.cancelled={ctx.cancelled.is_set()}")
            raise

    registry.add("sleepy", sleeps)
    running()
    job = client.schedule("sleepy", timeout=0.3, max_attempts=2)
    dispatch(timer)
    wait_for(lambda: client.get(job.id).state is JobState.RETRYING, timeout=30)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert final.last_error == ("timed out after 0.3 s (CancelledError: tock cancelled the "
                                "handler: deadline passed)")
    assert seen == ["cancelled, ctx.cancelled=True"]


def test_cancelling_a_running_async_job_cancels_its_coroutine_and_discards_the_result(
        client, timer, registry, running):
    started, seen = threading.Event(), []

    async def swallows(payload, ctx):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError as exc:
            seen.append(str(exc))
        return "a result nobody will write"

    registry.add("long", swallows)
    running(lease_seconds=2, heartbeat_seconds=0.2, visibility_timeout_seconds=2)
    stale = metric("tock_stale_completions_total")
    job = client.schedule("long")
    dispatch(timer)
    assert started.wait(30)
    client.cancel(job.id)
    wait_for(lambda: seen, message="the coroutine saw CancelledError")
    assert seen == ["tock cancelled the handler: lease lost"]
    wait_for(lambda: metric("tock_stale_completions_total") == stale + 1,
             message="its result discarded")
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.CANCELLED
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.CANCELLED], \
        "the attempt the cancel ended, not the handler's result"


def test_shutdown_releases_a_running_async_job_and_cancels_it(
        client, timer, registry, consumer_settings, transport):
    started, seen = threading.Event(), []

    async def stubborn(payload, ctx):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError as exc:
            seen.append(str(exc))
            raise

    registry.add("long", stubborn)
    consumer = Consumer(consumer_settings.model_copy(update={"shutdown_grace_seconds": 0.3}),
                        registry, transport)
    consumer.start()
    job = client.schedule("long")
    dispatch(timer)
    assert started.wait(30)
    consumer.shutdown()
    assert seen == ["tock cancelled the handler: released at shutdown"]
    released = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert released.state is JobState.SCHEDULED and released.attempt == 0
    assert consumer.async_runner is not None and consumer.async_runner.loop.is_closed()


class _StrExits(Exception):
    def __str__(self) -> str:
        raise SystemExit(9)


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3),
                                    asyncio.CancelledError("not from tock"), _StrExits()],
                         ids=["KeyboardInterrupt", "SystemExit", "CancelledError",
                              "__str__ raising SystemExit"])
def test_whatever_an_async_handler_raises_is_a_failed_attempt(
        client, timer, registry, running, raised):
    async def risky(payload, ctx):
        if ctx.attempt == 1:
            raise raised

    registry.add("risky", risky)
    consumer = running(backoff_base_seconds=0.1, backoff_cap_seconds=0.1)
    job = client.schedule("risky", max_attempts=3)
    _settle(client, timer, job.id)
    final = client.get(job.id, with_attempts=True)
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED,
                                                   AttemptOutcome.SUCCEEDED]
    assert type(raised).__name__ in (final.attempts[0].error or "")
    assert consumer.supervisor.live()[0], consumer.supervisor.live()[1]


def test_a_handler_blocking_the_event_loop_is_reported(client, timer, registry, running,
                                                        caplog):
    async def blocks(payload, ctx):
        # The fault itself (not a wait of the test): a blocking call inside async def
        # stalls the loop for longer than BLOCKED_LOG_SECONDS.
        time.sleep(BLOCKED_LOG_SECONDS + 0.3)

    registry.add("blocks", blocks)
    caplog.set_level(logging.WARNING, logger="tock.consumer")
    running()
    job = client.schedule("blocks", timeout=30)
    dispatch(timer)
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30)
    line = wait_for(lambda: next((r for r in caplog.records
                                  if getattr(r, "event", None) == "event_loop_blocked"), None),
                    message="the blocked loop reported")
    assert line.fields["blocked_s"] >= BLOCKED_LOG_SECONDS


@pytest.mark.parametrize("mixed", [False, True], ids=["async-only", "mixed-registry"])
def test_a_consumer_whose_event_loop_is_blocked_leaves_async_jobs_to_others(
        client, timer, registry, running, mixed):
    """Claimed by a consumer whose loop a handler blocks, async jobs would wait past their
    deadline and lose an attempt, blamed on a handler that never ran; they go to a consumer
    whose loop runs instead. One that runs only async kinds stops receiving meanwhile; one
    with thread kinds too receives on, and hands the async jobs' messages back."""
    blocking, release = threading.Event(), threading.Event()

    async def blocks(payload, ctx):
        blocking.set()
        release.wait(60)  # the fault: a blocking call inside async def

    async def quick(payload, ctx):
        await asyncio.sleep(0)

    registry.add("blocks", blocks)
    registry.add("quick", quick)
    if mixed:
        registry.add("plain", lambda payload, ctx: None)
    settings = dict(lease_seconds=2, heartbeat_seconds=0.2, visibility_timeout_seconds=4)
    stuck = running(**settings)
    try:
        client.schedule("blocks", timeout=60)
        dispatch(timer)
        assert blocking.wait(30)
        wait_for(lambda: stuck.async_runner.blocked_for() > 1.0, message="its loop blocked")
        healthy = running(**settings)
        jobs = [client.schedule("quick", timeout=5, max_attempts=1) for _ in range(6)]
        for job in jobs:
            _settle(client, timer, job.id)
            [attempt] = client.get(job.id, with_attempts=True).attempts
            assert attempt.worker == healthy.worker_id, "run where the loop runs"
    finally:
        release.set()


def test_a_dead_event_loop_thread_stops_the_process_non_zero(
        consumer_settings, registry, transport):
    consumer = Consumer(consumer_settings, registry, transport)
    assert consumer.async_runner is not None

    def broken(now=None):
        raise RuntimeError("the event loop is gone")

    consumer.async_runner.run_once = broken  # type: ignore[method-assign]
    code: list[int] = []
    runner = threading.Thread(target=lambda: code.append(consumer.run_forever()))
    runner.start()
    runner.join(60)
    assert code == [70]
    live, reason = consumer.supervisor.live()
    assert not live and "loop async crashed: RuntimeError" in reason


def _from_a_thread_running_a_loop(step) -> None:
    """Run `step` as a synchronous call made while its thread runs an event loop, as under
    Playwright's sync API or in a notebook (on a thread of its own: the test's thread may
    hold Playwright's loop already)."""
    failed: list[BaseException] = []

    async def caller() -> None:
        try:
            step()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=asyncio.run, args=(caller(),))
    thread.start()
    thread.join(60)
    assert not failed, failed


@pytest.mark.parametrize("caller", ["plain", "inside a running loop"])
def test_step_by_step_drivers_run_async_handlers_too(client, timer, registry, consumers,
                                                      clock, caller):
    ran: list[int] = []

    async def coroutine(payload, ctx):
        ran.append(ctx.attempt)

    registry.add("async", coroutine)
    job = client.schedule("async")
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    if caller == "plain":
        run_all(consumer, receive(consumer, 1))
    else:  # the driver must not try to run the consumer's loop on the caller's thread
        _from_a_thread_running_a_loop(lambda: run_all(consumer, receive(consumer, 1)))
    assert ran == [1] and client.get(job.id).state is JobState.SUCCEEDED


def test_an_async_job_stopped_before_the_loop_started_it_never_runs_and_says_so(
        client, timer, registry, consumers, clock):
    # What a job claimed just before a handler blocked the event loop meets: its deadline
    # passes before the loop can start it. Its handler must not start late, and its
    # attempt must not blame a handler that never ran.
    ran: list[int] = []

    async def coroutine(payload, ctx):
        ran.append(ctx.attempt)

    registry.add("async", coroutine)
    job = client.schedule("async", timeout=5, max_attempts=2)
    consumer = consumers(clock)
    dispatch(timer, clock.now)
    [entry] = receive(consumer, 1)
    entry.item.timed_out = True  # as the lease keeper does at the deadline
    entry.item.stop("deadline passed")
    run_all(consumer, [entry])
    assert ran == []
    final = client.get(job.id, with_attempts=True)
    assert final.state is JobState.RETRYING
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.TIMED_OUT]
    assert final.last_error == (
        "timed out after 5 s (NotStarted: the handler never ran: told to stop (deadline "
        "passed) before the event loop was free to start it (another handler blocked the "
        "loop))")


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_a_stray_task_raising_systemexit_does_not_take_the_event_loop_down(
        client, timer, registry, running, raised, caplog):
    # asyncio re-raises SystemExit and KeyboardInterrupt from any task or callback out of
    # run_forever. A handler's own task is guarded, but one it starts on the loop is not:
    # that must not crash the loop (and stop the consumer, with every other async job on
    # it left to expire as "stuck").
    gate = threading.Event()

    async def starts_a_stray_task(payload, ctx):
        async def stray():
            raise raised("from a task the handler started")

        asyncio.get_running_loop().create_task(stray())
        await asyncio.sleep(0.3)

    async def waits(payload, ctx):
        while not gate.is_set():
            await asyncio.sleep(0.01)

    registry.add("stray", starts_a_stray_task)
    registry.add("waits", waits)
    caplog.set_level(logging.ERROR, logger="tock.consumer")
    consumer = running(concurrency=2)
    other = client.schedule("waits", timeout=30)
    job = client.schedule("stray", timeout=30)
    dispatch(timer)
    wait_for(lambda: client.get(job.id).state is JobState.SUCCEEDED, timeout=30,
             message="the handler whose stray task raised finishes")
    gate.set()
    wait_for(lambda: client.get(other.id).state is JobState.SUCCEEDED, timeout=30,
             message="the other async job on the loop finishes too")
    live, reason = consumer.supervisor.live()
    assert live, reason
    assert not consumer.stop_flag.is_set()
    assert any(getattr(r, "event", None) == "event_loop_error"
               and raised.__name__ in str(r.fields.get("error", "")) for r in caplog.records)
