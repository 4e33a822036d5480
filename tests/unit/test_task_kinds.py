"""Handlers of both kinds: which ones are awaited, a plain handler that hands back a
coroutine, and how an in-flight job tells whatever runs its handler to stop."""

from __future__ import annotations

import functools
import threading
import uuid
from datetime import UTC, datetime

import pytest

from consumer.inflight import InFlight
from consumer.tasks import Registry, TaskContext, call_sync, is_coroutine_handler
from shared.core.errors import InvalidInput
from shared.store.rows import Lease


async def coroutine_handler(payload, ctx):
    return None


def plain_handler(payload, ctx):
    return None


class AsyncCallable:
    async def __call__(self, payload, ctx):
        return None


def test_async_handlers_are_recognised_in_every_shape():
    assert is_coroutine_handler(coroutine_handler)
    assert is_coroutine_handler(functools.partial(coroutine_handler))
    assert is_coroutine_handler(AsyncCallable())
    assert not is_coroutine_handler(plain_handler)
    assert not is_coroutine_handler(lambda payload, ctx: None)
    registry = Registry()
    registry.add("a", coroutine_handler)
    registry.add("s", plain_handler)
    assert [t.is_async for t in registry.tasks()] == [True, False]


def test_a_plain_handler_returning_a_coroutine_is_an_error_not_a_silent_success():
    def wrapper(payload, ctx):  # a plain decorator around an async def
        return coroutine_handler(payload, ctx)

    with pytest.raises(TypeError, match="returned a coroutine"):
        call_sync(wrapper, {}, context())


def context() -> TaskContext:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    return TaskContext(job_id=1, kind="k", queue="default", attempt=1, max_attempts=3,
                       scheduled_at=now, deadline=now, tenant=None, key=None,
                       cancelled=threading.Event())


def in_flight() -> InFlight:
    return InFlight(Lease(1, 1, uuid.uuid4()), "default", "r", context(), timeout_seconds=1)


def test_a_stop_reaches_the_runner_even_when_it_came_first():
    early, late = in_flight(), in_flight()
    heard: list[str] = []
    early.stop("lease lost")
    early.on_stop(heard.append)
    late.on_stop(heard.append)
    late.stop("deadline passed")
    late.stop("released at shutdown")
    assert heard == ["lease lost", "deadline passed", "released at shutdown"]
    assert early.context.cancelled.is_set() and late.stop_reason == "deadline passed"


def test_a_handler_that_returned_is_never_counted_stuck():
    item = in_flight()
    assert item.mark_stuck() and item.handler_returned(), "stuck, then it returned"
    other = in_flight()
    assert not other.handler_returned() and not other.mark_stuck(), "returned first"



@pytest.mark.parametrize("handler", [5, "send_email", None])
def test_a_handler_that_cannot_be_called_is_refused_when_registered(handler):
    registry = Registry()
    with pytest.raises(InvalidInput, match="the handler of kind 'nc' must be a function "
                                           r"taking \(payload, ctx\)"):
        registry.task("nc")(handler)
    assert registry.kinds() == []


def _none() -> None:
    return None


def _payload_only(payload: object) -> None:
    return None


def _three(payload: object, ctx: object, extra: object) -> None:
    return None


async def _async_none() -> None:
    return None


@pytest.mark.parametrize("handler", [_none, _payload_only, _three, _async_none,
                                     functools.partial(_three, 1, 2)])
def test_a_handler_that_cannot_take_payload_and_ctx_is_refused_when_registered(handler):
    """Else the consumer starts and every job of the kind fails with a TypeError."""
    registry = Registry()
    with pytest.raises(InvalidInput, match=r"the handler of kind 'sig' must take \(payload, "
                                           r"ctx\); .* cannot be called so"):
        registry.task("sig")(handler)
    assert registry.kinds() == []


@pytest.mark.parametrize("handler", [
    lambda payload, ctx: None, lambda *args: None, lambda payload, ctx=None, *, k=1: None,
    functools.partial(_three, 1), print,
])
def test_handlers_that_take_payload_and_ctx_are_registered(handler):
    assert Registry().add("sig", handler).handler is handler


def test_task_without_its_parentheses_says_how_to_write_it():
    """`@task` alone took the function as the kind and replaced it by a decorator, in
    silence: the consumer then found no handler for it (a bad-input walkthrough)."""
    registry = Registry()
    with pytest.raises(InvalidInput, match=r'write @task\("send"\) above send, not @task '
                                           "alone"):
        @registry.task  # type: ignore[arg-type]
        def send(payload, ctx):
            return None
    with pytest.raises(InvalidInput, match="kind"):
        registry.task("")
    assert registry.tasks() == []
