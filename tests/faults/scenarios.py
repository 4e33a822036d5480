"""The fault scenarios: what each one injects, and for how long.

    kill9        kill -9 of timers and consumers at random moments (each restarted)
    pg_restart   pg_ctl restart -m immediate of Postgres (a crash, same data and port)
    pg_stop      Postgres stopped for 6 s (orderly), then started
    pg_read_only Postgres refuses writes for 6 s (a primary demoted by a failover, under
                 open connections), then takes them again
    sqs_restart  LocalStack SIGKILLed, restarted empty on the same port (queues gone)
    sqs_freeze   LocalStack stopped (SIGSTOP) for 8 s, so every SQS call hangs, and a
                 consumer killed as it begins: its jobs' leases are rescued meanwhile
    partition    consumers cut off from Postgres for 2x the lease, then healed
    poison       malformed, hostile and replayed messages sent straight to the queue

`tests.faults.runner` starts the processes, enqueues the jobs and calls a scenario's
injector with the `Context` it works with.
"""

from __future__ import annotations

import json
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tests.faults import tasks
from tests.faults.cluster import Cluster
from tests.faults.invariants import FROZEN_SQS
from tests.faults.profiles import LEASE_SECONDS, Profile
from tests.faults.proxy import TcpProxy
from tests.faults.records import FaultWindow
from tests.faults.services import Services
from tests.faults.waiting import hold_fault

PG_DOWN_SECONDS = 6.0
SQS_DOWN_SECONDS = 2.0
SQS_FROZEN_SECONDS = 8.0


@dataclass
class Context:
    """What a fault injector works with."""

    services: Services
    cluster: Cluster
    proxy: TcpProxy
    profile: Profile
    rng: random.Random
    database_url: str
    queue_url: str
    sqs: Any
    job_ids: list[int]
    faults: list[FaultWindow] = field(default_factory=list)

    @contextmanager
    def window(self, name: str, *, explains_overlap: bool) -> Iterator[None]:
        """Record the fault window around the injection."""
        start = time.time()
        self.cluster.event("fault_start", fault=name)
        try:
            yield
        finally:
            end = time.time()
            self.faults.append(FaultWindow(name, start, end, explains_overlap))
            self.cluster.event("fault_end", fault=name, seconds=round(end - start, 2))


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    inject: Callable[[Context], None]
    spread_seconds: Callable[[Profile], float]
    """Delayed jobs are due over this many seconds from enqueueing: about the time to the
    fault plus its length, so dispatch continues while it lasts."""


# --- the faults -------------------------------------------------------------------------


def kill9(ctx: Context) -> None:
    """kill -9 timers and consumers at random moments; the orchestrator restarts each."""
    p, cluster = ctx.profile, ctx.cluster
    # A consumer first and a timer second, so every run kills both kinds; then anyone.
    victims = [ctx.rng.choice(cluster.names("consumer")), ctx.rng.choice(cluster.names("timer"))]
    with ctx.window("kill -9 of timers and consumers", explains_overlap=False):
        end = time.monotonic() + p.kill_window
        while True:
            hold_fault(ctx.rng.uniform(*p.kill_gap), "the gap between two kills")
            victim = victims.pop(0) if victims else ctx.rng.choice(cluster.names())
            cluster.kill(victim)
            if time.monotonic() >= end:
                break


def pg_restart(ctx: Context) -> None:
    """pg_ctl restart -m immediate: a database crash, then crash recovery."""
    with ctx.window("pg_ctl restart -m immediate", explains_overlap=True):
        ctx.services.pg_stop("immediate")
        ctx.services.pg_start()


def pg_stop(ctx: Context) -> None:
    """Postgres stopped (orderly: clients get admin_shutdown) for 6 s, then started."""
    name = f"Postgres stopped for {PG_DOWN_SECONDS:g} s"
    with ctx.window(name, explains_overlap=True):
        ctx.services.pg_stop("fast")
        hold_fault(PG_DOWN_SECONDS, name)
        ctx.services.pg_start()


def pg_read_only(ctx: Context) -> None:
    """Postgres refuses writes for 6 s, as a primary demoted by a failover does to the
    connections still open on it (and libpq's check for a primary refuses new ones), then
    takes them again: every process must ride it out, none may crash."""
    name = f"Postgres read-only for {PG_DOWN_SECONDS:g} s"
    with psycopg.connect(ctx.services.pg.url(), autocommit=True) as admin, \
            ctx.window(name, explains_overlap=True):
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
        try:
            hold_fault(PG_DOWN_SECONDS, name)
        finally:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            admin.execute("SELECT pg_reload_conf()")


def sqs_restart(ctx: Context) -> None:
    """LocalStack SIGKILLed and restarted on the same port: every queue and message is
    gone, so the processes must recreate the queue (TOCK_CREATE_QUEUES=1)."""
    with ctx.window("LocalStack killed and restarted", explains_overlap=False):
        ctx.services.sqs_kill()
        hold_fault(SQS_DOWN_SECONDS, f"SQS down for {SQS_DOWN_SECONDS:g} s")
        ctx.services.sqs_start()


def sqs_freeze(ctx: Context) -> None:
    """LocalStack stopped (SIGSTOP) and continued: SQS neither answers nor refuses, so
    every call hangs, which a process must ride out without exiting or failing its loops.
    A consumer is killed as the freeze begins: the timers rescue its jobs' leases while
    SQS hangs (the rescue asks Postgres alone; invariant `rescue_waited_for_sqs`), and the
    jobs run once it answers again."""
    name = f"{FROZEN_SQS} for {SQS_FROZEN_SECONDS:g} s, a consumer killed"
    # A job whose message went missing, on a queue of its own no consumer reads: the
    # timers count that queue in SQS (which hangs) all through the freeze.
    with psycopg.connect(ctx.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tock_jobs (kind, queue, state, run_at, payload, "
                     "dispatched_at, dispatch_token) VALUES ('stuck', 'fault-stuck', "
                     "'dispatched', now() - interval '1 minute', '{}', "
                     "now() - interval '1 minute', gen_random_uuid())")
    with ctx.window(name, explains_overlap=False):
        ctx.services.sqs_signal(signal.SIGSTOP)
        try:
            ctx.cluster.kill(ctx.rng.choice(ctx.cluster.names("consumer")))
            hold_fault(SQS_FROZEN_SECONDS, name)
        finally:
            ctx.services.sqs_signal(signal.SIGCONT)


def partition(ctx: Context) -> None:
    """The consumers lose Postgres (open connections dropped, new ones hang) for twice the
    lease, so their leases expire and the timers give their jobs to others."""
    seconds = 2 * LEASE_SECONDS
    name = f"partition of the consumers from Postgres for {seconds:g} s (2x lease)"
    with ctx.window(name, explains_overlap=True):
        dropped = ctx.proxy.partition("hang")
        ctx.cluster.event("partition", dropped_connections=dropped)
        hold_fault(seconds, name)
        ctx.proxy.heal()
    ctx.cluster.event("healed", held_connections=ctx.proxy.stats.held)


def poison(ctx: Context) -> None:
    """Messages no timer sent, straight to the queue, in three rounds while jobs run."""
    with ctx.window("poison messages", explains_overlap=False):
        for round_ in range(3):
            for label, body in poison_bodies(ctx):
                ctx.sqs.send_message(QueueUrl=ctx.queue_url, MessageBody=body)
                ctx.cluster.event("poison", round=round_, message=label, bytes=len(body))
            if round_ < 2:
                hold_fault(0.7, "the gap between two rounds of poison messages")


def poison_bodies(ctx: Context) -> list[tuple[str, str]]:
    """(label, body): malformed, out of range, oversized, stale, unknown and replayed."""
    def msg(**fields: Any) -> str:
        base: dict[str, Any] = {"v": 1, "job": ctx.job_ids[0], "token": str(uuid.uuid4()),
                                "kind": tasks.KIND}
        base.update(fields)
        return json.dumps(base)

    with psycopg.connect(ctx.database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, state::text, dispatch_token FROM tock_jobs_all "
                            "WHERE dispatch_token IS NOT NULL ORDER BY id").fetchall()
        max_id = conn.execute("SELECT coalesce(max(id), 0) FROM tock_jobs_all").fetchone()
    real = ctx.job_ids[len(ctx.job_ids) // 2]
    big = "x" * 200_000
    bodies = [
        ("not JSON", "this is not json {"),
        ("a JSON array", "[1, 2, 3]"),
        ("a JSON string", '"job 1"'),
        ("JSON of the wrong shape", '{"v": 1}'),
        ("wrong version", msg(v=2)),
        ("job id a string", msg(job=str(real))),
        ("job id negative", msg(job=-5)),
        ("job id zero", msg(job=0)),
        ("job id true", msg(job=True)),
        ("job id a float", msg(job=1.5)),
        ("job id out of bigint range",
         json.dumps({"v": 1, "job": 100000000000000000000, "token": str(uuid.uuid4()),
                     "kind": "x"})),
        ("job id 2**63", msg(job=2**63)),
        ("job id 2**63-1 (largest bigint, no such job)", msg(job=2**63 - 1)),
        ("token not a UUID", msg(token="not-a-uuid")),
        ("token a number", msg(token=12)),
        ("kind empty", msg(kind="")),
        ("kind a list", msg(kind=["fault"])),
        ("kind with odd characters", msg(kind="fäult\u202e;DROP")),
        ("deeply nested JSON", "[" * 50_000 + "]" * 50_000),
        ("huge body (200 KB, not JSON)", big),
        ("huge body (200 KB, valid-looking JSON)", msg(pad=big)),
        ("stale token for a real job", msg(job=real)),
        ("unknown job id", msg(job=(max_id[0] if max_id else 0) + 1_000_000)),
    ]
    by_state: dict[str, tuple[int, Any]] = {}
    for job_id, state, token in rows:
        by_state.setdefault(state, (job_id, token))
    for state, label in (("succeeded", "replay of a succeeded job's message"),
                         ("running", "copy of a running job's message"),
                         ("dispatched", "copy of a dispatched job's message (SQS duplicate)")):
        if state in by_state:
            job_id, token = by_state[state]
            bodies.append((label, msg(job=job_id, token=str(token))))
    return bodies


SCENARIOS = {
    s.name: s for s in [
        Scenario("kill9", "kill -9 of timers and consumers at random moments", kill9,
                 lambda p: p.kill_window),
        Scenario("pg_restart", "Postgres crash: pg_ctl restart -m immediate", pg_restart,
                 lambda p: 3.0),
        Scenario("pg_stop", f"Postgres stopped for {PG_DOWN_SECONDS:g} s", pg_stop,
                 lambda p: PG_DOWN_SECONDS + 2.0),
        Scenario("pg_read_only",
                 f"Postgres read-only for {PG_DOWN_SECONDS:g} s (a demoted primary)",
                 pg_read_only, lambda p: PG_DOWN_SECONDS + 2.0),
        Scenario("sqs_restart", "LocalStack SIGKILLed, restarted empty on the same port",
                 sqs_restart, lambda p: SQS_DOWN_SECONDS + 3.0),
        Scenario("sqs_freeze", f"LocalStack frozen (SIGSTOP) for {SQS_FROZEN_SECONDS:g} s, "
                 "a consumer killed as it begins", sqs_freeze,
                 lambda p: SQS_FROZEN_SECONDS + 3.0),
        Scenario("partition",
                 f"consumers partitioned from Postgres for {2 * LEASE_SECONDS:g} s (2x lease)",
                 partition, lambda p: 2 * LEASE_SECONDS + 2.0),
        Scenario("poison", "poison messages sent straight to the queue", poison,
                 lambda p: 4.0),
    ]
}
