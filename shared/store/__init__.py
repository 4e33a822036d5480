"""The storage boundary: every SQL statement tock runs is named in `*_sql.py` and run by
one typed method of a store (`JobStore`, `ScheduleStore`, `OperatorStore`) over a
`Database`. Errors leave this package classified (`shared.store.errors`); nothing above it
sees psycopg."""

from shared.store.database import Database, Listener
from shared.store.job_store import JobStore
from shared.store.operator_store import OperatorStore
from shared.store.schedule_store import ScheduleStore

__all__ = ["Database", "JobStore", "Listener", "OperatorStore", "ScheduleStore"]
