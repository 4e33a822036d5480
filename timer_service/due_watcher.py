"""Work that falls due while the dispatch threads are busy on a backlog goes out at once.

Behind one tenant's backlog both dispatch threads run full batches back to back, and a job
of another tenant that falls due waits for the next pass to start and, fair share giving it
part of each batch, for the one after: a pass time or two (10 ms in the fair share
benchmark), where with nothing else due it leaves within the wake-up (1 ms). While the
dispatch window holds a backlog back (consumers are behind on it), the dispatch threads
do not wait for the next due time either: they look again every WINDOW_POLL_SECONDS
(50 ms), and a newcomer's job would wait for that.

This loop is a third dispatch thread that works only while some (kind, tenant) pair is
backlogged (it filled its share of a full batch within the last second) or held back by
the dispatch window: it sleeps until a NOTIFY on `tock_due` or until the next job not yet
due of another pair falls due, then claims one batch of the due work of every pair but
those, with the dispatcher's own claim (limits, fair share, window, send, commit), so the
newcomer waits neither behind the backlog's passes nor for their next look. Rows are taken
FOR UPDATE SKIP LOCKED as by any pass, so nothing goes out twice.
"""

from __future__ import annotations

import time
from datetime import datetime

from shared.runtime.supervisor import Loop
from shared.store.database import Listener
from timer_service.dispatcher import DUE_CHANNEL, Dispatcher, PairAt, WindowHeld

LOOK_AGAIN_SECONDS = 0.25
"""The longest sleep while a pair is backlogged (no NOTIFY comes for jobs that were
scheduled long ago and fall due now), and the check interval while none is."""
MIN_SLEEP_SECONDS = 0.0002
"""At least this between two passes: a pass must not spin on a job falling due now."""
EMPTY_PASS_GAP_SECONDS = 0.005
"""After a pass that found nothing, NOTIFYs are not listened to for this long (a job
falling due still wakes it): a stream of them from the backlogged tenant's own inserts
costs at most 200 walks a second."""
LEAD_SECONDS = 0.01
"""For a job that falls due at a known time, the watcher wakes this much earlier and holds
the backlog's new passes (Dispatcher.priority_pass), so that the passes already running
have ended when the job falls due and its claim does not wait for a core behind theirs
(about a pass's time: 5 ms for a batch of 100 on the benchmark machine)."""


class DueWatcher(Loop):
    """See the module docstring. `run_once` is one pass (0: it always sleeps after)."""

    name = "dispatch-watch"

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self._listener: Listener | None = None
        self._empty_at = float("-inf")  # when a pass last found nothing
        self._due_at: float | None = None  # (monotonic) a job falls due then: woken early

    def run_once(self, now: datetime | None = None) -> int:
        skip = self.dispatcher.backlogged()
        due_at, self._due_at = self._due_at, None
        if skip or self.dispatcher.window_held():
            with self.dispatcher.priority_pass():
                if due_at is not None:
                    # Woken LEAD_SECONDS early: the backlog's passes are held from now, and
                    # the job is claimed the moment it falls due.
                    early = due_at - time.monotonic()
                    if 0 < early <= 2 * LEAD_SECONDS and self.wait(early):
                        return 0
                sent, refused = self.dispatcher.dispatch_due(now, skip=skip)
            if not (sent or refused):
                self._empty_at = time.monotonic()
        return 0

    def idle(self) -> None:
        skip = self.dispatcher.backlogged()
        held = self.dispatcher.window_held()
        if not (skip or held):
            # The dispatch threads are idle themselves, waiting for the same NOTIFY.
            self.close()
            self.wait(LOOK_AGAIN_SECONDS)
            return
        try:
            if self._listener is None:
                database = self.dispatcher.store.database
                assert database is not None
                self._listener = database.listener(DUE_CHANNEL)
            sleep, falls_due = self.seconds_to_sleep(skip, held)
            if falls_due:
                self._due_at = time.monotonic() + sleep
                sleep = max(sleep - LEAD_SECONDS, 0.0)
            deaf = min(EMPTY_PASS_GAP_SECONDS - (time.monotonic() - self._empty_at), sleep)
            if deaf > 0:
                if self.wait(deaf) or deaf >= sleep:
                    return
                sleep -= deaf
            self._listener.wait(sleep)
        except BaseException:
            self.close()
            raise

    def seconds_to_sleep(self, skip: frozenset[PairAt],
                         held: WindowHeld | None = None) -> tuple[float, bool]:
        """(seconds until the next job not yet due falls due, if it is not of a backlogged
        pair nor one the dispatch window holds (those are the dispatch threads' work), at
        most LOOK_AGAIN_SECONDS; whether a job falls due at the end of them)."""
        upcoming = self.dispatcher.store.next_to_fall_due()
        if upcoming is None:
            return LOOK_AGAIN_SECONDS, False
        run_at, pair, queue, db_now = upcoming
        if pair in skip or (held is not None and held.holds(pair[1], queue, pair[2])):
            return LOOK_AGAIN_SECONDS, False
        seconds = max((run_at - db_now).total_seconds(), MIN_SLEEP_SECONDS)
        return min(seconds, LOOK_AGAIN_SECONDS), seconds <= LOOK_AGAIN_SECONDS

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
