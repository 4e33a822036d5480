
"""Every SQL statement of recurring schedules, named, in one place (the job statements are in
shared/sql.py; the conventions are the same: `now` is a parameter that defaults to the
database clock, batches travel as parallel arrays)."""

from shared.store.jobs_sql import NOW

SCHEDULE_COLUMNS = (
    "name, kind, queue, payload, priority, max_attempts, timeout_seconds, tenant, cron, every, "
    "anchor, tz, misfire, misfire_grace_seconds, backfill_max, backfill_gap_seconds, overlap, "
    "dst_gap, dst_fold, spread_seconds, jitter_seconds, paused, cursor_at, next_slot, "
    "next_fire_at, buffered_slot, created_at, updated_at"
)

DEFINITION_COLUMNS = (
    "kind", "queue", "payload", "priority", "max_attempts", "timeout_seconds", "tenant", "cron",
    "every", "anchor", "tz", "misfire", "misfire_grace_seconds", "backfill_max",
    "backfill_gap_seconds", "overlap", "dst_gap", "dst_fold", "spread_seconds", "jitter_seconds",
)

_DEFINITION_PARAMS = ", ".join(
    f"%({c})s::jsonb" if c == "payload" else
    f"%({c})s::tock_schedule_{c}" if c in ("misfire", "overlap", "dst_gap", "dst_fold") else
    f"%({c})s"
    for c in DEFINITION_COLUMNS
)

DB_NOW = f"SELECT {NOW}"

# --- client -----------------------------------------------------------------------------------

# Two producers upserting one new name at once: one inserts, the other finds the row
# (ON CONFLICT waits for the first to commit) and goes on to compare and update it.
INSERT_SCHEDULE = f"""
INSERT INTO tock_schedules (name, {", ".join(DEFINITION_COLUMNS)}, cursor_at, next_slot,
                            next_fire_at, created_at, updated_at)
VALUES (%(name)s, {_DEFINITION_PARAMS}, %(cursor_at)s, %(next_slot)s, %(next_fire_at)s,
        {NOW}, {NOW})
ON CONFLICT (name) DO NOTHING
RETURNING {SCHEDULE_COLUMNS}
"""

SELECT_SCHEDULE = f"SELECT {SCHEDULE_COLUMNS} FROM tock_schedules WHERE name = %(name)s"

# The row lock orders an update, pause or resume against a timer firing this schedule.
LOCK_SCHEDULE = SELECT_SCHEDULE + " FOR UPDATE"

LIST_SCHEDULES = f"SELECT {SCHEDULE_COLUMNS} FROM tock_schedules ORDER BY name"

UPDATE_SCHEDULE = f"""
UPDATE tock_schedules
SET ({", ".join(DEFINITION_COLUMNS)}) = ROW({_DEFINITION_PARAMS}),
    cursor_at = %(cursor_at)s, next_slot = %(next_slot)s, next_fire_at = %(next_fire_at)s,
    buffered_slot = %(buffered_slot)s, updated_at = {NOW}
WHERE name = %(name)s
RETURNING {SCHEDULE_COLUMNS}
"""

SET_PAUSED = f"""
UPDATE tock_schedules
SET paused = %(paused)s, cursor_at = %(cursor_at)s, next_slot = %(next_slot)s,
    next_fire_at = %(next_fire_at)s, buffered_slot = %(buffered_slot)s, updated_at = {NOW}
WHERE name = %(name)s
RETURNING {SCHEDULE_COLUMNS}
"""

DELETE_SCHEDULE = "DELETE FROM tock_schedules WHERE name = %(name)s RETURNING name"

SELECT_AUDIT = """
SELECT id, schedule, reason, first_slot, last_slot, slot_count, detail, recorded_at
FROM tock_schedule_audit WHERE schedule = %(name)s ORDER BY id DESC LIMIT %(limit)s
"""

# Runs still unfinished are in tock_jobs, finished ones in the history (by its schedule
# index, newest first across the day partitions): each side gives its newest `limit`.
SELECT_RUNS = """
SELECT id, unique_key, state, run_at FROM (
    (SELECT id, unique_key, state, run_at FROM tock_jobs
     WHERE schedule_name = %(name)s ORDER BY run_at DESC, id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT id, unique_key, state, run_at FROM tock_history_jobs
     WHERE schedule_name = %(name)s ORDER BY run_at DESC, id DESC LIMIT %(limit)s)
) runs ORDER BY run_at DESC, id DESC LIMIT %(limit)s
"""

# --- timer ------------------------------------------------------------------------------------

# Only unfinished runs matter, and those are all in tock_jobs (finished ones leave for the
# history), behind the partial index on schedule_name.
_ACTIVE_RUN = """EXISTS (
    SELECT 1 FROM tock_jobs j
    WHERE j.schedule_name = s.name
      AND j.state IN ('scheduled', 'retrying', 'dispatched', 'running'))"""

# overlap='buffer_one': when the run that held the buffered slot back finished (the newest
# run's, in the history), so that the slot is judged late from then, not from its own time.
_RELEASED_AT = """CASE WHEN s.buffered_slot IS NOT NULL THEN (
    SELECT h.finished_at FROM tock_history_jobs h
    WHERE h.schedule_name = s.name AND h.schedule_name IS NOT NULL
    ORDER BY h.run_at DESC, h.id DESC LIMIT 1) END"""

# Due schedules, locked: SKIP LOCKED hands each row to one timer at a time, and a row
# another timer advanced while we waited is re-checked against the WHERE clause on its new
# version (READ COMMITTED), so it is not taken when no longer due. The job insert's unique
# key is the second guard: whatever happens, a slot yields at most one job.
CLAIM_DUE_SCHEDULES = f"""
SELECT {SCHEDULE_COLUMNS.replace("name,", "s.name,", 1)}, {_RELEASED_AT} AS released_at,
       {_ACTIVE_RUN} AS active
FROM tock_schedules s
WHERE NOT s.paused AND s.next_fire_at <= {NOW} + make_interval(secs => %(lookahead)s)
ORDER BY s.next_fire_at
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED
"""

# overlap='buffer_one': schedules holding a slot whose blocking run has now finished.
CLAIM_RELEASED_BUFFERS = f"""
SELECT {SCHEDULE_COLUMNS.replace("name,", "s.name,", 1)}, {_RELEASED_AT} AS released_at,
       false AS active
FROM tock_schedules s
WHERE s.buffered_slot IS NOT NULL AND NOT s.paused AND s.name <> ALL(%(taken)s)
  AND NOT {_ACTIVE_RUN}
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED
"""

INSERT_SLOT_JOBS = """
INSERT INTO tock_jobs (kind, queue, payload, priority, run_at, max_attempts, timeout_seconds,
                       unique_key, tenant, schedule_name)
SELECT s.kind, s.queue, s.payload, s.priority, f.run_at, s.max_attempts, s.timeout_seconds,
       f.unique_key, s.tenant, s.name
FROM unnest(%(names)s::text[], %(run_ats)s::timestamptz[], %(keys)s::text[])
     AS f(name, run_at, unique_key)
JOIN tock_schedules s ON s.name = f.name
-- The run key `name:<slot>`: a slot some other path already turned into a job stays one job,
-- even once that job is finished and in the history (tock_keys holds its key: migration 0007).
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
RETURNING id, unique_key
"""

# Run keys INSERT_SLOT_JOBS found taken, by a job that is not a run of that schedule.
KEYS_HELD_ELSEWHERE = """
SELECT f.unique_key, coalesce(j.id, h.id)
FROM unnest(%(names)s::text[], %(keys)s::text[]) AS f(name, unique_key)
LEFT JOIN tock_jobs j ON j.unique_key = f.unique_key
LEFT JOIN tock_history_jobs h ON j.id IS NULL AND h.unique_key = f.unique_key
WHERE coalesce(j.id, h.id) IS NOT NULL
  AND coalesce(j.schedule_name, h.schedule_name) IS DISTINCT FROM f.name
"""

INSERT_AUDIT = f"""
INSERT INTO tock_schedule_audit (schedule, reason, first_slot, last_slot, slot_count, detail,
                                 recorded_at)
SELECT a.schedule, a.reason, a.first_slot, a.last_slot, a.slot_count, a.detail, {NOW}
FROM unnest(%(names)s::text[], %(reasons)s::text[], %(firsts)s::timestamptz[],
            %(lasts)s::timestamptz[], %(counts)s::int[], %(details)s::text[])
     AS a(schedule, reason, first_slot, last_slot, slot_count, detail)
"""

ADVANCE_SCHEDULES = f"""
UPDATE tock_schedules s
SET cursor_at = u.cursor_at, next_slot = u.next_slot, next_fire_at = u.next_fire_at,
    buffered_slot = u.buffered_slot, updated_at = {NOW}
FROM unnest(%(names)s::text[], %(cursors)s::timestamptz[], %(next_slots)s::timestamptz[],
            %(next_fires)s::timestamptz[], %(buffered)s::timestamptz[])
     AS u(name, cursor_at, next_slot, next_fire_at, buffered_slot)
WHERE s.name = u.name
"""
