"""Running one fault scenario: start 2 timers and 3 consumers (consumers reach Postgres
through the partition proxy, timers directly), enqueue the profile's jobs (half due now,
half spread over the next seconds so dispatch goes on during the fault), wait until
handlers are running, inject the scenario's fault, end it, wait until every job is
finished, then let the invariant checker compare the database with the run log."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from shared.client import Client
from shared.runtime.settings import ClientSettings
from shared.transport.sqs import SqsTransport
from tests.faults import tasks
from tests.faults.cluster import Cluster, base_env
from tests.faults.invariants import check
from tests.faults.profiles import (
    CONSUMERS,
    DEAD_LETTER_AFTER,
    PROCESS_SETTINGS,
    TIMERS,
    VISIBILITY_TIMEOUT,
    Profile,
)
from tests.faults.proxy import TcpProxy
from tests.faults.records import read_runs
from tests.faults.result import Result
from tests.faults.scenarios import Context, Scenario
from tests.faults.services import Services
from tests.faults.waiting import wait_until

QUIET_TIMEOUT_SECONDS = 10.0


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
        row = conn.execute("SELECT extract(epoch FROM max(run_at))::float8 FROM tock_jobs_all "
                           "WHERE id = ANY(%s)", ([j.id for j in jobs],)).fetchone()
    return [j.id for j in jobs], float(row[0]) if row and row[0] else time.time()


def _started_runs(run_log: Path) -> int:
    if not run_log.exists():
        return 0
    return run_log.read_text(errors="replace").count('"event":"start"')


def _finished(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute("SELECT count(*) FROM tock_jobs_all "
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
    for TOCK_DISPATCH_TIMEOUT_SECONDS, which is 5 s here and 60 s by default."""
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
            f"their recovery waited TOCK_DISPATCH_TIMEOUT_SECONDS={timeout} (60 by default)"]
