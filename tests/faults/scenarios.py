"""The fault scenarios and the profiles that size them.

Each scenario starts 2 timers and 3 consumers (consumers reach Postgres through the
partition proxy, timers directly), enqueues the profile's jobs (half due now, half spread
over the next seconds so dispatch goes on during the fault), waits until handlers are
running, injects its fault, ends it, waits until every job is finished, then lets the
invariant checker compare the database with the run log.

    kill9        kill -9 of timers and consumers at random moments (each restarted)
    pg_restart   pg_ctl restart -m immediate of Postgres (a crash, same data and port)
    pg_stop      Postgres stopped for 6 s (orderly), then started
    sqs_restart  LocalStack SIGKILLed, restarted empty on the same port (queues gone)
    partition    consumers cut off from Postgres for 2x the lease, then healed
    poison       malformed, hostile and replayed messages sent straight to the queue
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from shared.client import Client
from shared.runtime.settings import ClientSettings
from shared.transport.sqs import SqsTransport
from tests.faults import tasks
from tests.faults.cluster import Cluster, base_env
from tests.faults.invariants import FaultWindow, Result, check, read_runs
from tests.faults.proxy import TcpProxy
from tests.faults.services import Services
from tests.faults.waiting import hold_fault, wait_until

LEASE_SECONDS = 3.0
PROCESS_SETTINGS = {
    "LEASE_SECONDS": f"{LEASE_SECONDS:g}",
    "HEARTBEAT_SECONDS": "1",
    "VISIBILITY_TIMEOUT_SECONDS": "5",
    "RECEIVE_WAIT_SECONDS": "1",
    "BACKOFF_BASE_SECONDS": "0.2",
    "BACKOFF_CAP_SECONDS": "1",
    "SHUTDOWN_GRACE_SECONDS": "2",
    "DISPATCH_TIMEOUT_SECONDS": "5",  # the minimum allowed
    "CREATE_QUEUES": "1",  # processes recreate a missing SQS queue
}
VISIBILITY_TIMEOUT = 5
DEAD_LETTER_AFTER = 5
TIMERS, CONSUMERS = 2, 3
PG_DOWN_SECONDS = 6.0
SQS_DOWN_SECONDS = 2.0
QUIET_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Profile:
    name: str
    jobs: int
    concurrency: int
    """Handlers per consumer process."""
    ms: tuple[int, int]
    """Handler run time, uniform in this range (milliseconds)."""
    drain_bound: float
    """Every job must be finished this long after the fault ends."""
    wait_after_fault: float
    """How long to wait for the jobs after the fault, before calling the rest lost."""
    kill_window: float
    kill_gap: tuple[float, float]


PROFILES = {
    "small": Profile("small", jobs=60, concurrency=8, ms=(100, 1200), drain_bound=15.0,
                     wait_after_fault=30.0, kill_window=6.0, kill_gap=(0.4, 1.2)),
    "full": Profile("full", jobs=1000, concurrency=16, ms=(20, 300), drain_bound=15.0,
                    wait_after_fault=90.0, kill_window=10.0, kill_gap=(0.3, 1.0)),
}


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


def sqs_restart(ctx: Context) -> None:
    """LocalStack SIGKILLed and restarted on the same port: every queue and message is
    gone, so the processes must recreate the queue (TOCK_CREATE_QUEUES=1)."""
    with ctx.window("LocalStack killed and restarted", explains_overlap=False):
        ctx.services.sqs_kill()
        hold_fault(SQS_DOWN_SECONDS, f"SQS down for {SQS_DOWN_SECONDS:g} s")
        ctx.services.sqs_start()


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
        rows = conn.execute("SELECT id, state::text, dispatch_token FROM tock_jobs "
                            "WHERE dispatch_token IS NOT NULL ORDER BY id").fetchall()
        max_id = conn.execute("SELECT coalesce(max(id), 0) FROM tock_jobs").fetchone()
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
        Scenario("sqs_restart", "LocalStack SIGKILLed, restarted empty on the same port",
                 sqs_restart, lambda p: SQS_DOWN_SECONDS + 3.0),
        Scenario("partition",
                 f"consumers partitioned from Postgres for {2 * LEASE_SECONDS:g} s (2x lease)",
                 partition, lambda p: 2 * LEASE_SECONDS + 2.0),
        Scenario("poison", "poison messages sent straight to the queue", poison,
                 lambda p: 4.0),
    ]
}


# --- running one ------------------------------------------------------------------------


class HarnessError(RuntimeError):
    """The suite itself could not do its part (not a finding about tock)."""


def run_scenario(services: Services, scenario: Scenario, profile: Profile, work_dir: Path,
                 seed: int | None = None) -> Result:
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    log_dir = work_dir / scenario.name
    cluster = Cluster(log_dir)
    cluster.event("scenario", name=scenario.name, profile=profile.name, seed=seed)
    services.ensure_up()
    database_url = services.create_database(f"faults_{scenario.name}_{uuid.uuid4().hex[:6]}")
    prefix = f"f{uuid.uuid4().hex[:8]}-"
    sqs = services.sqs_client()
    queue_url = SqsTransport(prefix, client=sqs).create_queue(
        "default", visibility_timeout=VISIBILITY_TIMEOUT, dead_letter_after=DEAD_LETTER_AFTER)
    proxy = TcpProxy(services.pg.port).start()
    run_log = log_dir / "runs.jsonl"
    common = base_env({
        **services.sqs_env(),
        "TOCK_QUEUE_PREFIX": prefix,
        "TOCK_LOG_FORMAT": "json",
        "TOCK_LOG_LEVEL": "INFO",
        tasks.LOG_ENV: str(run_log),
        **{f"TOCK_{k}": v for k, v in PROCESS_SETTINGS.items()},
    })
    proxied_url = database_url.replace(f":{services.pg.port}/", f":{proxy.port}/")
    notes: list[str] = [f"seed {seed}"]
    ctx: Context | None = None
    try:
        for n in range(TIMERS):
            cluster.add(f"timer-{n}", "timer", ["-m", "timer_service"],
                        {**common, "TOCK_DATABASE_URL": database_url})
        for n in range(CONSUMERS):
            cluster.add(f"consumer-{n}", "consumer",
                        ["-m", "consumer", "--tasks", "tests.faults.tasks",
                         "--concurrency", str(profile.concurrency)],
                        {**common, "TOCK_DATABASE_URL": proxied_url})
        try:
            wait_until(cluster.all_started, 60, f"{TIMERS} timers and {CONSUMERS} consumers "
                       "to start")
        except TimeoutError as exc:
            raise HarnessError(f"processes did not start: {exc}") from exc
        job_ids, last_due = _enqueue(database_url, profile, rng,
                                     scenario.spread_seconds(profile))
        cluster.event("enqueued", jobs=len(job_ids), last_due=round(last_due, 3))
        ctx = Context(services, cluster, proxy, profile, rng, database_url, queue_url, sqs,
                      job_ids)
        first = min(10, max(len(job_ids) // 5, 1))
        try:
            wait_until(lambda: _started_runs(run_log) >= first, 30,
                       f"the first {first} handler runs")
        except TimeoutError as exc:
            raise HarnessError(f"no jobs ran before the fault: {exc}") from exc
        scenario.inject(ctx)
        fault_end = max(f.end for f in ctx.faults)
        drain_from = max(fault_end, last_due)
        if last_due > fault_end:
            notes.append(f"the last job was due {last_due - fault_end:.1f} s after the fault "
                         "ended: drain is measured from then")
        try:
            wait_until(lambda: _finished(database_url) >= len(job_ids),
                       max(drain_from + profile.wait_after_fault - time.time(), 1),
                       "every job to finish", interval=0.2, tolerate=(psycopg.Error,))
        except TimeoutError:
            notes.append(f"not every job finished within {profile.wait_after_fault:.0f} s "
                         "of the fault's end")
        else:
            try:
                wait_until(lambda: _quiet(sqs, queue_url, run_log, cluster),
                           QUIET_TIMEOUT_SECONDS, "the queue to empty and every run to end",
                           interval=0.2, tolerate=(Exception,))
            except TimeoutError as exc:
                notes.append(f"after the drain: {exc}")
        notes += _dead_letters(sqs, prefix)
    except BaseException:
        cluster.stop()
        proxy.close()
        print(cluster.log_report())
        raise
    cluster.stop()
    proxy.close()
    assert ctx is not None
    cluster.event("check")
    result = check(scenario=scenario.name, database_url=database_url, job_ids=job_ids,
                   run_log=run_log, faults=ctx.faults, processes=cluster.records,
                   drain_from=drain_from, drain_bound=profile.drain_bound, log_dir=log_dir)
    result.notes = notes + result.notes + _redispatch_notes(cluster, ctx.faults[0].start)
    result.logs = cluster.log_report()
    if proxy.stats.dropped or proxy.stats.held:
        result.notes.append(f"proxy: {proxy.stats.dropped} connections dropped, "
                            f"{proxy.stats.held} held during the partition")
    return result


def _enqueue(database_url: str, profile: Profile, rng: random.Random,
             spread: float) -> tuple[list[int], float]:
    """Half the jobs due now, half spread over `spread` seconds; returns the ids and the
    wall time at which the last one is due."""
    specs = []
    for i in range(profile.jobs):
        delay = 0.0 if i % 2 == 0 else rng.uniform(0.05, spread)
        specs.append({"kind": tasks.KIND, "payload": {"ms": rng.randint(*profile.ms), "n": i},
                      "delay": delay})
    with Client(ClientSettings(database_url=database_url)) as client:
        jobs = client.schedule_many(specs)
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM max(run_at))::float8 FROM tock_jobs "
                           "WHERE id = ANY(%s)", ([j.id for j in jobs],)).fetchone()
    return [j.id for j in jobs], float(row[0]) if row and row[0] else time.time()


def _started_runs(run_log: Path) -> int:
    if not run_log.exists():
        return 0
    return run_log.read_text(errors="replace").count('"event":"start"')


def _finished(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute("SELECT count(*) FROM tock_jobs "
                           "WHERE state IN ('succeeded', 'dead', 'cancelled')").fetchone()
    return int(row[0]) if row else 0


def _quiet(sqs: Any, queue_url: str, run_log: Path, cluster: Cluster) -> bool:
    """No message left in the queue (visible or in flight) and no handler run still going
    in a live process: nothing left that could start a late duplicate."""
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages",
                                            "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    if any(int(v) for v in attrs.values()):
        return False
    runs, _ = read_runs(run_log)
    by_pid = cluster.by_pid()
    return not any(r.end is None and by_pid.get(r.pid) is not None
                   and by_pid[r.pid].ended is None for r in runs)


def _dead_letters(sqs: Any, prefix: str) -> list[str]:
    try:
        url = sqs.get_queue_url(QueueName=f"{prefix}default-dlq")["QueueUrl"]
        attrs = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    except Exception as exc:  # the DLQ is gone after an SQS restart
        return [f"dead-letter queue not readable ({type(exc).__name__})"]
    count = int(attrs.get("ApproximateNumberOfMessages", 0))
    return [f"{count} messages ended in the dead-letter queue (received "
            f"{DEAD_LETTER_AFTER} times without being deleted)"] if count else []


def _redispatch_notes(cluster: Cluster, since: float) -> list[str]:
    """Jobs the timers sent again because nobody claimed them within the dispatch timeout
    (events `redispatch_*` in the timer logs, after the fault began): their recovery waited
    for TOCK_DISPATCH_TIMEOUT_SECONDS, which is 5 s here and 300 s by default."""
    jobs = 0
    events: Counter[str] = Counter()
    for record in cluster.records:
        if record.role != "timer" or not record.log.exists():
            continue
        for line in record.log.read_text(errors="replace").splitlines():
            if '"event": "redispatch' not in line:
                continue
            try:
                entry = json.loads(line)
                at = datetime.fromisoformat(entry["ts"]).timestamp()
            except (ValueError, KeyError):
                continue
            if at >= since:
                jobs += int(entry.get("jobs", 0) or 0)
                events[entry["event"]] += 1
    if not jobs:
        return []
    timeout = PROCESS_SETTINGS["DISPATCH_TIMEOUT_SECONDS"]
    return [f"{jobs} jobs were re-dispatched after the dispatch timeout ({dict(events)}): "
            f"their recovery waited TOCK_DISPATCH_TIMEOUT_SECONDS={timeout} (300 by default)"]
