"""The job state machine, written once. `tock_job_state` in Postgres mirrors `JobState`
(a test keeps them in step).

    schedule()          timer: due, sent        consumer: claimed
    ─────────► scheduled ───────────► dispatched ─────────────► running
                 ▲  ▲                    │ timer: stuck past          │
                 │  │                    │ dispatch timeout,          │ consumer: handler
                 │  └────────────────────┘ new token                  │ returned / raised
                 │                                                    ▼
                 │        retrying ◄──── failed, attempts left ─── (outcome)
                 │  timer: due │                                   │     │
                 │  (like      └──► dispatched                     │     ├─► succeeded
                 │  scheduled)                                     │     └─► dead (last attempt,
    retry() ─────┘  (from dead, cancelled)                        │   Permanent, unknown kind)
    consumer: released on shutdown ◄───────────────────────────────┘
    cancel(): scheduled / retrying / dispatched / running ──► cancelled

Who moves jobs: the client inserts `scheduled`; the timer moves scheduled/retrying to
`dispatched`, re-dispatches stuck `dispatched` jobs and rescues `running` jobs whose lease
expired (to `retrying` or `dead`); a consumer moves `dispatched` to `running` and
`running` to an outcome; an operator cancels and retries.
"""

from enum import StrEnum


class JobState(StrEnum):
    """Where a job is in its life. Values are the Postgres enum labels."""

    SCHEDULED = "scheduled"
    """Waiting for its run_at; the timer dispatches it when due."""
    RETRYING = "retrying"
    """An attempt failed; waiting for run_at (backoff) like `scheduled`."""
    DISPATCHED = "dispatched"
    """Sent to SQS with the current dispatch token; no consumer has claimed it yet."""
    RUNNING = "running"
    """Claimed by a consumer that holds a lease (owner, attempt, expiry)."""
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    """Out of attempts, a permanent error, or no handler; `retry()` brings it back."""
    CANCELLED = "cancelled"


DUE_STATES = (JobState.SCHEDULED, JobState.RETRYING)
"""States the timer dispatches from once run_at has passed."""

ACTIVE_STATES = (JobState.SCHEDULED, JobState.RETRYING, JobState.DISPATCHED, JobState.RUNNING)
FINAL_STATES = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


class AttemptOutcome(StrEnum):
    """How one attempt ended; values are the Postgres enum labels of `tock_attempt_outcome`."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The handler raised; the job retries if attempts are left."""
    TIMED_OUT = "timed_out"
    PERMANENT = "permanent"
    """The handler raised `Permanent`: never retried."""
    NO_HANDLER = "no_handler"
    LEASE_EXPIRED = "lease_expired"
    """The worker stopped heartbeating (crash); the timer rescued the job."""
    RELEASED = "released"
    """The worker shut down before the handler finished; the job runs again at once."""
    CANCELLED = "cancelled"
    """An operator cancelled the job while this attempt ran (written by the cancel; the
    handler's own result is discarded)."""
