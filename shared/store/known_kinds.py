"""The kinds consumers have handlers for, as they announce them in `tock_workers`, cached
for a few seconds: what `TOCK_REJECT_UNKNOWN_KINDS` checks an enqueue against."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from shared.core.errors import InvalidInput
from shared.store.job_store import JobStore

TTL_SECONDS = 5.0


class KnownKinds:
    """Refuses kinds no consumer announced in the last 24 hours (thread-safe)."""

    def __init__(self, store: JobStore, ttl_seconds: float = TTL_SECONDS) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self._kinds: frozenset[str] = frozenset()
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def check(self, kinds: Iterable[str]) -> None:
        """Raise `InvalidInput` naming the first kind no consumer knows, and the known ones.
        A kind missing from the cache is looked up again before it is refused."""
        wanted = set(kinds)
        known = self._known(refresh=False)
        if not wanted <= known:
            known = self._known(refresh=True)
        unknown = sorted(wanted - known)
        if unknown:
            raise InvalidInput(
                f"no consumer has a handler for kind {unknown[0]!r} (TOCK_REJECT_UNKNOWN_KINDS "
                f"is on); known kinds: {', '.join(sorted(known)) or 'none yet'}")

    def knows(self, kind: str) -> bool:
        """Whether a consumer announced a handler for `kind` in the last 24 hours."""
        return kind in self._known(refresh=kind not in self._known(refresh=False))

    def _known(self, *, refresh: bool) -> frozenset[str]:
        with self._lock:
            now = time.monotonic()
            stale = self._read_at is None or now - self._read_at > self.ttl_seconds
            if refresh or stale:
                self._kinds = frozenset(self.store.known_kinds())
                self._read_at = now
            return self._kinds
