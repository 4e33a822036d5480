"""Column lists and the clock expression every statement module shares (kept apart so
that the statement modules do not import each other in a circle)."""

NOW = "coalesce(%(now)s::timestamptz, now())"
"""The database clock, unless the caller pins `now` (tests)."""


def unindented(statement: str) -> str:
    """`statement` without its lines' indentation. psycopg caches the parsing of a
    statement only up to 4,096 bytes (`MAX_CACHED_STATEMENT_LENGTH`); a longer one is
    parsed again on every execution, and indentation is much of a long one. (Only leading
    whitespace goes: newlines stay, so `--` comments still end where they did.)"""
    return "\n".join(line.strip() for line in statement.splitlines() if line.strip())



def state_is(alias: str, state: str) -> str:
    """`alias.state = state` for statements that name their rows by id, compared as text so
    that no partial index on state can serve it and the planner goes through the primary
    key. Compared as the enum, the planner may scan every dispatched or running row through
    a partial index instead: after an ANALYZE taken while few jobs were in flight it counts
    that index as nearly empty (measured: 480 rows read per 10-row claim)."""
    return f"{alias}.state::text = '{state}'"


JOB_COLUMNS = (
    "id, kind, queue, payload, priority, state, run_at, attempt, max_attempts, "
    "timeout_seconds, unique_key, tenant, lease_owner, lease_expires_at, dispatch_token, "
    "dispatched_at, last_error, created_at, updated_at, started_at, finished_at, "
    "dispatch_failures, lease_detached, concurrency_key"
)
"""What `Job.from_row` reads, in its order."""

JOB_TABLE_COLUMNS = (
    "id", "kind", "queue", "payload", "priority", "state", "run_at", "attempt",
    "max_attempts", "timeout_seconds", "unique_key", "tenant", "lease_owner",
    "lease_expires_at", "dispatch_token", "dispatched_at", "last_error", "created_at",
    "updated_at", "started_at", "finished_at", "schedule_name", "dispatch_failures",
    "lease_detached", "concurrency_key",
)
"""Every column of tock_jobs, in table order; tock_history_jobs has the same ones."""

ATTEMPT_TABLE_COLUMNS = (
    "id", "job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error",
    "traceback",
)
"""Every column of tock_attempts; tock_history_attempts adds job_state, job_finished_at."""

ATTEMPT_COLUMNS = "attempt, worker, started_at, finished_at, outcome, error, traceback"
"""What `Attempt.from_row` reads, in its order."""
