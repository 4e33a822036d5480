"""A worker id is one live process's. The jobs a worker runs are known by its id alone, so
two live consumers under one id (a fixed TOCK_WORKER_ID given to both) would each take the
other's jobs for lost. A consumer therefore takes its id with a fenced upsert before it
claims anything: at start, or, when Postgres was away then, at its first heartbeat.
"""

from __future__ import annotations

import logging

from consumer.pipeline import Pipeline
from shared.core.errors import ConfigError
from shared.runtime.logs import emit
from shared.store.rows import WorkerHolder

log = logging.getLogger("tock.consumer")


class WorkerIdTaker:
    """Takes this process's worker id, once. A holder whose lease runs out (a process that
    died) gives it up; one whose heartbeat moves is alive, and then the id is refused."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self._held_by: WorkerHolder | None = None
        """The holder as first found: its heartbeat then, to tell whether it still beats."""

    def attempt(self) -> WorkerHolder | None:
        """Try once: None when this process holds its id now, else the live process that
        does. `ConfigError` once that process has beaten since it was first found; the
        database being away raises `Retryable`, and the id stays untaken."""
        pipe = self.pipe
        holder = pipe.store.take_worker_id(pipe.announcement(), pipe.settings.lease_seconds,
                                           pipe.clock())
        if holder is None:
            pipe.worker_id_pending = False
            return None
        if self._held_by is None:
            self._held_by = holder
            emit(log, "worker_id_held", logging.WARNING, worker=pipe.worker_id,
                 host=holder.host, pid=holder.pid, expires_in_s=round(holder.expires_in, 1),
                 detail="waiting for its lease to run out (a process that died)")
        elif holder.last_heartbeat != self._held_by.last_heartbeat:
            raise ConfigError(
                f"TOCK_WORKER_ID {pipe.worker_id!r} is in use by a live consumer (host "
                f"{holder.host}, pid {holder.pid}, heartbeat at {holder.last_heartbeat}): "
                "every consumer process needs its own id; leave TOCK_WORKER_ID unset "
                "for a generated one")
        return holder
