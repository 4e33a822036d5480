"""The producer API: put jobs into tock, look after them, and define recurring schedules.

    from shared.client import schedule, recurring
    job = schedule("email", {"to": "a@example.com"}, delay=30, key="welcome:42")
    recurring("nightly-report", "report", cron="0 2 * * *", tz="Europe/Berlin")

This module is a facade: jobs come from `shared.producer`, schedules from
`shared.schedules`. The module-level functions use one process-wide `Client` built from
`TOCK_*` settings on first use.
"""

from shared.core.schedules import Schedule, ScheduleEvent, ScheduleRun, slot_of
from shared.producer.client import (
    Client,
    cancel,
    default_client,
    get,
    retry,
    schedule,
    schedule_many,
)
from shared.schedules.api import (
    delete_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    preview_schedule,
    recurring,
    resume_schedule,
    schedule_history,
    schedule_runs,
    update_schedule,
)

__all__ = [
    "Client", "Schedule", "ScheduleEvent", "ScheduleRun", "cancel", "default_client",
    "delete_schedule", "get", "get_schedule", "list_schedules", "pause_schedule",
    "preview_schedule", "recurring", "resume_schedule", "retry", "schedule",
    "schedule_history", "schedule_many", "schedule_runs", "slot_of", "update_schedule",
]
