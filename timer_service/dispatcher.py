"""Due rows -> SQS messages.

Order, chosen so that no crash loses a job or leaves it stuck: claim (scheduled ->
dispatched with a new token), send, then commit, all in one transaction.
- Crash before the send, or between send and commit: the transaction rolls back, the job
  is due again at once and another pass sends it with a new token. A message already sent
  carries a token that was never committed, so it claims nothing and is dropped.
- A consumer that receives a message before the commit waits on the row lock for the
  moment it takes the commit to land, then claims normally.
- SQS refusing some entries: those rows are put back in the same transaction.
- SQS refusing some entries (or the whole call: the queue is missing, SQS is away): those
  rows are put back in the same transaction, due again after a backoff of their own
  (0.5 s doubling to 5 s), so they never block other rows; `explain` says why.
A message lost after the commit is covered by the rescuer's re-dispatch of lost messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from shared.core.errors import TransportError
from shared.core.messages import JobMessage
from shared.runtime import metrics
from shared.runtime.logs import emit
from shared.runtime.supervisor import Loop
from shared.store.database import Listener
from shared.store.flow_store import FlowStore
from shared.store.job_store import JobStore
from shared.store.rows import DueJob, LimitRoom, Refused
from shared.transport.base import MAX_BATCH, EntryFailure, Outgoing, Transport
from timer_service import fair_share
from timer_service.dispatch_pace import Pace

log = logging.getLogger("tock.timer.dispatch")

DUE_CHANNEL = "tock_due"
"""NOTIFY channel: an insert of a near-due job, a retry, or a retry delay ending soon."""
REFUSED_PAUSE_SECONDS = 0.5
"""After a pass in which SQS took nothing: a pause, so the loop does not spin."""
REFUSED_BACKOFF_BASE_SECONDS = 0.5
REFUSED_BACKOFF_CAP_SECONDS = 5.0
STUCK_AFTER_FAILURES = 5
"""A job refused this many times in a row is reported (log line, explain)."""
REPORT_EVERY_SECONDS = 30.0
LIMIT_POLL_SECONDS = 0.1
"""While due work waits for a concurrency slot: how often to look again."""
TOP_UP_ROUNDS = 3
"""Claims per level and pass: the fair shares, then up to two rounds handing what light
tenants left over to the ones that filled their share."""
KEY_WALK_MIN = 32
"""Concurrency keys a per-key claim looks at in one pass, at least (4 per job wanted)."""
BACKLOGGED_AFTER_SECONDS = 0.05
"""A (kind, tenant) pair counts as backlogged (timer_service/due_watcher.py leaves it to
the dispatch threads) once it filled its share of every full batch for this long: a
newcomer whose jobs take a pass or two is not one, so the watcher still serves it."""
BACKLOGGED_FOR_SECONDS = 1.0
"""... and until this long after the last full batch it filled its share of."""
WINDOW_RECOUNT_SECONDS = 0.02
"""How stale a count of the jobs waiting in SQS a pass may use; between counts, the jobs
this timer sent are added to it."""
LANES_COUNTED = 8
"""A kind's jobs in SQS are counted up to this many windows' worth (its queues together):
past that its every queue counts as full, as when the window was per kind."""
FLOOR_RESET_SECONDS = 1.0
"""How long a pair's claim floor lasts at most (Dispatcher._floors_for): a job due before
the floor, which its scan no longer reaches (it was locked by another pass that then
rolled back, or was enqueued with a time already past), waits at most this long more."""
WINDOW_POLL_SECONDS = 0.05
"""While a kind's dispatch window is full: how often to look again (consumers claiming
its jobs free room, which nothing announces)."""
HOLD_MAX_SECONDS = 0.05
"""The longest a backlog pass waits for the due watcher's pass (timer_service/
due_watcher.py) to finish before starting anyway."""
HOLD_BUDGET = 0.1
"""The share of time backlog passes may be held for the due watcher's, over a window of
HOLD_WINDOW_SECONDS: a tenant whose jobs fall due every few milliseconds gets its passes
run first, but cannot stall the backlog."""
HOLD_WINDOW_SECONDS = 1.0

PairAt = tuple[int, str, str]
"""(priority level, kind, tenant)."""


@dataclass(frozen=True)
class WindowHeld:
    """What the dispatch window holds back as of its last count: the (kind, queue, tenant)
    triples with as many jobs in SQS as their pace allows (timer_service/dispatch_pace.py),
    and the (kind, queue) lanes with the whole window in SQS. The dispatch threads look
    again at them every WINDOW_POLL_SECONDS; the due watcher serves everything else
    meanwhile."""

    paced: frozenset[tuple[str, str, str]] = frozenset()
    lanes: frozenset[fair_share.Lane] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.paced or self.lanes)

    def holds(self, kind: str, queue: str, tenant: str) -> bool:
        """Whether the window holds back this kind's jobs of `tenant` on `queue`."""
        return (kind, queue) in self.lanes or (kind, queue, tenant) in self.paced


PairFloor = tuple[int, str, str, str]
"""(level, kind, queue, tenant): what a claim floor is kept for."""


@dataclass
class Batch:
    """What one claim took, and what the limits held back."""

    jobs: list[DueJob] = field(default_factory=list)
    rated: set[tuple[str, str]] = field(default_factory=set)
    """(scope, key) of the rate-limited kinds and tenants: sends spend their tokens."""
    held: float | None = None
    """Seconds until it is worth looking again when a limit held due work back, else None."""
    next_token_seconds: float = LIMIT_POLL_SECONDS
    floors: dict[PairFloor, tuple[datetime, int] | None] = field(default_factory=dict)
    """Per (level, kind, queue, tenant) claimed here: where its next scan may start (the
    last job this batch took of it, when it took its whole quota), None to start from the
    oldest again; the dispatcher adopts them once the batch has committed."""

    def note_floors(self, level: int, quotas: list[fair_share.Quota],
                    got: list[DueJob]) -> None:
        """Record each quota's floor from what its claim took."""
        taken: dict[tuple[str, str, str], list[DueJob]] = defaultdict(list)
        for job in got:
            taken[(job.kind, job.queue, job.tenant_key)].append(job)
        for kind, queue, tenant, n in quotas:
            key = (level, kind, queue, tenant)
            places = [(job.run_at, job.id) for job in taken.get((kind, queue, tenant), [])
                      if job.run_at is not None]
            if len(places) < n or (key in self.floors and self.floors[key] is None):
                self.floors[key] = None  # little left past the floor: the whole pair next
            else:
                before = self.floors.get(key)
                self.floors[key] = max([*places, before] if before else places)

    def spend_tokens(self, flow: FlowStore, failed: dict[int, str],
                     now: datetime | None) -> None:
        """Take a token per job sent (not per job claimed) from its rate-limited kind and
        tenant, in the claiming transaction."""
        if not self.rated:
            return
        spent: Counter[tuple[str, str]] = Counter()
        for job in self.jobs:
            if job.id not in failed:
                for scope_key in (("kind", job.kind), ("tenant", job.tenant_key)):
                    if scope_key in self.rated:
                        spent[scope_key] += 1
        flow.take_tokens([(s, k, n) for (s, k), n in spent.items()], now)


def _next_token(rooms: list[LimitRoom]) -> float:
    """When the first empty rate bucket has a token again, at most LIMIT_POLL_SECONDS."""
    waits = [LIMIT_POLL_SECONDS]
    for room in rooms:
        if room.mine and room.tokens is not None and room.tokens < 1 and room.rate:
            waits.append((1 - room.tokens) / room.rate)
    return max(min(waits), 0.005)


class Dispatcher(Loop):
    """Claims due jobs in batches and sends them, several SendMessageBatch calls at once.
    Between passes it sleeps until the next due time, or until a NOTIFY on `tock_due`,
    never longer than `max_idle_seconds`."""

    name = "dispatch"
    threads = 2
    """Two passes in flight: one claims the next batch while the other's sends are out."""
    explicit_success = True
    """A pass whose every send SQS refused is no success for readiness, nor is any pass
    after it (refused jobs back off, so the next passes may find nothing due) until a
    send succeeds again."""

    def __init__(self, store: JobStore, transport: Transport, *, batch_size: int,
                 send_concurrency: int, max_idle_seconds: float,
                 dispatch_window: int = 0, dispatch_window_seconds: float = 0.0) -> None:
        super().__init__()
        self.store = store
        self.transport = transport
        self.batch_size = batch_size
        self.dispatch_window = dispatch_window
        """Most jobs of a kind waiting in one SQS queue (dispatched, not yet claimed); 0: no
        cap."""
        self.dispatch_window_seconds = dispatch_window_seconds
        """A (kind, queue, tenant) of which a batch of jobs has waited in SQS longer than
        this gets no more until consumers catch up; 0: only the count applies."""
        self.max_idle_seconds = max_idle_seconds
        self.ready_within_seconds = max(10.0, 5 * max_idle_seconds)
        self._executor = ThreadPoolExecutor(send_concurrency, thread_name_prefix="tock-send")
        self._local = threading.local()  # each dispatch thread: its listener, its last pass
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._reported: dict[str, float] = {}
        self._stuck_logged: dict[str, float] = {}  # queue -> when dispatch_stuck last said
        self._stuck_since: dict[str, int] = {}  # queue -> jobs stuck since that line
        self._refusals: dict[str, int] = {}
        self._cursors: dict[int, str | None] = {}  # per level: the last tenant served
        # Per (level, kind, queue, tenant) with a per-key limit: the last key looked at.
        self._key_cursors: dict[tuple[int, str, str, str], str] = {}
        self._turn = 0  # passes so far: who goes first round a limit with little room
        # (level, kind, queue, tenant) -> (run_at, id) its claims may start after: the
        # last job claimed of it, while its claims take their whole quota
        self._floors: dict[PairFloor, tuple[datetime, int]] = {}
        self._floors_since = 0.0
        # pair -> (since, last): the full batches whose share it filled, without a break
        self._filling: dict[PairAt, tuple[float, float]] = {}
        self.monotonic: Callable[[], float] = time.monotonic  # tests age the backlog with it
        # (kind, queue) -> its jobs waiting in SQS: the last count, plus what this timer
        # sent since
        self._in_sqs: dict[fair_share.Lane, int] = {}
        # the same per (kind, queue, tenant): fair share tops the tenants with fewest up
        self._pairs_in_sqs: Counter[tuple[str, str, str]] = Counter()
        # kinds with LANES_COUNTED windows in SQS, their queues together: held everywhere
        self._capped: set[str] = set()
        self._paced_lanes: set[fair_share.Lane] = set()  # those the PACED gauge shows
        # each (kind, queue, tenant)'s depth in SQS, cut when its consumers fall behind
        self._pace = Pace(window=dispatch_window, age_seconds=dispatch_window_seconds,
                          batch_size=batch_size)
        self._counted_at = -WINDOW_RECOUNT_SECONDS
        # Open unless the due watcher is running a pass: then backlog passes wait for it
        # (priority_pass), so its claim does not queue for the CPU behind theirs.
        self._gate = threading.Event()
        self._gate.set()
        self._held: list[tuple[float, float]] = []  # (start, end) of recent holds
        self._refusing = False  # the last pass that sent anything had every send refused

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            for listener in self._listeners:
                listener.close()
            self._listeners.clear()

    def run_once(self, now: datetime | None = None) -> int:
        """One batch; returns how many were sent. A full batch returns at once for more."""
        self._gate.wait(HOLD_MAX_SECONDS)  # the due watcher's pass goes first
        sent, refused = self.dispatch_due(now)
        self._local.refused = bool(refused) and not sent
        if refused and not sent:
            self._refusing = True
        elif sent:
            self._refusing = False
        if not self._refusing:
            self.mark_ok()
        return sent if sent >= self.batch_size else 0

    def idle(self) -> None:
        if getattr(self._local, "refused", False):
            self.wait(REFUSED_PAUSE_SECONDS)  # SQS is refusing sends: do not spin on them
            return
        held: float | None = getattr(self._local, "held", None)
        if held:
            # Due work waits for a limit: a slot frees when a job finishes, which nothing
            # announces, so look again shortly (sooner if a rate token is due first).
            self.wait(held)
            return
        listener: Listener | None = getattr(self._local, "listener", None)
        try:
            if listener is None:
                assert self.store.database is not None
                listener = self._local.listener = self.store.database.listener(DUE_CHANNEL)
                with self._lock:
                    self._listeners.append(listener)
            wait = self.seconds_until_next_due()
            if wait > 0:
                listener.wait(min(wait, self.max_idle_seconds))
        except BaseException:
            if listener is not None:
                listener.close()
                self._local.listener = None
                with self._lock:
                    if listener in self._listeners:
                        self._listeners.remove(listener)
            raise

    def seconds_until_next_due(self) -> float:
        """How long until the earliest scheduled job is due, capped at max_idle_seconds."""
        next_due, db_now = self.store.next_due_at()
        if next_due is None:
            return self.max_idle_seconds
        wait = (next_due - db_now).total_seconds()
        return min(max(wait, 0.0), self.max_idle_seconds)

    @contextmanager
    def priority_pass(self) -> Iterator[bool]:
        """Hold the backlog passes that have not started while the caller (the due
        watcher) runs its own, so its claim has the CPU and the GIL to itself once the
        passes already running end; yields whether it holds them. Within HOLD_BUDGET of
        the time only: past it the passes run side by side, as without it."""
        start = self.monotonic()
        with self._lock:
            self._held = [h for h in self._held if h[1] > start - HOLD_WINDOW_SECONDS]
            used = sum(end - max(begin, start - HOLD_WINDOW_SECONDS)
                       for begin, end in self._held)
            hold = used < HOLD_BUDGET * HOLD_WINDOW_SECONDS
            if hold:
                self._gate.clear()
        try:
            yield hold
        finally:
            if hold:
                self._gate.set()
                with self._lock:
                    self._held.append((start, self.monotonic()))

    def backlogged(self) -> frozenset[PairAt]:
        """The pairs the dispatch threads are busy on: each filled its share of every full
        batch for at least BACKLOGGED_AFTER_SECONDS, the last within
        BACKLOGGED_FOR_SECONDS."""
        now = self.monotonic()
        with self._lock:
            for pair in [p for p, (_, last) in self._filling.items()
                         if last < now - BACKLOGGED_FOR_SECONDS]:
                del self._filling[pair]
            return frozenset(p for p, (since, last) in self._filling.items()
                             if last - since >= BACKLOGGED_AFTER_SECONDS)

    def window_held(self) -> WindowHeld:
        """What the dispatch window holds back as of its last count (see WindowHeld)."""
        if not self.dispatch_window:
            return WindowHeld()
        with self._lock:
            full = frozenset(lane for lane, n in self._in_sqs.items()
                             if n >= self.dispatch_window)
            paced = {t for t, room in self._pace.rooms(self._pairs_in_sqs).items() if room <= 0}
            return WindowHeld(frozenset(paced), full)

    def _filled(self, level: int, pairs: list[fair_share.Pair]) -> None:
        """A full batch at `level` in which `pairs` took their whole share."""
        now = self.monotonic()
        filled = {(level, kind, tenant) for kind, _, tenant, _ in pairs}
        with self._lock:
            for pair in [p for p in self._filling if p[0] == level and p not in filled]:
                del self._filling[pair]
            for pair in filled:
                since, last = self._filling.get(pair, (now, now))
                self._filling[pair] = (since if now - last <= BACKLOGGED_FOR_SECONDS
                                       else now, now)

    def dispatch_due(self, now: datetime | None = None, *,
                     skip: frozenset[PairAt] | None = None) -> tuple[int, int]:
        """Claim one batch (leaving out the pairs in `skip`), send it, commit; returns
        (sent, refused)."""
        with self.store.transaction() as tx:
            batch = self.claim_batch(tx, now, skip=skip)
            self._local.held = batch.held
            due = batch.jobs
            if not due:
                self._adopt_floors(batch.floors)  # only drops: nothing to roll back
                return 0, 0
            failed = self._send(due)
            if failed:
                streaks = tx.undo_dispatch(
                    [Refused(j.id, j.prev_state, failed[j.id]) for j in due if j.id in failed],
                    backoff_base_seconds=REFUSED_BACKOFF_BASE_SECONDS,
                    backoff_cap_seconds=REFUSED_BACKOFF_CAP_SECONDS, now=now)
            batch.spend_tokens(tx.sibling(FlowStore), failed, now)
        self._adopt_floors(batch.floors)
        if failed:
            self._report_stuck(due, streaks, failed)
        if self.dispatch_window:
            sent_of = Counter((job.kind, job.queue, job.tenant_key) for job in due
                              if job.id not in failed)
            with self._lock:
                for (kind, queue, tenant), n in sent_of.items():
                    self._in_sqs[(kind, queue)] = self._in_sqs.get((kind, queue), 0) + n
                    self._pairs_in_sqs[(kind, queue, tenant)] += n
        for job in due:
            if job.id not in failed:
                metrics.DUE_TO_DISPATCH.observe(max(job.lag_seconds, 0.0))
                emit(log, "job_dispatched", logging.DEBUG, job_id=job.id, kind=job.kind,
                     queue=job.queue, lag_ms=round(job.lag_seconds * 1000, 1))
        return len(due) - len(failed), len(failed)

    def claim_batch(self, tx: JobStore, now: datetime | None, *,
                    skip: frozenset[PairAt] | None = None) -> Batch:
        """One batch, in the caller's transaction: priority levels highest first; within a
        level the (kind, queue, tenant) pairs with due work share it (fair_share.plan), no
        kind or tenant past its limit nor (kind, queue) lane past its dispatch window, and
        what a pair with little due work leaves over goes to the pairs that filled their
        share.

        With `skip` (the due watcher's pass) the pairs in it are left out, the walk starts
        from the first tenant and the round-robin cursors are left as they are; without,
        the pairs that fill their share of a full batch are recorded as backlogged."""
        flow = tx.sibling(FlowStore)
        rooms = flow.limit_rooms(now)
        kind_room = {r.key: r.room for r in rooms if r.scope == "kind" and r.room is not None}
        lane_room, pair_room, in_sqs = self._window_rooms(flow, now)
        waited = {triple for triple, room in pair_room.items() if room <= 0}
        with self._lock:
            for kind in self._capped:
                kind_room[kind] = 0
        window_full = bool(waited) or any(room <= 0 for room in lane_room.values())
        tenant_room = {r.key: r.room for r in rooms
                       if r.scope == "tenant" and r.room is not None}
        keyed = {r.key: r for r in rooms if r.scope == "kind_key"}
        batch = Batch(rated={(r.scope, r.key) for r in rooms if r.tokens is not None},
                      next_token_seconds=_next_token(rooms))
        if window_full:
            batch.next_token_seconds = min(batch.next_token_seconds, WINDOW_POLL_SECONDS)
        with self._lock:
            self._turn += 1
            turn = self._turn
        for level in flow.due_levels(now):
            capacity = self.batch_size - len(batch.jobs)
            if capacity <= 0:
                break
            skip_kinds = [k for k, n in kind_room.items() if n <= 0]
            skip_tenants = [t for t, n in tenant_room.items() if n <= 0]
            skip_lanes = [lane for lane, n in lane_room.items() if n <= 0]
            if skip_kinds or skip_tenants:
                batch.held = batch.next_token_seconds
            with self._lock:
                cursor = self._cursors.get(level) if skip is None else None
            after = flow.due_pairs(level, capacity, after=cursor, skip_kinds=skip_kinds,
                                   skip_tenants=skip_tenants, skip_lanes=skip_lanes, now=now)
            wrapped: list[fair_share.Pair] = []
            if cursor is not None and len({p[2] for p in after}) < capacity:
                wrapped = flow.due_pairs(level, capacity, skip_kinds=skip_kinds,
                                         skip_tenants=skip_tenants, skip_lanes=skip_lanes,
                                         now=now)
            pairs = fair_share.round_from(after, wrapped, cursor, capacity)
            if skip is not None:
                pairs = [p for p in pairs if (level, p[0], p[2]) not in skip]
            else:
                tenants = list(dict.fromkeys(p[2] for p in pairs))
                with self._lock:
                    self._cursors[level] = tenants[-1] if len(tenants) >= capacity else None
            # Held pairs stay in the plan where others send to their SQS queue: their jobs
            # there set the level the others send up to (fair_share.quotas). A queue hands
            # out in send order; another queue's backlog delays nothing here.
            sending = {p[1] for p in pairs if (p[0], p[1], p[2]) not in waited}
            pairs = [p for p in pairs if (p[0], p[1], p[2]) not in waited or p[1] in sending]
            held = {(p[0], p[1], p[2]) for p in pairs if (p[0], p[1], p[2]) in waited}
            for _ in range(TOP_UP_ROUNDS):
                share = fair_share.plan(pairs, capacity, kind_room=kind_room,
                                        tenant_room=tenant_room, lane_room=lane_room,
                                        pair_room=pair_room, turn=turn, in_sqs=in_sqs,
                                        held=held)
                if not share:
                    break
                got = self._claim(flow, level, share, keyed=keyed, batch=batch, turn=turn,
                                  now=now)
                batch.jobs.extend(got)
                capacity -= len(got)
                taken = Counter((job.kind, job.queue, job.tenant_key) for job in got)
                for (kind, queue, tenant), n in taken.items():
                    if self.dispatch_window:  # the top-up rounds level over these too
                        in_sqs[(kind, queue, tenant)] = in_sqs.get((kind, queue, tenant), 0) + n
                    if kind in kind_room:
                        kind_room[kind] -= n
                    if tenant in tenant_room:
                        tenant_room[tenant] -= n
                    if (kind, queue) in lane_room:
                        lane_room[(kind, queue)] -= n
                    if (kind, queue, tenant) in pair_room:
                        pair_room[(kind, queue, tenant)] -= n
                # Pairs that took their whole share may have more; the others are done.
                wanted = {(k, q, t): n for k, q, t, n in share}
                pairs = [p for p in pairs if (p[0], p[1], p[2]) in held
                         or taken[(p[0], p[1], p[2])] >= wanted.get((p[0], p[1], p[2]), 1)]
                if capacity <= 0 or not pairs:
                    break
            if capacity <= 0 and skip is None:
                self._filled(level, [p for p in pairs if (p[0], p[1], p[2]) not in held])
        if window_full and len(batch.jobs) < self.batch_size:
            # Room comes as consumers claim, which nothing announces, and the held work is
            # overdue, so the next due time is now: without this the pass went straight
            # back to an empty claim (four statements and a commit), over and over.
            batch.held = batch.next_token_seconds
        return batch

    def _window_rooms(self, flow: FlowStore, now: datetime | None
                      ) -> tuple[dict[fair_share.Lane, int], dict[tuple[str, str, str], int],
                                 dict[tuple[str, str, str], int]]:
        """The dispatch window: (room left of each (kind, queue) lane that may not have a
        whole batch of it: dispatch_window minus its jobs in SQS; room left of each (kind,
        queue, tenant) under its pace (timer_service/dispatch_pace.py): its depth, cut when
        a batch of its jobs waited in SQS past dispatch_window_seconds (consumers are
        behind on them, and what is sent now would wait behind them), less its jobs in
        SQS; each one's jobs in SQS, for fair share to level). Recounted when the count is
        older than WINDOW_RECOUNT_SECONDS.

        Per lane, so a kind held back on a queue whose consumers are behind (or absent)
        still goes out on its other queues; the age and the pace are per tenant too, so a
        tenant's backlog in SQS holds back that tenant only: another tenant's jobs go out
        at once, and wait behind about the window's age of it. The window is soft: between
        counts, other timers' sends are not seen, so the lanes may run over by what they
        send in that time."""
        if not self.dispatch_window:
            return {}, {}, {}
        clock = self.monotonic()
        with self._lock:
            recount = clock - self._counted_at >= WINDOW_RECOUNT_SECONDS
            if recount:
                self._counted_at = clock  # this thread counts; the other uses the last count
        if recount:
            cap = self.dispatch_window * LANES_COUNTED
            counts = flow.in_sqs(cap, self.dispatch_window_seconds, now)
            by_lane: Counter[fair_share.Lane] = Counter()
            by_kind: Counter[str] = Counter()
            for (kind, queue, _), (n, _) in counts.items():
                by_lane[(kind, queue)] += n
                by_kind[kind] += n
            # Counted only so far: the kind's lanes may hold more than was seen, so the
            # kind waits on every queue until the count falls back under the cap.
            capped = {kind for kind, n in by_kind.items() if n >= cap}
            waited = {key for key, (_, old) in counts.items()
                      if self.dispatch_window_seconds and old >= self.batch_size}
            pairs = Counter({key: n for key, (n, _) in counts.items()})
            with self._lock:
                emptied = self._in_sqs.keys() - by_lane.keys()
                self._in_sqs, self._capped = dict(by_lane), capped
                self._pairs_in_sqs = pairs
                self._pace.update(pairs, waited, clock)
                paced = Counter((kind, queue) for kind, queue, _ in self._pace.depths())
                unpaced = self._paced_lanes - paced.keys()
                self._paced_lanes = set(paced)
            for kind, queue in unpaced:
                metrics.PACED.labels(kind, queue).set(0)
            for (kind, queue), n in paced.items():
                metrics.PACED.labels(kind, queue).set(n)
            for kind, queue in emptied:
                metrics.IN_SQS.labels(kind, queue).set(0)
            for (kind, queue), n in by_lane.items():
                metrics.IN_SQS.labels(kind, queue).set(n)
        with self._lock:
            rooms = {lane: self.dispatch_window - n for lane, n in self._in_sqs.items()
                     if n > self.dispatch_window - self.batch_size or lane[0] in self._capped}
            for lane in rooms:
                if lane[0] in self._capped:
                    rooms[lane] = 0
            pair_rooms = self._pace.rooms(self._pairs_in_sqs)
            return rooms, pair_rooms, dict(self._pairs_in_sqs)

    def _floors_for(self, level: int) -> dict[tuple[str, str, str], tuple[datetime, int]]:
        """The claim floors of the pairs at `level`, all dropped every FLOOR_RESET_SECONDS:
        the scan of a pair starts after the last job claimed of it rather than at its
        oldest due job, past the index entries of every job claimed since the last
        VACUUM (a backlog's claims would read more of them every batch: 13 more buffers
        per job after 100,000 claimed, measured)."""
        clock = self.monotonic()
        with self._lock:
            if clock - self._floors_since >= FLOOR_RESET_SECONDS:
                self._floors.clear()
                self._floors_since = clock
            return {(k, q, t): floor for (lvl, k, q, t), floor in self._floors.items()
                    if lvl == level}

    def _adopt_floors(self, floors: dict[PairFloor, tuple[datetime, int] | None]) -> None:
        """Keep a committed batch's floors: the later of two passes' (both claimed up to
        theirs), none where a claim found little past its floor."""
        with self._lock:
            for key, floor in floors.items():
                if floor is None:
                    self._floors.pop(key, None)
                else:
                    before = self._floors.get(key)
                    self._floors[key] = max(floor, before) if before else floor

    def _claim(self, flow: FlowStore, level: int, share: list[fair_share.Quota], *,
               keyed: dict[str, LimitRoom], batch: Batch, turn: int,
               now: datetime | None) -> list[DueJob]:
        """Claim `share` at `level`. A kind with a per-key limit (`keyed`) has its keyed
        jobs claimed key by key, under the limit's lock (when another timer holds it, only
        its jobs without a key go this pass); its jobs without a key and its keyed ones
        take turns going first, so neither starves the other."""
        unkeyed_first = turn % 2 == 1
        first = [q for q in share if q[0] not in keyed or unkeyed_first or not keyed[q[0]].mine]
        floors = self._floors_for(level)
        got = flow.claim_pairs(level, first, now, unkeyed=keyed, floors=floors) if first else []
        batch.note_floors(level, first, got)
        for kind, queue, tenant, n in share:
            room = keyed.get(kind)
            if room is not None and not room.mine:
                batch.held = batch.next_token_seconds  # its keyed jobs wait for that timer
            elif room is not None:
                left = n - sum(1 for j in got if (j.kind, j.queue, j.tenant_key)
                               == (kind, queue, tenant))
                if left > 0:
                    got += self._claim_keyed(flow, level, (kind, queue, tenant, left),
                                             room=room, batch=batch, now=now)
        if not unkeyed_first:
            taken = Counter((job.kind, job.queue, job.tenant_key) for job in got)
            rest = [(k, q, t, n - taken[(k, q, t)]) for k, q, t, n in share
                    if k in keyed and keyed[k].mine and n > taken[(k, q, t)]]
            if rest:
                more = flow.claim_pairs(level, rest, now, unkeyed=keyed, floors=floors)
                batch.note_floors(level, rest, more)
                got += more
        return got

    def _claim_keyed(self, flow: FlowStore, level: int, quota: fair_share.Quota, *,
                     room: LimitRoom, batch: Batch, now: datetime | None) -> list[DueJob]:
        """Up to `quota` keyed jobs of its (kind, queue, tenant): the next keys from this
        timer's cursor, one job per key in turn, none past max_running jobs in flight per
        key."""
        kind, queue, tenant, n = quota
        assert room.max_running is not None  # the schema requires it of a kind_key limit
        cursor = (level, kind, queue, tenant)
        walk = max(KEY_WALK_MIN, 4 * n)
        with self._lock:
            after = self._key_cursors.get(cursor, "")
        pair = (kind, queue, tenant)
        keys = flow.key_rooms(level, pair, after=after, walk=walk, now=now)
        if after and len(keys) < walk:  # past the last key: round again from the first
            keys += [k for k in flow.key_rooms(level, pair, after="", walk=walk, now=now)
                     if k[0] <= after]
        rooms = [(key, room.max_running - (in_flight or 0)) for key, due, in_flight in keys
                 if due]
        if any(left <= 0 for _, left in rooms):
            batch.held = batch.next_token_seconds  # a key's slot frees when its job ends
        quotas = fair_share.per_key(rooms, n)
        with self._lock:
            if sum(q[1] for q in quotas) >= n:  # the next pass goes on after the last served
                self._key_cursors[cursor] = quotas[-1][0]
            else:
                self._key_cursors.pop(cursor, None)
        return flow.claim_keys(level, pair, quotas, now) if quotas else []

    def _send(self, due: list[DueJob]) -> dict[int, str]:
        """Send every job; returns {job id: error} for the ones SQS did not take."""
        by_queue: dict[str, list[Outgoing]] = defaultdict(list)
        for job in due:
            by_queue[job.queue].append(Outgoing(
                str(job.id), JobMessage(job.id, job.token, job.kind, job.tenant_key,
                                        job.priority).encode(), job.tenant_key))
        calls = [
            (queue, entries[i:i + MAX_BATCH])
            for queue, entries in by_queue.items()
            for i in range(0, len(entries), MAX_BATCH)
        ]
        futures = [(q, chunk, self._executor.submit(self.transport.send_batch, q, chunk))
                   for q, chunk in calls]
        failed: dict[int, str] = {}
        for queue, chunk, future in futures:
            try:
                refused: list[EntryFailure] = future.result()
            except TransportError as exc:
                metrics.SQS_ERRORS.labels("SendMessageBatch").inc()
                refused = [EntryFailure(entry_id, type(exc).__name__, str(exc))
                           for entry_id, *_ in chunk]
            for failure in refused:
                failed[int(failure.entry_id)] = f"SQS refused the send: {failure.code}: " \
                                                f"{failure.message}"
            metrics.DISPATCHED.labels(queue).inc(len(chunk) - len(refused))
            if refused:
                metrics.DISPATCH_FAILURES.labels(queue).inc(len(refused))
                self._report_refused(queue, len(refused), refused[0])
        return failed

    def _report_refused(self, queue: str, count: int, example: EntryFailure) -> None:
        """One line per queue every REPORT_EVERY_SECONDS, however many passes fail."""
        self._refusals[queue] = self._refusals.get(queue, 0) + count
        now = time.monotonic()
        if now - self._reported.get(queue, -REPORT_EVERY_SECONDS) < REPORT_EVERY_SECONDS:
            return
        self._reported[queue] = now
        emit(log, "dispatch_refused", logging.WARNING, queue=queue,
             jobs=self._refusals.pop(queue), error=f"{example.code}: {example.message}",
             detail="the jobs stay due and are tried again with a backoff")

    def _report_stuck(self, due: list[DueJob], streaks: dict[int, int],
                      failed: dict[int, str]) -> None:
        """One line per queue every REPORT_EVERY_SECONDS for the jobs refused
        STUCK_AFTER_FAILURES times in a row, with how many more reached it since the last
        line (not one line per job, nor per pass: under an SQS outage, jobs falling due
        one by one each reach the streak in a pass of their own)."""
        stuck: dict[str, list[DueJob]] = defaultdict(list)
        for job in due:
            if streaks.get(job.id) == STUCK_AFTER_FAILURES:
                stuck[job.queue].append(job)
        now = self.monotonic()
        for queue, jobs in stuck.items():
            with self._lock:
                self._stuck_since[queue] = self._stuck_since.get(queue, 0) + len(jobs)
                last = self._stuck_logged.get(queue, -REPORT_EVERY_SECONDS)
                if now - last < REPORT_EVERY_SECONDS:
                    continue
                self._stuck_logged[queue] = now
                count = self._stuck_since.pop(queue)
            emit(log, "dispatch_stuck", logging.ERROR, queue=queue, jobs=count,
                 job_ids=[j.id for j in jobs[:20]], refused=STUCK_AFTER_FAILURES,
                 error=failed[jobs[0].id],
                 detail=f"jobs refused {STUCK_AFTER_FAILURES} times in a row since the last "
                        "such line (at most one per queue every "
                        f"{REPORT_EVERY_SECONDS:g} s); the ids are this pass's")
