"""Registering handlers, and what a handler is given.

    from consumer import task, TaskContext

    @task("email", max_attempts=5, timeout=30)
    def send_email(payload: dict, ctx: TaskContext) -> None:
        ...

    @task("fetch", timeout=10)
    async def fetch(payload: dict, ctx: TaskContext) -> None:   # runs on the event loop
        ...

A handler returns to succeed, raises to fail (retried with backoff until max_attempts),
raises `shared.errors.Permanent` to go dead at once, or `RetryAfter(seconds)` to choose
its own delay. Execution is at least once: make handlers idempotent (see README).

`async def` handlers run on the consumer's event loop (one per process, its own thread);
tock cancels their task (`asyncio.Task.cancel()`) where it sets `ctx.cancelled` for a
thread: at the deadline, when the lease is lost, and when shutdown releases the job.

Where a handler runs is its kind's `isolation=`, else the consumer's `--isolation`:

    @task("render", timeout=60, isolation="process")   # always in a child process
    def render(payload: dict, ctx: TaskContext) -> None:
        ...

A process-isolated handler runs in a child process (`async def` ones under `asyncio.run`),
so it must be importable by name: a module-level function, not a lambda or a nested
function. Its payload and context are copies; `ctx.cancelled` is the child's own Event,
set when the consumer tells it to stop, and a handler that goes on for
`TOCK_KILL_GRACE_SECONDS` after that is killed.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast, get_args

from shared.core import validation
from shared.core.errors import InvalidInput
from shared.core.text import shown

Handler = Callable[[Any, "TaskContext"], Any]
Isolation = Literal["thread", "process"]
"""Where a handler runs: a thread of the consumer (timeouts are cooperative) or a child
process (killed when it overruns). The same values as the consumer's `isolation` setting."""


_LAZY = threading.Lock()
"""Guards `CancelFlag`'s flag and the making of its condition."""


class CancelFlag(threading.Event):
    """A `threading.Event` whose condition (a lock and its waiters) is made only when a
    handler first waits on it: most handlers never do, and one job per claim made a
    Condition (a few microseconds under the GIL, about 5% of a no-op job's CPU)."""

    def __init__(self) -> None:  # no super().__init__: that makes the condition
        self._flag = False
        self._cond: threading.Condition | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with _LAZY:
            self._flag = True
            cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()

    def clear(self) -> None:
        with _LAZY:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        with _LAZY:
            if self._flag:
                return True
            if self._cond is None:
                self._cond = threading.Condition(threading.Lock())
            cond = self._cond
        # `set` takes the condition after raising the flag: a set before this block is
        # seen by the check in it, one after it wakes the wait.
        with cond:
            if not self._flag:
                cond.wait(timeout)
            return self._flag

    def _at_fork_reinit(self) -> None:
        if self._cond is not None:
            self._cond = threading.Condition(threading.Lock())


@dataclass(frozen=True)
class TaskContext:
    """What a running handler knows about its job."""

    job_id: int
    kind: str
    queue: str
    attempt: int
    """1 for the first attempt."""
    max_attempts: int
    scheduled_at: datetime
    """The job's run_at: when it was due (for a recurring job, its slot time)."""
    deadline: datetime
    """When the attempt times out; the handler should stop by then."""
    tenant: str | None
    key: str | None
    cancelled: threading.Event = field(repr=False)
    """Set when the handler should stop: timeout, lease lost (e.g. cancelled by an operator),
    or shutdown. Long handlers should check it (`ctx.cancelled.is_set()`) and return; an
    async handler is also cancelled (CancelledError at its next await)."""

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


class Abandon(Exception):
    """Raise to walk away from a job as a killed worker would: nothing is recorded and its
    lease is left to expire, so the timer recovers it. For chaos drills and demos."""


@dataclass(frozen=True)
class Task:
    kind: str
    handler: Handler
    max_attempts: int | None
    timeout_seconds: float | None
    is_async: bool = False
    """An `async def` handler: it runs on the event loop (or under `asyncio.run` in a
    handler process), not in a thread of its own."""
    isolation: Isolation | None = None
    """The kind's own choice; None: the consumer's `isolation` setting decides."""

    def runs_in(self, default: Isolation) -> Isolation:
        """Where this kind's handler runs in a consumer whose setting is `default`."""
        return self.isolation or default


class Registry:
    """Handlers by kind."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def add(self, kind: str, handler: Handler, *, max_attempts: int | None = None,
            timeout: float | None = None, isolation: Isolation | None = None) -> Task:
        validation.kind(kind)
        if not callable(handler):  # else the consumer would start, and fail every job
            raise InvalidInput(f"the handler of kind {kind!r} must be a function taking "
                               f"(payload, ctx), not {shown(handler)}")
        _check_signature(kind, handler)
        if kind in self._tasks and self._tasks[kind].handler is not handler:
            raise InvalidInput(f"a handler for kind {kind!r} is already registered: "
                               f"{self._tasks[kind].handler!r}")
        entry = Task(kind, handler, validation.max_attempts(max_attempts),
                     validation.timeout_seconds(timeout), is_async=is_coroutine_handler(handler),
                     isolation=_isolation(kind, isolation))
        self._tasks[kind] = entry
        return entry

    def get(self, kind: str) -> Task | None:
        return self._tasks.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._tasks)

    def tasks(self) -> list[Task]:
        return [self._tasks[k] for k in sorted(self._tasks)]

    def process_isolated(self, default: Isolation) -> list[Task]:
        """The tasks that run in handler processes in a consumer whose setting is
        `default`."""
        return [t for t in self.tasks() if t.runs_in(default) == "process"]

    def task(self, kind: str, *, max_attempts: int | None = None,
             timeout: float | None = None,
             isolation: Isolation | None = None) -> Callable[[Handler], Handler]:
        """Decorator form of `add`."""
        if callable(kind):  # `@task` without its parentheses: `kind` is the handler
            name = getattr(kind, "__name__", "handler")
            raise InvalidInput(f"@task needs the job kind it handles: write "
                               f"@task(\"{name}\") above {name}, not @task alone")
        validation.kind(kind)  # at import, not when the first job of it is claimed

        def register(handler: Handler) -> Handler:
            self.add(kind, handler, max_attempts=max_attempts, timeout=timeout,
                     isolation=isolation)
            return handler

        return register


def _check_signature(kind: str, handler: Handler) -> None:
    """Refuse at registration a handler that cannot be called as handler(payload, ctx):
    else the consumer starts and every job of the kind fails with a TypeError."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin without a signature: let the call tell
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise InvalidInput(f"the handler of kind {kind!r} must take (payload, ctx); "
                           f"{getattr(handler, '__qualname__', shown(handler))}{signature} "
                           f"cannot be called so: {exc}") from None


def _isolation(kind: str, value: object) -> Isolation | None:
    """`value` if it names an isolation; typed callers cannot pass a wrong one, but task
    modules are rarely type-checked."""
    if value is None:
        return None
    if value not in get_args(Isolation):
        raise InvalidInput(f"isolation of kind {kind!r} must be 'thread' or 'process' "
                           f"(or left out, for the consumer's --isolation), got {value!r}")
    return cast(Isolation, value)


def is_coroutine_handler(handler: Handler) -> bool:
    """Whether calling `handler` gives a coroutine to await (`async def`, also as a
    callable object's `__call__` or under `functools.partial`)."""
    return (inspect.iscoroutinefunction(handler)
            or inspect.iscoroutinefunction(type(handler).__call__))


def call_sync(handler: Handler, payload: Any, ctx: TaskContext) -> None:
    """Call a plain handler. One that hands back a coroutine (an `async def` behind a plain
    wrapper) would otherwise "succeed" without running: that is an error."""
    result = handler(payload, ctx)
    if inspect.iscoroutine(result):
        result.close()
        raise TypeError(f"handler {handler!r} returned a coroutine instead of running: "
                        "register the `async def` function itself (tock awaits it)")


registry = Registry()
"""The registry `python -m consumer --tasks module` runs: `@task` adds to it."""


def task(kind: str, *, max_attempts: int | None = None, timeout: float | None = None,
         isolation: Isolation | None = None) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of `kind`. `max_attempts` and
    `timeout` (seconds) apply to jobs of this kind enqueued without their own.
    `isolation` ("thread" or "process") is where its handler runs, whatever the consumer's
    `--isolation` (which decides for kinds that leave it out)."""
    return registry.task(kind, max_attempts=max_attempts, timeout=timeout,
                         isolation=isolation)
