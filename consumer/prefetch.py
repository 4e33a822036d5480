"""A receiver's prefetch buffer: messages received from one queue but not claimed yet, taken
in a fair order as handler slots free up.

SQS hands a queue's messages out in send order, so a tenant's jobs sent behind another's
backlog wait for all of it. With a few messages held here instead (their jobs still
`dispatched`, unclaimed: the fenced claim happens only when one is taken), the SQS queue
stays near empty, a newcomer's messages are received within a receive's latency, and they
are taken ahead of the backlog's: highest priority first, then the tenant with the fewest
recent starts here (plain counts: tenant weights are not looked up), oldest first within
a tenant.

The room follows the starts: no more than `HORIZON_SECONDS` of this queue's recent start
rate, so a message waits here about that long at most, and at most `cap`
(`CAP_PER_SLOT` per handler slot). Slow handlers (seconds each) start a few jobs a second:
the room is then 0 or 1 and nothing is hoarded that another consumer could run. A
message held past `FIRST_AFTER_SECONDS` (the rate fell) goes first; one held past
`give_back_after` is handed back to SQS (Claimer) before its visibility runs out.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from shared.core.errors import InvalidMessage
from shared.core.messages import decode
from shared.transport.base import Received

HORIZON_SECONDS = 0.5
"""The room is the starts of this long at the recent rate: about a receive's latency
(LocalStack's send-to-receive is 150-200 ms), so a consumer holds what it would otherwise
wait for from SQS, not more."""
CAP_PER_SLOT = 8
"""The room's bound per handler slot. It lets a busy consumer hold its whole share of what
the timer keeps dispatched of a backlog (about the dispatch window's age, 0.25 s, of the
fleet's work): what it cannot hold waits in SQS, ahead of any newcomer's messages. At two
per slot (40 messages on 20 slots starting 400 jobs a second) a newcomer waited behind
200-300 of the backlog's; at 8 the start rate (HORIZON_SECONDS) sets the room. The cost:
SQS is then often near empty, and a receive brings fewer messages (about 6, not 8)."""
RATE_WINDOW_SECONDS = 2.0
"""Starts counted over this long for the rate."""
RECENT_HALF_LIFE_SECONDS = 1.0
"""A tenant's recent starts halve in this long: a tenant idle a few seconds counts as new."""
FIRST_AFTER_SECONDS = 1.0
"""A message held this long is taken before any other (oldest first)."""
MALFORMED = 10
"""The order of a message that does not decode: above every priority (0-9), so the claim
drops it at once; it takes no handler."""

Clock = Callable[[], float]


class _Held(NamedTuple):
    msg: Received
    at: float
    """When it was received (monotonic)."""


class Prefetch:
    """Thread-safe: a queue's receivers share one."""

    def __init__(self, cap: int, give_back_after: float,
                 clock: Clock = time.monotonic) -> None:
        self.cap = cap
        self.give_back_after = give_back_after
        self.first_after = min(FIRST_AFTER_SECONDS, give_back_after / 2)
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], collections.deque[_Held]] = {}
        """(priority, tenant) -> its messages, oldest first."""
        self._count = 0
        self._coming = 0
        """Room handed to receives under way (`hold_room`): the other receiver of the
        queue must not receive into it too."""
        self._starts: collections.deque[tuple[float, int]] = collections.deque()
        self._started = 0
        """The sum of `_starts`' counts (kept, not summed per receive)."""
        self._recent: dict[str, float] = {}
        """Per tenant: starts here, halving every RECENT_HALF_LIFE_SECONDS."""
        self._decayed_at = clock()

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def room(self) -> int:
        """How many more messages to receive beyond the free slots."""
        now = self._clock()
        with self._lock:
            return self._room(now)

    def hold_room(self) -> int:
        """The room, held for one receive until `release_room`."""
        now = self._clock()
        with self._lock:
            room = self._room(now)
            self._coming += room
            return room

    def release_room(self, held: int) -> None:
        """The receive `hold_room` was for is over (and what it brought `add`ed)."""
        with self._lock:
            self._coming -= held

    def _room(self, now: float) -> int:
        self._forget_starts(now)
        rate = self._started / RATE_WINDOW_SECONDS
        target = min(self.cap, math.floor(rate * HORIZON_SECONDS))
        return max(target - self._count - self._coming, 0)

    def add(self, messages: list[Received]) -> None:
        now = self._clock()
        with self._lock:
            for msg in messages:
                self._held.setdefault(_order(msg), collections.deque()).append(_Held(msg, now))
            self._count += len(messages)

    def take(self, most: int) -> list[Received]:
        """Up to `most` messages in fair order, counted as started."""
        now = self._clock()
        out: list[Received] = []
        with self._lock:
            self._decay(now)
            while len(out) < most and self._held:
                key = self._next(now)
                line = self._held[key]
                out.append(line.popleft().msg)
                if not line:
                    del self._held[key]
                if key[0] != MALFORMED:
                    self._recent[key[1]] = self._recent.get(key[1], 0.0) + 1
            self._count -= len(out)
            if out:
                self._starts.append((now, len(out)))
                self._started += len(out)
        return out

    def overdue(self) -> list[Received]:
        """Remove and return the messages held past `give_back_after`."""
        limit = self._clock() - self.give_back_after
        out: list[Received] = []
        with self._lock:
            for key in list(self._held):
                line = self._held[key]
                while line and line[0].at <= limit:
                    out.append(line.popleft().msg)
                if not line:
                    del self._held[key]
            self._count -= len(out)
        return out

    def drain(self) -> list[Received]:
        """Remove and return every message held (stopping, the database away)."""
        with self._lock:
            out = [h.msg for line in self._held.values() for h in line]
            self._held.clear()
            self._count = 0
        return out

    def _next(self, now: float) -> tuple[int, str]:
        """The line to take from: the oldest message if held past `first_after`, else the
        highest priority, then the tenant with the fewest recent starts, then the oldest."""
        oldest = min(self._held, key=lambda k: self._held[k][0].at)
        if now - self._held[oldest][0].at >= self.first_after:
            return oldest
        top = max(k[0] for k in self._held)
        return min((k for k in self._held if k[0] == top),
                   key=lambda k: (self._recent.get(k[1], 0.0), self._held[k][0].at))

    def _decay(self, now: float) -> None:
        factor = 0.5 ** ((now - self._decayed_at) / RECENT_HALF_LIFE_SECONDS)
        self._decayed_at = now
        self._recent = {t: n * factor for t, n in self._recent.items() if n * factor >= 0.01}

    def _forget_starts(self, now: float) -> None:
        while self._starts and self._starts[0][0] < now - RATE_WINDOW_SECONDS:
            self._started -= self._starts.popleft()[1]


def _order(msg: Received) -> tuple[int, str]:
    """(priority, tenant) of a message; a body that does not decode goes first (MALFORMED),
    for the claim to drop. No tenant and an older message's missing one share ''."""
    try:
        parsed = decode(msg.body)
    except InvalidMessage:
        return MALFORMED, ""
    return parsed.priority, parsed.tenant or ""
