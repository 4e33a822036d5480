"""The producer API: put jobs into tock, look after them, and define recurring schedules.

    from shared.client import schedule, recurring
    job = schedule("email", {"to": "a@example.com"}, delay=30, key="welcome:42")
    recurring("nightly-report", "report", cron="0 2 * * *", tz="Europe/Berlin")

This module is the facade over two layers that do not know each other: jobs
(`shared.producer`) and recurring schedules (`shared.schedules`). `Client` combines them;
the module-level functions call one process-wide `Client` built from `TOCK_*` settings on
first use, with the same signatures as the methods.

A database the client cannot use (wrong URL, password or host; server not running) fails
its first call at once with `DatabaseUnavailable` naming the database (password
redacted), the server's or libpq's reason and the setting to check. Once it has worked,
a call waits up to 30 s for a connection, so a Postgres restart costs a caller a delay,
not an error; a wait that runs out says why, and while the database stays away the
following calls fail at once (asking it again at most once a second).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar

from shared.core.config import ProducerConfig
from shared.core.schedules import Schedule, ScheduleEvent, ScheduleRun, slot_of
from shared.producer.client import CALL_TIMEOUT_SETTING, DATABASE_SETTING
from shared.producer.client import Client as _JobClient
from shared.runtime.settings import ClientSettings, unknown_variables
from shared.schedules.api import ScheduleApi

P = ParamSpec("P")
R = TypeVar("R")


class Client(_JobClient, ScheduleApi):
    """Jobs and recurring schedules over one connection pool. Thread-safe.

    `Client()` reads `TOCK_*` settings; `Client(ClientSettings(database_url=...))` is
    explicit. `now` pins the database's clock (tests). `pool_timeout` is the longest a call
    waits for a connection while the database is away (30 s rides out a restart; the
    dashboard, which must answer 503 soon, passes less). `database_setting` and
    `call_timeout_setting` are what its errors tell the reader to check (None: nothing to
    name); an application embedding the client names its own."""

    def __init__(self, settings: ProducerConfig | None = None, *,
                 now: datetime | None = None, pool_timeout: float = 30.0,
                 database_setting: str = DATABASE_SETTING,
                 call_timeout_setting: str | None = CALL_TIMEOUT_SETTING) -> None:
        if settings is None:
            _warn_unknown_settings()
        super().__init__(settings if settings is not None else ClientSettings.load(), now=now,
                         pool_timeout=pool_timeout, database_setting=database_setting,
                         call_timeout_setting=call_timeout_setting)

    def __enter__(self) -> Client:
        return self


_warned_unknown = False


def _warn_unknown_settings() -> None:
    """Once per process, as tock's own processes do at start: a mistyped TOCK_* variable
    (TOCK_DATABSE_URL) otherwise leaves its default in force without a word."""
    global _warned_unknown  # noqa: PLW0603 - once per process
    if _warned_unknown:
        return
    _warned_unknown = True
    for name, near in unknown_variables(os.environ):
        logging.getLogger("tock.client").warning(
            "%s is set but no tock setting has that name%s", name,
            f"; did you mean {near}?" if near else " (see the README's Configuration)")


_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client, built from `TOCK_*` settings on first use."""
    global _default  # noqa: PLW0603 - one lazily built client per process
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def _on_default(method: Callable[Concatenate[Client, P], R]) -> Callable[P, R]:
    """`method` called on the default client, with its signature and docstring."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(default_client(), *args, **kwargs)

    return call


schedule = _on_default(Client.schedule)
schedule_many = _on_default(Client.schedule_many)
get = _on_default(Client.get)
cancel = _on_default(Client.cancel)
retry = _on_default(Client.retry)
recurring = _on_default(Client.recurring)
update_schedule = _on_default(Client.update_schedule)
get_schedule = _on_default(Client.get_schedule)
list_schedules = _on_default(Client.list_schedules)
pause_schedule = _on_default(Client.pause_schedule)
resume_schedule = _on_default(Client.resume_schedule)
delete_schedule = _on_default(Client.delete_schedule)
preview_schedule = _on_default(Client.preview_schedule)
schedule_history = _on_default(Client.schedule_history)
schedule_runs = _on_default(Client.schedule_runs)
set_tenant_weight = _on_default(Client.set_tenant_weight)
reset_tenant_weight = _on_default(Client.reset_tenant_weight)
tenant_weights = _on_default(Client.tenant_weights)
set_limit = _on_default(Client.set_limit)
remove_limit = _on_default(Client.remove_limit)
limits = _on_default(Client.limits)

__all__ = [
    "Client", "ClientSettings", "Schedule", "ScheduleEvent", "ScheduleRun", "cancel",
    "default_client", "delete_schedule", "get", "get_schedule", "limits", "list_schedules",
    "pause_schedule", "preview_schedule", "recurring", "remove_limit",
    "reset_tenant_weight", "resume_schedule", "retry", "schedule", "schedule_history",
    "schedule_many", "schedule_runs", "set_limit", "set_tenant_weight", "slot_of",
    "tenant_weights", "update_schedule",
]
