"""`RetentionStore`: the statements of the history's upkeep (shared.store.retention_sql),
one typed method each: day partitions made and expired, finished rows moved out of
tock_jobs, expired keys freed, defaults swept, workers and audit records pruned."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, datetime

from shared.core.states import FINAL_STATES, JobState
from shared.store import retention_sql as sql
from shared.store.base import Store

DDL_LOCK_TIMEOUT_MS = 1000
"""Longest a partition's attach, detach or drop waits for its lock: a writer queued behind
it waits at most this long, then the DDL gives up (`LockTimeout`) until the next pass."""

_DAY_PARTITION = re.compile(r"^tock_history_jobs_(succeeded|dead|cancelled)_p(\d{8})$")
_FINAL = {s.value for s in FINAL_STATES}


def _final(state: JobState) -> str:
    if state.value not in _FINAL:
        raise ValueError(f"state {state} has no history")
    return state.value


class RetentionStore(Store):
    """Retention statements. See `Store` for how a store runs them. The DDL methods are
    meant for a transaction that took `try_ddl_lock()`."""

    def database_now(self, now: datetime | None = None) -> datetime:
        """`now` if given, else the database clock."""
        row = self._one(sql.DB_NOW, {"now": now})
        assert row is not None
        value: datetime = row[0]
        return value

    # --- partitions -----------------------------------------------------------------------

    def try_ddl_lock(self) -> bool:
        """Take the history's DDL lock until the transaction ends; False if another timer
        holds it (then do something else)."""
        row = self._one(sql.TRY_DDL_LOCK, {"key": sql.DDL_LOCK})
        return bool(row and row[0])

    def set_lock_timeout(self, ms: int = DDL_LOCK_TIMEOUT_MS) -> None:
        """Bound every lock wait of the rest of the transaction."""
        self._run(sql.SET_LOCK_TIMEOUT, {"ms": ms})

    def ensure_partition(self, state: JobState, day: date) -> bool:
        """Create the day partitions (jobs and attempts) of a final state, adopting the
        rows of that day the DEFAULT partition holds; False if they exist."""
        row = self._one(sql.ENSURE_PARTITION, {"state": _final(state), "day": day})
        return bool(row and row[0])

    def expire_partition(self, state: JobState, day: date) -> bool:
        """Detach the jobs partition of (state, day) as `tock_expired_jobs_...` and drop
        its attempts partition; False if there was none."""
        row = self._one(sql.EXPIRE_PARTITION, {"state": _final(state), "day": day})
        return bool(row and row[0])

    def day_partitions(self) -> list[tuple[JobState, date]]:
        """(state, day) of every day partition of the jobs history, oldest day first."""
        out = []
        for (name,) in self._rows(sql.DAY_PARTITIONS):
            found = _DAY_PARTITION.match(name)
            if found:
                day = datetime.strptime(found[2], "%Y%m%d").date()  # noqa: DTZ007 (a date)
                out.append((JobState(found[1]), day))
        return sorted(out, key=lambda p: (p[1], p[0].value))

    def expired_tables(self) -> list[str]:
        """Detached day partitions whose keys are not all freed yet."""
        return [r[0] for r in self._rows(sql.EXPIRED_TABLES)]

    def prune_expired(self, table: str, limit: int) -> int:
        """Free the keys of up to `limit` keyed jobs of an expired table; returns how
        many (0: none left, drop it)."""
        row = self._one(sql.prune_expired(table), {"limit": limit})
        return int(row[0]) if row else 0

    def drop_expired(self, table: str) -> None:
        """Drop an expired table whose keys are all freed."""
        self._run(sql.drop_expired(table))

    def sweep_default(self, state: JobState, keep_from: datetime, limit: int) -> int:
        """Delete up to `limit` rows of the state's DEFAULT partition that finished
        before `keep_from`, with their attempts and keys; returns how many."""
        row = self._one(sql.sweep_default(_final(state)),
                        {"keep_from": keep_from, "limit": limit})
        return int(row[0]) if row else 0

    # --- finished rows in tock_jobs -------------------------------------------------------

    def finished_days(self, state: JobState, limit: int) -> list[date]:
        """The UTC days of the next `limit` jobs of `state` still in tock_jobs."""
        return [r[0] for r in self._rows(sql.FINISHED_DAYS,
                                         {"state": _final(state), "limit": limit})]

    def pick_finished(self, state: JobState, limit: int) -> list[int]:
        """Lock up to `limit` jobs of `state` still in tock_jobs (SKIP LOCKED) and write
        their keys' rows; call `move_finished` in the same transaction."""
        return [r[0] for r in self._rows(sql.PICK_FINISHED,
                                         {"state": _final(state), "limit": limit})]

    def move_finished(self, ids: list[int], keep_from: Mapping[JobState, datetime]
                      ) -> tuple[int, int]:
        """Move the picked jobs to the history, or delete those that finished before
        their state's `keep_from`; returns (moved, moved + deleted)."""
        row = self._one(sql.MOVE_FINISHED, {
            "ids": ids, "keep_succeeded": keep_from[JobState.SUCCEEDED],
            "keep_dead": keep_from[JobState.DEAD],
            "keep_cancelled": keep_from[JobState.CANCELLED]})
        return (int(row[0]), int(row[1])) if row else (0, 0)

    # --- workers and audit records --------------------------------------------------------

    def prune_workers(self, cutoff: datetime, limit: int) -> int:
        """Delete up to `limit` workers stopped or silent since before `cutoff` that hold
        no running job; returns how many."""
        row = self._one(sql.PRUNE_WORKERS, {"cutoff": cutoff, "limit": limit})
        return int(row[0]) if row else 0

    def prune_audit(self, cutoff: datetime, limit: int) -> int:
        """Delete up to `limit` schedule audit records older than `cutoff`, oldest
        first; returns how many."""
        row = self._one(sql.PRUNE_AUDIT, {"cutoff": cutoff, "limit": limit})
        return int(row[0]) if row else 0
