"""The configuration the library layers take. Processes read it from `TOCK_*` variables
(`shared.runtime.settings.ClientSettings` satisfies it); library users may pass their own."""

from __future__ import annotations

from typing import Protocol


class ProducerConfig(Protocol):
    """What the producer client and the schedules API need to know."""

    database_url: str
    max_payload_bytes: int
    default_queue: str
    pool_max_size: int
    reject_unknown_kinds: bool
    """Refuse a kind no consumer has announced a handler for (in the last 24 hours)."""
    call_timeout_seconds: float
    """Longest a statement of a call may run; a silent server gets a little more, then the
    call's connection is cut (shared.store.watchdog)."""
