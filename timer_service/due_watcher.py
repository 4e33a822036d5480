"""Work that falls due while the dispatch threads are busy on a backlog goes out at once.

Behind one tenant's backlog both dispatch threads run full batches back to back, and a job
of another tenant that falls due waits for the next pass to start and, fair share giving it
part of each batch, for the one after: a pass time or two (10 ms in the fair share
benchmark), where with nothing else due it leaves within the wake-up (1 ms). This loop is
a third dispatch thread that works only while some (kind, tenant) pair is backlogged (it
filled its share of a full batch within the last second): it sleeps until a NOTIFY on
`tock_due` or until the next job not yet due falls due, then claims one batch of the due
work of every pair but the backlogged ones, with the dispatcher's own claim (limits, fair
share, send, commit), so the newcomer does not wait behind the backlog's passes. Rows are
taken FOR UPDATE SKIP LOCKED as by any pass, so nothing goes out twice.
"""

from __future__ import annotations

import time
from datetime import datetime

from shared.runtime.supervisor import Loop
from shared.store.database import Listener
from timer_service.dispatcher import DUE_CHANNEL, Dispatcher

LOOK_AGAIN_SECONDS = 0.25
"""The longest sleep while a pair is backlogged (no NOTIFY comes for jobs that were
scheduled long ago and fall due now), and the check interval while none is."""
MIN_SLEEP_SECONDS = 0.0002
"""At least this between two passes: a pass must not spin on a job falling due now."""
EMPTY_PASS_GAP_SECONDS = 0.005
"""After a pass that found nothing, NOTIFYs are not listened to for this long (a job
falling due still wakes it): a stream of them from the backlogged tenant's own inserts
costs at most 200 walks a second."""


class DueWatcher(Loop):
    """See the module docstring. `run_once` is one pass (0: it always sleeps after)."""

    name = "dispatch-watch"

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self._listener: Listener | None = None
        self._empty_at = float("-inf")  # when a pass last found nothing

    def run_once(self, now: datetime | None = None) -> int:
        skip = self.dispatcher.backlogged()
        if skip:
            sent, refused = self.dispatcher.dispatch_due(now, skip=skip)
            if not (sent or refused):
                self._empty_at = time.monotonic()
        return 0

    def idle(self) -> None:
        skip = self.dispatcher.backlogged()
        if not skip:
            # The dispatch threads are idle themselves, waiting for the same NOTIFY.
            self.close()
            self.wait(LOOK_AGAIN_SECONDS)
            return
        try:
            if self._listener is None:
                database = self.dispatcher.store.database
                assert database is not None
                self._listener = database.listener(DUE_CHANNEL)
            sleep = self.seconds_to_sleep(skip)
            deaf = min(EMPTY_PASS_GAP_SECONDS - (time.monotonic() - self._empty_at), sleep)
            if deaf > 0:
                if self.wait(deaf) or deaf >= sleep:
                    return
                sleep -= deaf
            self._listener.wait(sleep)
        except BaseException:
            self.close()
            raise

    def seconds_to_sleep(self, skip: frozenset[tuple[int, str, str]]) -> float:
        """Until the next job not yet due falls due, if it is not of a backlogged pair
        (those are the dispatch threads' work), at most LOOK_AGAIN_SECONDS."""
        upcoming = self.dispatcher.store.next_to_fall_due()
        if upcoming is None:
            return LOOK_AGAIN_SECONDS
        run_at, pair, db_now = upcoming
        if pair in skip:
            return LOOK_AGAIN_SECONDS
        return min(max((run_at - db_now).total_seconds(), MIN_SLEEP_SECONDS),
                   LOOK_AGAIN_SECONDS)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
