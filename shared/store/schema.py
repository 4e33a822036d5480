"""The declared schema, as SQLAlchemy metadata. The migrations in shared/store/migrations are
what creates it; tests/integration/test_schema.py checks that a database migrated from zero
matches this declaration, table by table, column by column, index by index, and the
partitioning of the history tables (`PARTITIONED`) and the views (`VIEWS`)."""

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION, INTERVAL, JSONB, UUID

from shared.core.states import FINAL_STATES, AttemptOutcome, JobState
from shared.store.retention_sql import PARTITIONS_AHEAD_DAYS

metadata = MetaData()

job_state = Enum(*[s.value for s in JobState], name="tock_job_state")
attempt_outcome = Enum(*[o.value for o in AttemptOutcome], name="tock_attempt_outcome")
TS = DateTime(timezone=True)

jobs = Table(
    "tock_jobs", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("kind", Text, nullable=False),
    Column("queue", Text, nullable=False, server_default="default"),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False, server_default="0"),
    Column("state", job_state, nullable=False, server_default="scheduled"),
    Column("run_at", TS, nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer),
    Column("timeout_seconds", DOUBLE_PRECISION),
    Column("unique_key", Text),
    Column("tenant", Text),
    Column("lease_owner", Text),
    Column("lease_expires_at", TS),
    Column("dispatch_token", UUID),
    Column("dispatched_at", TS),
    Column("last_error", Text),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("started_at", TS),
    Column("finished_at", TS),
    Column("schedule_name", Text),  # 0002: which recurring schedule made the job
    Column("dispatch_failures", Integer, nullable=False, server_default="0"),  # 0004
    Column("lease_detached", Boolean, nullable=False, server_default="false"),  # 0006
    Column("concurrency_key", Text),  # 0009
    CheckConstraint("priority BETWEEN 0 AND 9"),
    Index("tock_jobs_in_flight_idx", "kind", text("coalesce(tenant, '')"),
          postgresql_where=text("state IN ('dispatched', 'running')")),  # 0008
    Index("tock_jobs_key_in_flight_idx", "kind", "concurrency_key",
          postgresql_where=text("concurrency_key IS NOT NULL AND "
                                "state IN ('dispatched', 'running')")),  # 0009
    Index("tock_jobs_due_idx", "priority", "run_at", "id",
          postgresql_where=text("state IN ('scheduled', 'retrying')")),
    Index("tock_jobs_owner_idx", "lease_owner", postgresql_where=text("state = 'running'")),
    Index("tock_jobs_detached_idx", "lease_expires_at",
          postgresql_where=text("state = 'running' AND lease_detached")),
    Index("tock_jobs_dispatched_idx", "dispatched_at",
          postgresql_where=text("state = 'dispatched'")),
    Index("tock_jobs_unique_key_idx", "unique_key", unique=True,
          postgresql_where=text("unique_key IS NOT NULL")),
    Index("tock_jobs_kind_idx", "kind", "id"),
    Index("tock_jobs_state_idx", "state", "id"),
    Index("tock_jobs_schedule_active_idx", "schedule_name",
          postgresql_where=text("schedule_name IS NOT NULL AND state IN "
                                "('scheduled', 'retrying', 'dispatched', 'running')")),
    Index("tock_jobs_queue_idx", "queue", "id"),
    Index("tock_jobs_group_idx", "queue", "kind", "state", "run_at"),  # 0011: bounded counts
    Index("tock_jobs_tenant_idx", "tenant", "id", postgresql_where=text("tenant IS NOT NULL")),
    Index("tock_jobs_finished_idx", "finished_at",
          postgresql_where=text("finished_at IS NOT NULL")),
)

# Newest first within a group (0010): the timer's probes land on live rows, not on the
# dead entries claimed jobs leave at the old end until vacuum.
Index("tock_jobs_fair_idx", jobs.c.priority, jobs.c.kind, jobs.c.queue,
      text("coalesce(tenant, '')"), jobs.c.run_at.desc(), jobs.c.id.desc(),
      postgresql_where=text("state IN ('scheduled', 'retrying')"))  # 0008, 0010, 0014
Index("tock_jobs_key_due_idx", jobs.c.kind, jobs.c.priority, text("coalesce(tenant, '')"),
      jobs.c.concurrency_key, jobs.c.run_at.desc(), jobs.c.id.desc(),
      postgresql_where=text("concurrency_key IS NOT NULL AND "
                            "state IN ('scheduled', 'retrying')"))  # 0009

attempts = Table(
    "tock_attempts", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("tock_jobs.id", ondelete="CASCADE"),
           nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker", Text),
    Column("started_at", TS),
    Column("finished_at", TS, nullable=False),
    Column("outcome", attempt_outcome, nullable=False),
    Column("error", Text),
    Column("traceback", Text),
    Index("tock_attempts_job_idx", "job_id", "id"),
    Index("tock_attempts_finished_idx", "finished_at"),
)

workers = Table(
    "tock_workers", metadata,
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", ARRAY(Text), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("in_flight", Integer, nullable=False, server_default="0"),
    Column("started_at", TS, nullable=False),
    Column("last_heartbeat", TS, nullable=False),
    Column("stopped_at", TS),
    Column("kinds", ARRAY(Text), nullable=False, server_default="{}"),  # 0005
    Column("lease_expires_at", TS),  # 0006: the lease every job of the worker hangs off
)

schedules = Table(
    "tock_schedules", metadata,
    Column("name", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("max_attempts", Integer),
    Column("timeout_seconds", DOUBLE_PRECISION),
    Column("tenant", Text),
    Column("cron", Text),
    Column("every", INTERVAL),
    Column("anchor", TS),
    Column("tz", Text, nullable=False),
    Column("misfire", Enum("skip", "latest", "all", name="tock_schedule_misfire"),
           nullable=False),
    Column("misfire_grace_seconds", DOUBLE_PRECISION, nullable=False),
    Column("backfill_max", Integer, nullable=False),
    Column("backfill_gap_seconds", DOUBLE_PRECISION, nullable=False),
    Column("overlap", Enum("allow", "skip", "buffer_one", name="tock_schedule_overlap"),
           nullable=False),
    Column("dst_gap", Enum("shift", "skip", name="tock_schedule_dst_gap"), nullable=False),
    Column("dst_fold", Enum("once", "twice", name="tock_schedule_dst_fold"), nullable=False),
    Column("spread_seconds", DOUBLE_PRECISION, nullable=False),
    Column("jitter_seconds", DOUBLE_PRECISION, nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("cursor_at", TS, nullable=False),
    Column("next_slot", TS),
    Column("next_fire_at", TS),
    Column("buffered_slot", TS),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Index("tock_schedules_due_idx", "next_fire_at", postgresql_where=text("NOT paused")),
    Index("tock_schedules_buffered_idx", "name",
          postgresql_where=text("buffered_slot IS NOT NULL AND NOT paused")),
)

schedule_audit = Table(
    "tock_schedule_audit", metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("schedule", Text, ForeignKey("tock_schedules.name", ondelete="CASCADE"),
           nullable=False),
    Column("reason", Text, nullable=False),
    Column("first_slot", TS, nullable=False),
    Column("last_slot", TS, nullable=False),
    Column("slot_count", Integer),
    Column("detail", Text),
    Column("recorded_at", TS, nullable=False),
    Index("tock_schedule_audit_schedule_idx", "schedule", "id"),
    Index("tock_schedule_audit_recorded_idx", "recorded_at"),  # 0007: pruned by age
)

# --- 0007: the history, and the keys that span it ----------------------------------------

keys = Table(
    "tock_keys", metadata,
    Column("unique_key", Text, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
)

history_jobs = Table(
    "tock_history_jobs", metadata,
    *[Column(c.name, c.type, nullable=c.nullable and c.name != "finished_at")
      for c in jobs.columns],
    PrimaryKeyConstraint("id", "state", "finished_at"),
    Index("tock_history_jobs_kind_idx", "kind", "id"),
    Index("tock_history_jobs_queue_idx", "queue", "id"),
    Index("tock_history_jobs_tenant_idx", "tenant", "id",
          postgresql_where=text("tenant IS NOT NULL")),
    Index("tock_history_jobs_key_idx", "unique_key",
          postgresql_where=text("unique_key IS NOT NULL")),
    Index("tock_history_jobs_schedule_idx", "schedule_name", "run_at", "id",
          postgresql_where=text("schedule_name IS NOT NULL")),
    Index("tock_history_jobs_finished_idx", "finished_at", postgresql_using="brin"),
    postgresql_partition_by="LIST (state)",
)

history_attempts = Table(
    "tock_history_attempts", metadata,
    *[Column(c.name, c.type, nullable=c.nullable) for c in attempts.columns],
    Column("job_state", job_state, nullable=False),
    Column("job_finished_at", TS, nullable=False),
    Index("tock_history_attempts_job_idx", "job_id", "id"),
    Index("tock_history_attempts_finished_idx", "job_finished_at", postgresql_using="brin"),
    postgresql_partition_by="LIST (job_state)",
)

HISTORY_STATES = tuple(s.value for s in FINAL_STATES)
"""The LIST partitions of each history table, one per final state."""

PARTITIONED = {
    "tock_history_jobs": ("LIST (state)", "RANGE (finished_at)"),
    "tock_history_attempts": ("LIST (job_state)", "RANGE (job_finished_at)"),
}
"""Each history table: its partition key, and that of its per-state partitions (which hold
a DEFAULT partition and one partition per UTC day, `<table>_<state>_pYYYYMMDD`)."""


VIEWS = {
    "tock_jobs_all": [c.name for c in jobs.columns],
    "tock_attempts_all": [c.name for c in attempts.columns],
}
"""Both sides of each table, for psql and scripts."""

tenant_weights = Table(  # 0008
    "tock_tenant_weights", metadata,
    Column("tenant", Text, primary_key=True),
    Column("weight", Integer, nullable=False),
    Column("updated_at", TS, nullable=False),
    CheckConstraint("weight BETWEEN 1 AND 1000"),
)

limits = Table(  # 0008
    "tock_limits", metadata,
    Column("scope", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("max_running", Integer),
    Column("rate", DOUBLE_PRECISION),
    Column("burst", Integer),
    Column("tokens", DOUBLE_PRECISION, nullable=False),
    Column("refilled_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    CheckConstraint("scope IN ('kind', 'tenant', 'kind_key')"),  # 0009: kind_key
    CheckConstraint("scope <> 'kind_key' OR (max_running IS NOT NULL AND rate IS NULL)"),
    CheckConstraint("max_running >= 0"),
    CheckConstraint("rate > 0"),
    CheckConstraint("burst >= 1"),
    CheckConstraint("max_running IS NOT NULL OR rate IS NOT NULL"),
    CheckConstraint("(rate IS NULL) = (burst IS NULL)"),
)

lingering = Table(  # 0012: handlers still running for jobs their worker let go
    "tock_lingering", metadata,
    Column("worker", Text, ForeignKey("tock_workers.id", ondelete="CASCADE"), nullable=False),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("token", UUID, nullable=False),
    Column("kind", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("concurrency_key", Text),
    Column("reason", Text, nullable=False),
    Column("since", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("worker", "token"),
    CheckConstraint("reason IN ('cancelled', 'stuck', 'lease_lost', 'released')"),
)

migrations = Table(
    "tock_migrations", metadata,
    Column("name", Text, primary_key=True),
    Column("applied_at", TS, nullable=False),
)

__all__ = ["PARTITIONED", "PARTITIONS_AHEAD_DAYS", "VIEWS", "attempts", "history_attempts",
           "history_jobs", "jobs", "keys", "limits", "lingering", "metadata", "migrations",
           "schedule_audit", "schedules", "tenant_weights", "workers"]
