"""Building blocks of the statements that move jobs between the hot table (`tock_jobs`,
`tock_attempts`: unfinished work) and the history (`tock_history_jobs`,
`tock_history_attempts`: finished jobs, partitioned by final state and by day; migration
0007). Each move is one statement (data-modifying CTEs): its readers, which read both
tables in one statement too, see a job either before the move or after it, never in
neither table nor in both.

A key stays in `tock_keys` while its job moves, which is what keeps `schedule(key=...)`
idempotent across the move. A job whose key has no row there pointing at it (inserted
before migration 0007) is not moved by these statements: it finishes in place, and the
retention loop moves it once it has written its key (`retention_sql`).
"""

from collections.abc import Mapping

from shared.store.columns import ATTEMPT_TABLE_COLUMNS, JOB_TABLE_COLUMNS, NOW

FINISHED = "('succeeded', 'dead', 'cancelled')"

JOB_INSERT_LIST = ", ".join(JOB_TABLE_COLUMNS)
ATTEMPT_INSERT_LIST = ", ".join(ATTEMPT_TABLE_COLUMNS)


def job_values(alias: str, overrides: Mapping[str, str] | None = None) -> str:
    """The select list that copies a job row `alias` column by column, some replaced."""
    changed = overrides or {}
    return ", ".join(changed.get(c, f"{alias}.{c}") for c in JOB_TABLE_COLUMNS)


def final_row(alias: str, overrides: Mapping[str, str]) -> str:
    """A RETURNING list: the job row `alias` as it goes to the history, every column
    named, some replaced (typed NULLs: the values travel through a CTE)."""
    return ", ".join(f"{overrides[c]} AS {c}" if c in overrides else f"{alias}.{c}"
                     for c in JOB_TABLE_COLUMNS)


def movable(alias: str) -> str:
    """A job row that may move to the history: keyless, or its key's row points at it."""
    return (f"({alias}.unique_key IS NULL OR EXISTS (SELECT 1 FROM tock_keys k "
            f"WHERE k.unique_key = {alias}.unique_key AND k.job_id = {alias}.id))")


def to_history(gone: str) -> str:
    """CTEs that write the rows of CTE `gone` (deleted from tock_jobs, returned by
    `final_row`) to the history, with the job's earlier attempts."""
    attempts = ", ".join(f"a.{c}" for c in ATTEMPT_TABLE_COLUMNS)
    return f"""history_jobs AS (
    INSERT INTO tock_history_jobs ({JOB_INSERT_LIST})
    SELECT {JOB_INSERT_LIST} FROM {gone}
), moved_attempts AS (
    DELETE FROM tock_attempts a USING {gone} g WHERE a.job_id = g.id
    RETURNING {attempts}, g.state, g.finished_at
), history_attempts AS (
    INSERT INTO tock_history_attempts ({ATTEMPT_INSERT_LIST}, job_state, job_finished_at)
    SELECT * FROM moved_attempts
)"""


def cancelled_attempt(gone: str) -> str:
    """A CTE writing, for each job of CTE `gone` (a cancel's rows, moved to the history, with
    `prev_state`) that was running, the attempt it was running, ended by the cancel: the
    history keeps it although the handler's own result will be discarded."""
    return f"""cancelled_attempt AS (
    INSERT INTO tock_history_attempts (job_id, attempt, worker, started_at, finished_at, outcome,
                                       error, job_state, job_finished_at)
    SELECT g.id, g.attempt, g.lease_owner, g.started_at, g.finished_at, 'cancelled',
           'cancelled while it ran; the handler was asked to stop (ctx.cancelled) and its '
           || 'result is discarded', g.state, g.finished_at
    FROM {gone} g
    WHERE g.prev_state = 'running' AND g.attempt > 0
)"""


def from_history(gone: str) -> str:
    """CTEs that bring the attempts of the history rows in CTE `gone` (deleted from
    tock_history_jobs) back to tock_attempts with their ids, so their order holds."""
    attempts = ", ".join(f"a.{c}" for c in ATTEMPT_TABLE_COLUMNS)
    return f"""returned_attempts AS (
    DELETE FROM tock_history_attempts a USING {gone} g
    WHERE a.job_id = g.id AND a.job_state = g.state AND a.job_finished_at = g.finished_at
    RETURNING {attempts}
), back_attempts AS (
    INSERT INTO tock_attempts ({ATTEMPT_INSERT_LIST}) OVERRIDING SYSTEM VALUE
    SELECT * FROM returned_attempts
)"""


RETRIED = {
    "state": "'scheduled'::tock_job_state", "run_at": NOW, "attempt": "0",
    "lease_owner": "NULL", "lease_expires_at": "NULL", "dispatch_token": "NULL",
    "dispatched_at": "NULL", "started_at": "NULL", "finished_at": "NULL",
    "last_error": "NULL", "dispatch_failures": "0", "updated_at": NOW,
}
"""A job run again (`retry`): due now with a fresh attempt count, and nothing of the run
it had (its error and times stay with its attempts, which it keeps)."""

RETRIED_SET = ", ".join(f"{column} = {value}" for column, value in RETRIED.items()
                        if column != "state")
"""RETRIED as the SET list of an UPDATE in place (the state is set by each statement)."""



def back_to_hot(gone: str, returning: str) -> str:
    """A CTE `back` that inserts the history rows of CTE `gone`, retried, into tock_jobs
    with their ids, returning `returning`."""
    return f"""back AS (
    INSERT INTO tock_jobs ({JOB_INSERT_LIST}) OVERRIDING SYSTEM VALUE
    SELECT {job_values("g", RETRIED)} FROM {gone} g
    RETURNING {returning}
)"""
