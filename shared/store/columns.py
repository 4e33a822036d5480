"""Column lists and the clock expression every statement module shares (kept apart so
that the statement modules do not import each other in a circle)."""

NOW = "coalesce(%(now)s::timestamptz, now())"
"""The database clock, unless the caller pins `now` (tests)."""


def due_since(alias: str) -> str:
    """When the job became due as far as tock is concerned, the base of the lateness
    metrics: its `run_at`, or when it was enqueued if that was later (an `at` in the past
    runs at once, and its lateness is tock's only from the enqueue on, not the centuries
    before). A schedule's run counts from its fire time all the same: a run created late
    (the timer was down) is late."""
    return (f"CASE WHEN {alias}.schedule_name IS NULL THEN greatest({alias}.run_at, "
            f"{alias}.created_at) ELSE {alias}.run_at END")


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
