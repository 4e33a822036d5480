"""How much of one tenant's backlog the dispatch window lets into an SQS queue at a time:
a depth per (kind, queue, tenant) that grows while consumers keep up with it and is cut
when a batch of its jobs has waited in SQS past the window's age (additive increase,
multiplicative decrease, the way TCP paces a sender by its acks). The timer sends a
tenant only up to its depth, so what consumers take of it is what goes out next, and the
depth settles about where consumers claim its jobs within the age.

Before it, the age was a hold: once consumers had caught up on a tenant, the timer sent
the lane's whole room of it at once (300-600 jobs within a third of a second on
LocalStack), all of which a newcomer's messages then waited behind in SQS, and the
tenant was held until consumers had worked through them. Paced, less of the backlog
sits in SQS at any time and it goes out in small steps.

The depth starts at the window's count, so a tenant with nothing in SQS (a newcomer)
goes out at once. The counts are the database's, so several timers pace the same depth:
what one sends, the others' next count sees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Triple = tuple[str, str, str]
"""(kind, queue, tenant)."""

GROWTH = 0.25
"""Batches a depth grows by per window age while none of its tenant's jobs waited past
the age: slowly beside the consumers' rate, so the sends follow their claims."""
CUT = 0.75
"""A depth whose tenant has a batch waiting past the age becomes this share of what it had
in SQS (at most its depth), never less than a batch; at most once per age."""


class Pace:
    """The depth of every (kind, queue, tenant) under the window's count. Not thread-safe:
    the dispatcher calls it under its lock."""

    def __init__(self, *, window: int, age_seconds: float, batch_size: int) -> None:
        self.window = window
        self.age_seconds = age_seconds
        self.batch_size = batch_size
        self._depth: dict[Triple, float] = {}
        self._cut_at: dict[Triple, float] = {}
        self._counted_at: float | None = None

    def update(self, in_sqs: Mapping[Triple, int], waited: Iterable[Triple],
               clock: float) -> None:
        """Adjust the depths after a count at `clock` (monotonic seconds): the tenants in
        `waited` (a batch of their jobs waited in SQS past the age) are cut, at most once
        per age, so one slow batch is not counted again while it drains; every other
        depth grows by GROWTH batches per age since the last count, up to the window."""
        if not self.window or not self.age_seconds:
            return
        elapsed = 0.0 if self._counted_at is None else max(clock - self._counted_at, 0.0)
        self._counted_at = clock
        grow = GROWTH * self.batch_size * elapsed / self.age_seconds
        behind = set(waited)
        for triple in self._depth.keys() | in_sqs.keys() | behind:
            depth = self._depth.get(triple, float(self.window))
            if triple in behind:
                cut_at = self._cut_at.get(triple)
                if cut_at is None or clock - cut_at >= self.age_seconds:
                    depth = max(float(self.batch_size),
                                CUT * min(depth, float(in_sqs.get(triple, 0))))
                    self._cut_at[triple] = clock
            else:
                depth = min(float(self.window), depth + grow)
            if depth >= self.window:  # back to the count alone: nothing to remember
                self._depth.pop(triple, None)
                self._cut_at.pop(triple, None)
            else:
                self._depth[triple] = depth

    def rooms(self, in_sqs: Mapping[Triple, int]) -> dict[Triple, int]:
        """Jobs each paced (kind, queue, tenant) may still send: its depth less its jobs in
        SQS (`in_sqs`: the last count plus what this timer sent since). Those absent are
        bounded by the window's count alone."""
        return {triple: int(depth) - in_sqs.get(triple, 0)
                for triple, depth in self._depth.items()}

    def depths(self) -> dict[Triple, int]:
        """The depth of every paced (kind, queue, tenant), for the gauge and tests."""
        return {triple: int(depth) for triple, depth in self._depth.items()}
