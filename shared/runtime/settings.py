"""Typed settings, one object per process, read from `TOCK_*` environment variables and
validated at start-up.

AWS endpoint, region and credentials are not tock settings: boto3 reads them the standard
way (`AWS_ENDPOINT_URL_SQS`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, instance roles ...),
so the same code runs against LocalStack and real SQS.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from shared.core.errors import ConfigError, InvalidInput
from shared.core.states import JobState
from shared.core.validation import (
    MAX_DELAY_SECONDS,
    MAX_TIMEOUT_SECONDS,
    QUEUE_NAME,
    visible,
)
from shared.store.database import check_url

CLOUDWATCH_NAMESPACE = re.compile(r"^[A-Za-z0-9._/#:-]{1,255}$")


def _message(error: ErrorDetails) -> str:
    if error["type"] == "finite_number":  # nan, inf: not "should be less than ..."
        return f"must be a finite number, not {error['input']!r}"
    text = str(error["msg"])
    return text.removeprefix("Value error, ")


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class TockSettings(BaseSettings):
    """Settings that fail as one `ConfigError` naming the variables, however they are made
    (`load()`, or the class called with keywords): never a pydantic ValidationError, whose
    text quotes every input, a database password included. A keyword that is not a
    setting (`databse_url=`) is refused rather than ignored for the default; environment
    variables are looked up by name, so an unknown TOCK_* variable is never read."""

    model_config = SettingsConfigDict(extra="forbid")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError("invalid settings:\n" + "\n".join(
                f"  {type(self)._line(e)}" for e in exc.errors())) from None
        except SettingsError as exc:  # a value the environment parser could not read
            raise ConfigError(f"invalid settings: {exc}") from None

    @classmethod
    def load(cls, **overrides: object) -> Self:
        """Read the environment and apply overrides; `ConfigError` (see the class)."""
        return cls(**overrides)

    @classmethod
    def refused(cls, message: str) -> ConfigError:
        """The `ConfigError` for a check across fields made after `load` (it needs what
        only the process knows later, such as its registered tasks), worded as `load`
        words its own."""
        return ConfigError(f"invalid settings:\n  {cls._names((), message)}: {message}")

    @classmethod
    def _line(cls, error: ErrorDetails) -> str:
        if error["type"] == "extra_forbidden":
            given = str(error["loc"][0])
            near = difflib.get_close_matches(given, list(cls.model_fields), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            return f"{given}: not a setting of {cls.__name__}{hint}"
        return f"{cls._names(error['loc'], error['msg'])}: {_message(error)}"

    @classmethod
    def _names(cls, loc: tuple[int | str, ...], message: str) -> str:
        """The variable(s) an error is about: its field, or for a check across fields,
        every field its message names."""
        prefix = str(cls.model_config.get("env_prefix", ""))
        if loc:
            return f"{prefix}{str(loc[0]).upper()}"
        named = [f for f in cls.model_fields if re.search(rf"\b{f}\b", message)]
        return ", ".join(f"{prefix}{f.upper()}" for f in named) or f"{prefix}* settings"


class CommonSettings(TockSettings):
    """Settings every process reads. No float setting (here or in a subclass) takes NaN or
    infinity (`allow_inf_nan`): NaN compares false with every bound, so it would otherwise
    pass `ge`/`gt` checks, or fail with a message about the bound."""

    model_config = SettingsConfigDict(env_prefix="TOCK_", extra="forbid", allow_inf_nan=False)

    database_url: str = Field(
        default="postgresql://postgres@127.0.0.1:5432/tock",
        description="Postgres URL (libpq form).",
    )
    queue_prefix: str = Field(
        default="tock-", pattern=r"^[A-Za-z0-9_-]{0,15}$",
        description="SQS queue name = prefix + tock queue name.",
    )
    log_format: Literal["json", "human"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"  # any case
    sqs_call_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    visibility_timeout_seconds: int = Field(
        default=60, ge=1, le=43200,
        description="SQS visibility timeout of a received message; the queue's own setting "
                    "must agree.")
    create_queues: bool = Field(
        default=False,
        description="Create an SQS queue (and its -dlq) that is missing, at start and after "
                    "it disappears (local stacks; production queues come from infra/).")
    dead_letter_after: int = Field(
        default=5, ge=1, le=1000,
        description="Receives before SQS moves a message to the dead-letter queue (used "
                    "when tock creates the queue).")

    @field_validator("database_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url(value)

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        """`debug` as well as `DEBUG`, `JSON` as well as `json`: the usual spellings."""
        if not isinstance(value, str):
            return value
        return value.strip().upper() if value.strip().upper() in _LEVELS else value.strip().lower()


class ClientSettings(CommonSettings):
    """The producer client."""

    max_payload_bytes: int = Field(default=256 * 1024, ge=1, le=64 * 1024 * 1024)
    default_queue: str = Field(default="default", pattern=QUEUE_NAME.pattern)
    pool_max_size: int = Field(default=10, ge=1, le=200)
    reject_unknown_kinds: bool = Field(
        default=False,
        description="Refuse to enqueue a kind no consumer has announced a handler for in the "
                    "last 24 hours (off: producers may enqueue before workers deploy).")
    call_timeout_seconds: float = Field(
        default=30.0, ge=0.01, le=3600,  # statement_timeout is whole ms; 0 would be none
        description="Longest a statement of a client call may run (Postgres's "
                    "statement_timeout: a wait for another transaction's lock included); "
                    "a server that says nothing at all is given 5 s more, then the call's "
                    "connection is cut and the call raises ConnectionLost.")


class TimerSettings(CommonSettings):
    """The timer service."""

    # One batch is sent as batch_size/10 SendMessageBatch calls in parallel before the
    # claim commits: keep them one wave, so the rows stay locked for about one SQS call.
    batch_size: int = Field(default=100, ge=1, le=5000, description="Jobs claimed per pass.")
    send_concurrency: int = Field(default=10, ge=1, le=64,
                                  description="SendMessageBatch calls in flight.")
    max_idle_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="Longest sleep without a pass, even with nothing due (covers lost NOTIFYs).",
    )
    dispatch_timeout_seconds: float = Field(
        default=60.0, ge=5, le=7 * 86400,
        description="A job still `dispatched` this long after dispatch is sent again, if its "
                    "SQS queue holds fewer messages than it should (its message was lost).",
    )
    dispatch_window: int = Field(
        default=1000, ge=0, le=1_000_000,
        description="Most jobs of one kind sent to SQS and not yet claimed by a consumer "
                    "(0: no cap). Past it the kind's due jobs wait in Postgres, where "
                    "priority, fair share and limits still order them; at least batch_size.")
    dispatch_window_seconds: float = Field(
        default=0.25, ge=0, le=3600,
        description="Paces each tenant's jobs of a kind into a queue: when a batch of them "
                    "has waited in SQS longer than this (consumers are behind on it), the "
                    "tenant's depth there is cut to 3/4 of what waits, and it grows back by "
                    "a quarter batch per this long while none has; other tenants still go "
                    "out, up to its level per weight. 0: the count alone applies.")
    sqs_fair_queues: bool = Field(
        default=True,
        description="Send each job's tenant as its SQS MessageGroupId, by which SQS fair "
                    "queues hand a quiet tenant's messages out ahead of another tenant's "
                    "backlog (standard queues take one since 2025). Turn off for an "
                    "SQS-compatible server that refuses it.")
    maintenance_interval_seconds: float = Field(default=2.0, gt=0, le=600)
    vacuum_dead_rows: int = Field(
        default=10_000, ge=0, le=100_000_000,
        description="VACUUM tock_jobs (checked every 2 s) once it holds this many dead "
                    "rows and more dead rows than live ones, rather than wait up to a "
                    "minute for autovacuum (0: leave it to autovacuum).")
    # At most 10 years, as a job's delay= (a retry lands in the calendar Postgres and
    # Python share): a longer one is refused here, not by the first failed attempt.
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=MAX_DELAY_SECONDS)
    backoff_cap_seconds: float = Field(default=3600.0, gt=0, le=MAX_DELAY_SECONDS)
    default_max_attempts: int = Field(default=5, ge=1, le=1000)
    health_port: int | None = Field(default=None, ge=1, le=65535)
    # Recurring schedules (TOCK_SCHEDULE_*).
    schedule_batch_size: int = Field(default=100, ge=1, le=5000,
                                     description="Schedules locked and fired per transaction.")
    schedule_batches_per_pass: int = Field(default=10, ge=1, le=1000)
    schedule_lookahead_seconds: float | None = Field(
        default=None, ge=0, le=60,
        description="Make a slot's job this long before it is due, so the dispatcher meets "
                    "its run_at exactly. Default: the timer's max_idle_seconds, the longest "
                    "it sleeps between passes.")
    schedule_max_fires_per_second: float = Field(
        default=0, ge=0,
        description="Cap on recurring jobs this timer makes due per second (0: no cap, else "
                    "at least 1; a fraction is rounded down); extra runs are pushed into the "
                    "next seconds, never dropped.")

    # History and retention (TOCK_RETENTION_*): finished jobs live in day partitions of
    # their final state, dropped whole once the day ends more than this long ago.
    retention_succeeded_hours: float = Field(
        default=168.0, ge=1, le=24 * 3660,
        description="Keep succeeded jobs (and their attempts and keys) at least this long.")
    retention_dead_hours: float = Field(
        default=720.0, ge=1, le=24 * 3660,
        description="Keep dead jobs at least this long (they can be retried until then).")
    retention_cancelled_hours: float = Field(
        default=168.0, ge=1, le=24 * 3660,
        description="Keep cancelled jobs at least this long.")
    retention_workers_hours: float = Field(
        default=24.0, ge=1, le=24 * 3660,
        description="Forget consumers stopped or silent this long (holding no running job).")
    retention_audit_hours: float = Field(
        default=720.0, ge=1, le=24 * 3660,
        description="Forget recurring-schedule audit records older than this.")
    retention_interval_seconds: float = Field(
        default=60.0, gt=0, le=3600,
        description="How often the retention loop runs (a full batch goes on at once).")
    retention_batch_size: int = Field(
        default=1000, ge=1, le=50_000,
        description="Rows per retention transaction (moves, prunes, key frees).")

    # Backlog metrics for autoscaling that reads CloudWatch (TOCK_CLOUDWATCH_*; ECS).
    cloudwatch_namespace: str = Field(
        default="", max_length=255,
        description="Publish each queue's backlog to CloudWatch under this namespace every "
                    "cloudwatch_interval_seconds: jobs due and not yet running (in Postgres "
                    "or in SQS), jobs running, and the oldest due job's age. SQS's own "
                    "metrics see only the dispatch window. Empty: not published.")
    # Twice a minute: a pass that waits the interval after a slow publish still leaves a
    # data point in every one-minute period the scaling policies read.
    cloudwatch_interval_seconds: float = Field(default=30.0, ge=1, le=3600)
    cloudwatch_queues: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Queues always published (0 while empty), so that scaling in has "
                    "data; others are published while they hold unfinished work.")

    @field_validator("cloudwatch_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if value and (not CLOUDWATCH_NAMESPACE.fullmatch(value) or value.startswith("AWS/")):
            raise ValueError(f"not a CloudWatch namespace: {value!r} (letters, digits and "
                             "._-/#: only, not starting with AWS/)")
        return value

    @field_validator("cloudwatch_queues", mode="before")
    @classmethod
    def _split_cloudwatch_queues(cls, value: Any) -> Any:
        return _queue_list(value)

    @field_validator("cloudwatch_queues")
    @classmethod
    def _cloudwatch_queue_names(cls, value: list[str]) -> list[str]:
        return _queue_names(value)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be >= backoff_base_seconds")
        if 0 < self.schedule_max_fires_per_second < 1:
            raise ValueError(f"schedule_max_fires_per_second "
                             f"({self.schedule_max_fires_per_second:g}) must be 0 (no cap) or "
                             "at least 1: the cap counts whole runs per second")
        if 0 < self.dispatch_window < self.batch_size:
            raise ValueError(f"dispatch_window ({self.dispatch_window}) must be 0 (no cap) or "
                             f"at least batch_size ({self.batch_size})")
        return self

    @property
    def retention_hours(self) -> dict[JobState, float]:
        """How long each final state is kept."""
        return {JobState.SUCCEEDED: self.retention_succeeded_hours,
                JobState.DEAD: self.retention_dead_hours,
                JobState.CANCELLED: self.retention_cancelled_hours}

    @property
    def lookahead_seconds(self) -> float:
        """How early a recurring slot's job is made."""
        if self.schedule_lookahead_seconds is None:
            return self.max_idle_seconds
        return self.schedule_lookahead_seconds


MAX_CONCURRENCY = 1000
"""The most handlers one consumer runs at once (`concurrency`)."""


class ConsumerSettings(CommonSettings):
    """A consumer process."""

    queues: Annotated[list[str], NoDecode] = Field(default=["default"], min_length=1)
    concurrency: int = Field(default=8, ge=1, le=MAX_CONCURRENCY,
                             description="Handlers run at once.")
    lease_seconds: float = Field(
        default=30.0, ge=0.1, le=43200,
        description="Lease per claim and heartbeat; sub-second leases are allowed (tests, "
                    "latency-sensitive work) with a heartbeat under half of it.")
    heartbeat_seconds: float = Field(default=10.0, ge=0.02)
    receive_wait_seconds: int = Field(default=2, ge=0, le=20)
    # An orchestrator's stop timeout bounds it anyway (ECS: 120 s at most); a day is
    # generous, and keeps the shutdown's deadline arithmetic in range.
    shutdown_grace_seconds: float = Field(default=20.0, ge=0, le=86400)
    # At most 10 years, as a job's delay= (a retry lands in the calendar Postgres and
    # Python share): a longer one is refused here, not by the first failed attempt.
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=MAX_DELAY_SECONDS)
    backoff_cap_seconds: float = Field(default=3600.0, gt=0, le=MAX_DELAY_SECONDS)
    default_max_attempts: int = Field(default=5, ge=1, le=1000)
    default_timeout_seconds: float = Field(default=300.0, gt=0,
                                           le=MAX_TIMEOUT_SECONDS)  # a job's own: 12 h
    unknown_kind_backoff_seconds: float = Field(
        default=30.0, gt=0, le=86400,
        description="First retry delay of a job whose kind this consumer has no handler "
                    "for (doubling per attempt); it goes dead only after its max attempts.")
    claim_batch_size: int = Field(
        default=50, ge=1, le=1000,
        description="Messages one receiver claims in one statement: while SQS hands out "
                    "full batches and handler slots are free, it receives again first.")
    completion_batch_size: int = Field(default=100, ge=1, le=1000)
    group_commit_ms: float = Field(
        default=2.0, ge=0, le=1000,
        description="After an outcome is ready, wait up to this long for more while "
                    "handlers run, so one commit covers several (0: write at once).")
    worker_id: str | None = Field(default=None, max_length=200)
    health_port: int | None = Field(default=None, ge=1, le=65535)
    isolation: Literal["thread", "process"] = Field(
        default="thread",
        description="Where handlers run, for kinds that do not say (`@task(..., "
                    "isolation=...)` wins): threads of this process (timeouts are "
                    "cooperative) or a pool of `concurrency` child processes, one job each "
                    "at a time (a handler that overruns its timeout is killed and its "
                    "process replaced).")
    stuck_exit_seconds: float = Field(
        default=300.0, ge=0, le=86400,
        description="Thread isolation cannot kill a handler that ignores its deadline: "
                    "once every handler slot has been held by such a stuck handler this "
                    "long, the consumer exits (non-zero) so its orchestrator restarts it "
                    "(their jobs were already recovered elsewhere). It is not ready while "
                    "every slot is stuck. 0: never exit.")
    kill_grace_seconds: float = Field(
        default=5.0, ge=0, le=300,
        description="With process isolation (this consumer's or a kind's): how long a "
                    "handler told to stop (deadline, lost lease, shutdown) may go on before "
                    "its process is killed (SIGKILL).")

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, value: str | None) -> str | None:
        # Shown in `tock workers`, the dashboard and every job's attempts: a newline or an
        # invisible character there would show as another worker's id.
        if value is not None:
            try:
                visible("worker id", value)
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("queues", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _queue_list(value)

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: list[str]) -> list[str]:
        return _queue_names(value)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.heartbeat_seconds * 2 >= self.lease_seconds:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be under half of "
                f"lease_seconds ({self.lease_seconds}), so one missed beat does not lose the lease"
            )
        if self.visibility_timeout_seconds < self.lease_seconds:
            raise ValueError(
                f"visibility_timeout_seconds ({self.visibility_timeout_seconds}) must be >= "
                f"lease_seconds ({self.lease_seconds}), or SQS redelivers a job whose lease holds"
            )
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be >= backoff_base_seconds")
        if self.isolation == "process":
            problem = self.kill_grace_problem("isolation=process")
            if problem:
                raise ValueError(problem)
        return self

    def kill_grace_problem(self, used_by: str) -> str | None:
        """What is wrong with `kill_grace_seconds` where process isolation is used (by the
        consumer's setting, or by kinds that ask for it: the consumer checks those when it
        starts), or None. A grace as long as the lease would have the lease keeper leave
        the job to expire as stuck before the handler is killed."""
        if self.kill_grace_seconds < self.lease_seconds:
            return None
        return (f"kill_grace_seconds ({self.kill_grace_seconds}) must be under lease_seconds "
                f"({self.lease_seconds}) with {used_by}, so a handler past its deadline is "
                "killed before its job is left to expire")


class HealthSettings(TockSettings):
    """Where the probe server listens (TOCK_HEALTH_*); the port itself is the process's
    `health_port`."""

    model_config = SettingsConfigDict(env_prefix="TOCK_HEALTH_", extra="forbid")

    host: str = Field(default="0.0.0.0", min_length=1)  # probed from outside the container


def _queue_list(value: Any) -> Any:
    """`a,b` or a JSON list, from the environment or --queues."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise ValueError(f"not a JSON list of queue names: {text!r}") from None
        if not text:
            return []
        names = [q.strip() for q in text.split(",")]
        if not all(names):  # as --queues: `a,,b` or `a,` is a typo, not two queues
            raise ValueError(f"empty queue name in {value!r} (give queue names "
                             "separated by commas, e.g. default,reports)")
        return names
    return value


def _queue_names(value: list[str]) -> list[str]:
    bad = [q for q in value if not QUEUE_NAME.fullmatch(q)]
    if bad:
        raise ValueError(f"queue names must match {QUEUE_NAME.pattern}: {bad}")
    return value


READ_ELSEWHERE = frozenset({
    # dashboard/settings.py (the dashboard's own settings class)
    "TOCK_DASHBOARD_ALLOWED_HOSTS", "TOCK_DASHBOARD_DEV", "TOCK_DASHBOARD_FINISHED_TTL_SECONDS",
    "TOCK_DASHBOARD_HOST", "TOCK_DASHBOARD_MAX_BODY_BYTES", "TOCK_DASHBOARD_METRICS_PUBLIC",
    "TOCK_DASHBOARD_METRICS_TOKEN", "TOCK_DASHBOARD_OPERATOR_TOKEN", "TOCK_DASHBOARD_PORT",
    "TOCK_DASHBOARD_SECRET_KEY", "TOCK_DASHBOARD_SECURE_COOKIES", "TOCK_DASHBOARD_SESSION_HOURS",
    "TOCK_DASHBOARD_STATS_TTL_SECONDS", "TOCK_DASHBOARD_VIEWER_TOKEN",
    "TOCK_DASHBOARD_WORKER_STALE_SECONDS",
    # read by name: the log lines' process name, make run's LocalStack, the local queues
    "TOCK_PROCESS_NAME", "TOCK_LOCALSTACK_VENV", "TOCK_DLQ_MAX_RECEIVE_COUNT",
})
"""The TOCK_* variables tock reads outside the settings classes above (a unit test keeps
this list equal to what the code reads)."""


def known_variables() -> frozenset[str]:
    """Every TOCK_* environment variable any tock process reads."""
    names = set(READ_ELSEWHERE)
    for cls in (CommonSettings, ClientSettings, TimerSettings, ConsumerSettings,
                HealthSettings):
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        names.update(prefix + field.upper() for field in cls.model_fields)
    return frozenset(names)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The TOCK_* variables in `environ` that no tock process reads (a typo such as
    TOCK_CONCURENCY leaves the default in force), each with the known name it is
    closest to, if any."""
    known = known_variables()
    return [(name, next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.8)), None))
            for name in sorted(environ) if name.startswith("TOCK_") and name not in known]
