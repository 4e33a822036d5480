"""A consumer process: its loops, their threads, and its lifecycle.

    claim-<queue> (2 threads per queue) ─► execute (concurrency threads) ─► complete ─► delete
                                             ├─ async (one event loop thread; thread isolation)
                                             └─ handler processes (process isolation: the
                                                consumer's, or that of some kinds)
    heartbeat (database leases, deadlines)      visibility (SQS message visibility)

The database lease is the authority. Messages are deleted only after the outcome is
committed, so a crash at any point leaves the job recoverable. Every loop runs under one
`Supervisor`: a crash of any of them stops the process with a non-zero exit code.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence

from consumer import outcomes
from consumer.claimer import Claimer
from consumer.completer import Completer
from consumer.deleter import Deleter
from consumer.executor import Executor
from consumer.inflight import InFlight
from consumer.lease import LeaseKeeper, VisibilityKeeper
from consumer.pipeline import Clock, Pipeline
from consumer.tasks import Registry
from shared.core.errors import Retryable
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import emit
from shared.runtime.settings import ConsumerSettings
from shared.runtime.supervisor import Supervisor
from shared.store.database import Database
from shared.store.job_store import JobStore
from shared.transport.base import Transport
from shared.transport.sqs import SqsTransport

log = logging.getLogger("tock.consumer")

SETTLE_SECONDS = 10.0
"""After the grace period: how long shutdown waits for outcomes to be written."""
LAST_WRITES_SECONDS = 8.0
"""After the grace period: the longest shutdown waits for its last writes (the release,
the outcomes left, the worker row) in all; they take milliseconds unless Postgres hangs.
A database that does not answer (frozen, partitioned: no error comes) is not waited for:
the jobs' leases expire and the timer recovers them, as if the process had been killed.
Grace plus this stays under tock's stop timeouts (ECS: the CloudFormation Rules ask for
the ten after the next above the grace, 40 s for the default 20; Kubernetes: 40 s;
Compose: 40 s), so an orchestrator's SIGKILL does not cut the release short."""
CLAIM_PLANNER = ("enable_nestloop=off", "enable_seqscan=off",
                 "plan_cache_mode=force_generic_plan")
"""How the claim pool's sessions plan. The claim joins a batch's messages (an unnest of
arrays) to their rows by hash: the planner, which cannot know how many messages come,
picked a nested loop that unnests the arrays again for every row, quadratic in the batch
(measured: 6.7 ms against 1.8 for 100 messages, a fifth more at 32). Its rows are found
through the primary key whatever the statistics say: a plan made on a table still small
(a seq scan) would otherwise be kept, generic, as it grows. And it is planned once per
connection: for batches of about eight the planner chose to plan every call afresh (up to
35 us of Postgres per job). The pool runs only the claim and its lock wait."""
WORKER_ID_POLL_SECONDS = 1.0
"""While another process holds this worker's id: how often to look whether it still
beats (it is alive: ConfigError) or its lease ran out (it died: the id is free)."""


class _StoppedBeforeStart(Exception):
    """SIGTERM came while the consumer waited for its worker id."""


class Consumer:
    """One consumer process's machinery. `run_forever()` in production; tests drive the
    loops' `run_once` (or the shortcuts below) step by step."""

    def __init__(self, settings: ConsumerSettings, registry: Registry,
                 transport: Transport | None = None, clock: Clock = lambda: None,
                 task_modules: Sequence[str] = ()) -> None:
        """`clock` pins the database's "now" for leases (tests); None means the database
        clock, which is what production uses: leases are judged by one clock.
        `task_modules` (--tasks) are imported by every handler process too (process
        isolation), besides the modules of the process-isolated handlers. Where each kind
        runs is read from `registry` here and at `start`: register every task first."""
        self.settings = settings
        self.registry = registry
        # Outcomes, heartbeats: durable commits. Claims: a claim lost in a database crash
        # leaves the job dispatched and its message undeleted, so it is claimed again (or
        # re-dispatched): no WAL-flush wait needed. No checkout checks: the loops retry.
        self.database = Database.for_service(settings.database_url, max_size=6,
                                             name="tock-consumer")
        self.claim_database = Database.for_service(settings.database_url, max_size=4,
                                                   name="tock-claim", synchronous_commit=False,
                                                   planner=CLAIM_PLANNER)
        self.pipe = Pipeline(
            settings=settings, registry=registry,
            transport=transport or SqsTransport(
                settings.queue_prefix, call_timeout_seconds=settings.sqs_call_timeout_seconds,
                max_connections=max(20, settings.concurrency + 10),
                create_missing=settings.create_queues,
                visibility_timeout=settings.visibility_timeout_seconds,
                dead_letter_after=settings.dead_letter_after),
            store=JobStore(self.database), claim_store=JobStore(self.claim_database),
            clock=clock)
        self.worker_id = self.pipe.worker_id
        self.claimers = {q: Claimer(self.pipe, q) for q in settings.queues}
        self.executor = Executor(self.pipe, task_modules)
        self.async_runner = self.executor.async_runner
        if self.async_runner is not None:
            self.pipe.async_blocked_for = self.async_runner.blocked_for
        self.completer = Completer(self.pipe)
        self.deleter = Deleter(self.pipe)
        self.lease_keeper = LeaseKeeper(self.pipe)
        self.visibility = VisibilityKeeper(self.pipe)
        self.stop_flag = StopFlag()
        self.cut_short = False
        """Shutdown stopped without its last writes (LAST_WRITES_SECONDS): the process
        should exit at once, not wait for threads blocked on the database."""
        self.supervisor = Supervisor("consumer", self.stop_flag)
        self.supervisor.watch(self.lease_keeper, self.visibility, self.completer,
                              self.deleter)
        if self.async_runner is not None:
            self.supervisor.watch(self.async_runner)
        self.supervisor.watch(self.executor, *self.claimers.values())

    # --- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        self.database.open()
        self.claim_database.open()

    def close(self) -> None:
        """Stop the event loop and the handler processes, close the database pools (after
        `shutdown`, or when driven step by step)."""
        self.executor.close()
        self.deleter.close()
        self.database.close()
        self.claim_database.close()

    def start(self) -> None:
        """Start the handler processes (if any kind runs in one), announce this worker,
        start every loop; returns at once. `ConfigError` if a handler process cannot start
        or the kill grace does not fit the lease."""
        self.executor.prepare()
        self.open()
        try:
            self._take_worker_id()
            self.lease_keeper.mark_ok()  # the announcement was a heartbeat
            # The receivers are not marked: each is ready once a receive from its queue has
            # gone through (its first pass, within the long poll), not while SQS is away.
        except Retryable as exc:
            # The database went away since the start-up probe: the heartbeat loop takes the
            # id once it is back, and nothing is claimed until then (the readiness probe
            # says so).
            self.pipe.worker_id_pending = True
            emit(log, "announce_failed", logging.WARNING, worker=self.worker_id,
                 error=str(exc), detail="retried by the heartbeat loop")
        self.pipe.deleting = True  # the deleter loop takes the committed outcomes' messages
        self.supervisor.start()
        emit(log, "consumer_started", worker=self.worker_id, queues=self.settings.queues,
             concurrency=self.settings.concurrency, isolation=self.settings.isolation,
             tasks=self.registry.kinds(),
             process_kinds=[t.kind for t in
                            self.registry.process_isolated(self.settings.isolation)])

    def _take_worker_id(self) -> None:
        """Announce this worker under its id. While another process holds the id (a fixed
        TOCK_WORKER_ID), wait for that one's lease to run out, as a crashed predecessor's
        does; `ConfigError` as soon as its heartbeat moves (consumer/worker_id.py)."""
        while (holder := self.lease_keeper.worker_id.attempt()) is not None:
            if self.stop_flag.wait(min(max(holder.expires_in, 0.05), WORKER_ID_POLL_SECONDS)):
                raise _StoppedBeforeStart

    def run_forever(self) -> int:
        """Run until SIGTERM/SIGINT (graceful shutdown, exit 0) or a loop crash (exit 70)."""
        try:
            self.start()
        except _StoppedBeforeStart:  # SIGTERM while waiting for the worker id: nothing ran
            self.executor.stop()
            self.close()
            return 0
        while not self.stop_flag.wait(1.0):
            self.supervisor.report_stalls()
        self.shutdown()
        return self.supervisor.exit_code

    def shutdown(self) -> None:
        """Stop receiving; let in-flight jobs finish within the grace period; release the
        rest (fenced) so they run elsewhere at once; write what is left; stop."""
        pipe = self.pipe
        emit(log, "consumer_stopping", worker=self.worker_id, in_flight=len(pipe.tracker),
             grace_seconds=self.settings.shutdown_grace_seconds)
        self.stop_flag.set()
        # The grace runs from SIGTERM: a receive that hangs (SQS away: up to three call
        # timeouts) is not waited for past it, or the platform's SIGKILL (ECS StopTimeout,
        # terminationGracePeriodSeconds) would come before the release. A receive that
        # returns after this claims nothing (Claimer._pass).
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        for claimer in self.claimers.values():
            claimer.stop()
        # Their prefetched messages go back to SQS at once, for the other consumers; on a
        # thread of its own, so an SQS that hangs does not eat into the grace. A receive
        # still under way hands back what it gets (Claimer._pass).
        threading.Thread(target=self._hand_back, args=(deadline,), daemon=True,
                         name="tock-hand-back").start()
        for claimer in self.claimers.values():
            claimer.join(max(deadline - time.monotonic(), 0.0))
        idle = pipe.slots.wait_idle(max(deadline - time.monotonic(), 0.0))
        failed: list[BaseException] = []

        def last_writes() -> None:
            try:
                self._last_writes(idle)
            except BaseException as exc:  # raised below, on the caller's thread
                failed.append(exc)

        last = threading.Thread(target=last_writes, daemon=True, name="tock-shutdown")
        last.start()
        last.join(LAST_WRITES_SECONDS)
        if failed:
            # What shutdown did not expect fails it as before the bound (exit non-zero,
            # with its traceback), not a thread dying unnoticed.
            raise failed[0]
        if last.is_alive():
            self.cut_short = True
            emit(log, "shutdown_cut_short", logging.ERROR, worker=self.worker_id,
                 in_flight=len(pipe.tracker),
                 detail=f"the last writes did not end within {LAST_WRITES_SECONDS:g} s "
                        "(the database or SQS does not answer); stopping without them: "
                        "the jobs still held here are recovered by the timer once their "
                        "leases expire, as after a kill")
        emit(log, "consumer_stopped", worker=self.worker_id,
             exit_code=self.supervisor.exit_code, cut_short=self.cut_short)

    def _hand_back(self, deadline: float) -> None:
        """Hand back the prefetched messages now, and again once the receivers have ended
        (a pass that had just checked for the stop may have prefetched more)."""
        for claimer in self.claimers.values():
            claimer.hand_back()
        for claimer in self.claimers.values():
            claimer.join(max(deadline - time.monotonic(), 0.0))
            claimer.hand_back()

    def _last_writes(self, idle: bool) -> None:
        """Release what still runs (unless every slot is idle), write the outcomes left,
        mark the worker stopped, close. Each step waits on Postgres or SQS."""
        pipe = self.pipe
        if not idle:
            self._release_unfinished()
        pipe.tracker.wait_settled(SETTLE_SECONDS)
        self.executor.stop()
        self.executor.close()  # late results of released jobs are drained below, unwritten
        self.completer.stop()
        self.completer.join(SETTLE_SECONDS)
        self._drain()
        self.lease_keeper.stop()
        self.visibility.stop()
        self.lease_keeper.join(SETTLE_SECONDS)
        with contextlib.suppress(Retryable):  # else the row goes stale; the dashboard says so
            pipe.store.stop_worker(self.worker_id, pipe.clock())
        # Last, the messages of the outcomes written: an SQS that hangs holds up nothing
        # above, and what is left undeleted comes back to claim nothing.
        self.deleter.stop()
        self.deleter.join(SETTLE_SECONDS)
        self.deleter.drain()
        self.close()

    def _drain(self) -> None:
        """Write outcomes still queued (the completer thread has stopped)."""
        for _ in range(50):
            try:
                if not self.completer.run_once(wait_seconds=0):
                    return
            except Retryable as exc:
                emit(log, "complete_failed", logging.ERROR, error=str(exc))
                time.sleep(0.2)

    def _release_unfinished(self) -> None:
        # A job whose handler has returned is not released: its outcome is queued or about
        # to be (attempt.finish), and is written below. Releasing it would discard the
        # result and run the job again.
        release = [i for i in self.pipe.tracker.heartbeating() if not i.handler_done]
        for item in release:
            item.released = True  # before the signal: the handler may return at once
            item.abandoned = True
            item.stop("released at shutdown")
        if release:
            # Their handlers may run on until this process exits, while the released jobs
            # are due again at once: they keep their concurrency slots until this worker
            # stops (STOP_WORKER), written before the release is.
            with contextlib.suppress(Retryable):
                self.pipe.store.record_lingering(
                    self.worker_id, [(i.lease, "released") for i in release
                                     if not i.handler_done])
            emit(log, "jobs_released", logging.WARNING, jobs=len(release),
                 job_ids=[i.job_id for i in release], worker=self.worker_id)
            for item in release:
                self.pipe.done.put(outcomes.released(item))

    # --- step by step (tests, benchmarks) --------------------------------------------------

    def receive_once(self, queue: str, wait_seconds: int | None = None) -> int:
        """One receive + claim from `queue`; the claimed jobs wait in `pipe.work`."""
        return self.claimers[queue].run_once(wait_seconds=wait_seconds)

    def complete_pending(self) -> int:
        """Write the outcomes waiting (one batch), then delete their messages."""
        return self.completer.run_once(wait_seconds=0)

    def heartbeat_once(self) -> tuple[int, int]:
        """One database heartbeat, then one visibility extension; returns (kept, lost)."""
        kept_lost = self.lease_keeper.beat()
        self.visibility.extend()
        return kept_lost

    def check_timeouts(self) -> None:
        self.lease_keeper.check_timeouts()

    def in_flight(self) -> list[InFlight]:
        return self.pipe.tracker.items()
