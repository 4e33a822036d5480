"""Where the time goes: cProfile in every thread of an in-process timer + consumer run over
the in-memory transport, and the database time per tock statement (pg_stat_statements)."""

from __future__ import annotations

import cProfile
import io
import pstats
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.pipeline import Context, insert_due, run_in_memory, statement_times
from shared.store import flow_sql, jobs_sql

# pg_stat_statements shows bound parameters and constants alike as $n: fold both sides
# (placeholders, quoted literals, numbers) to `$` and drop comments before comparing.
_PLACEHOLDER = re.compile(r"%\(\w+\)s|\$\d+|'[^']*'|-?\b\d+(\.\d+)?\b")
_COMMENT = re.compile(r"--[^\n]*")
_SPACE = re.compile(r"\s+")

# Entry points whose cumulative time, per job, says which step costs what.
STEPS = {
    "dispatcher.py:dispatch_due": "timer: claim due + send + commit (one batch)",
    "dispatcher.py:_send": "timer: SendMessageBatch calls (waiting on sends)",
    "claimer.py:run_once": "consumer: receive + claim (one pass, slot wait included)",
    "claimer.py:_claim_rows": "consumer: claim statement",
    "claimer.py:_start": "consumer: per claimed job (context, tracking, metric)",
    "claimer.py:_explain_unclaimed": "consumer: explain unclaimed messages",
    "executor.py:run": "consumer: handler (no-op) and its outcome",
    "completer.py:finish": "consumer: outcome write + delete (one group)",
    "completer.py:_write": "consumer: FINISH_ATTEMPTS statement",
    "completer.py:_report": "consumer: per written outcome (metrics, log line)",
    "pipeline.py:delete": "consumer: DeleteMessageBatch",
    "logs.py:emit": "structured logging (emit)",
    "rescuer.py:rescue_expired": "timer: lease rescue query",
    "lost_messages.py:redispatch_stuck": "timer: stuck re-dispatch query",
    "dispatcher.py:seconds_until_next_due": "timer: next-due query",
}

# Waiting for work to arrive is not cost: leave these out of the self-time table.
_IDLE = ("acquire' of '_thread.lock", "queue.py", "threading.py", "time.sleep",
         "SimpleQueue", "select.epoll")


def _normal(text: str) -> str:
    text = _PLACEHOLDER.sub("$", _COMMENT.sub("", text)).replace("extract(epoch", "extract($")
    return _SPACE.sub(" ", text).strip()


_NAMES = {_normal(v): k for module in (jobs_sql, flow_sql) for k, v in vars(module).items()
          if k.isupper() and isinstance(v, str) and len(v) > 40}


def statement_name(query: str) -> str:
    """The `jobs_sql`/`flow_sql` name of a statement pg_stat_statements reports, else its
    start."""
    normal = _normal(query)
    if normal in _NAMES:
        return f"sql.{_NAMES[normal]}"
    # pg_stat_statements folds a few more tokens than we do: accept a long common prefix.
    best, name = max((_common_prefix(normal, text), name) for text, name in _NAMES.items())
    if best >= 120:
        return f"sql.{name}"
    return normal[:90]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@contextmanager
def profile_all_threads() -> Iterator[list[cProfile.Profile]]:
    """Profile every thread started inside the block (and this one)."""
    profiles: list[cProfile.Profile] = []
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    main = cProfile.Profile()
    profiles.append(main)
    threading.Thread.run = run  # type: ignore[method-assign]
    main.enable()
    try:
        yield profiles
    finally:
        main.disable()
        threading.Thread.run = original  # type: ignore[method-assign]


ENQUEUE_STEPS = {
    "client.py:schedule_many": "schedule() as a whole",
    "client.py:_columns": "argument validation",
    "pool.py:_check_connection": "pool check on checkout (an empty query: one round trip)",
    "transaction.py:__enter__": "BEGIN (one round trip)",
    "cursor.py:execute": "INSERT ... RETURNING (one round trip, trigger included)",
    "transaction.py:__exit__": "COMMIT (one round trip + WAL flush)",
    "jobs.py:from_row": "Job.from_row",
}


def measure_enqueue(ctx: Context) -> None:
    """cProfile `schedule()` one by one: where a single enqueue spends its time."""
    from shared.client import Client
    from shared.runtime.settings import ClientSettings

    calls = max(ctx.profile.hotspot_jobs // 10, 20)
    url = ctx.services.fresh_database("bench_enqueue_profile")
    with Client(ClientSettings(database_url=url)) as client:
        client.schedule("bench.noop", {"warm": True}, delay=3600)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(calls):
            client.schedule("bench.noop", {"n": i}, delay=3600)
        prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    steps = []
    for _filename, short, (_line, value) in _entries(stats):
        if short in ENQUEUE_STEPS:
            steps.append({"step": ENQUEUE_STEPS[short], "function": short, "calls": value[1],
                          "ms_per_job": round(value[3] * 1000 / calls, 4)})
    ctx.results.hotspots["enqueue_calls"] = calls
    ctx.results.hotspots["enqueue_steps_ms_per_call"] = sorted(
        steps, key=lambda s: -s["ms_per_job"])


TX_UPDATE = """
UPDATE tock_jobs SET updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'scheduled'
"""


def measure_transactions(ctx: Context, rounds: int = 300) -> None:
    """The same 10-row UPDATE through tock's `Database.transaction()` (pool check on
    checkout, BEGIN, statement, COMMIT) and as one autocommit statement: what the
    transaction wrapper costs per transaction on this server, in this run."""
    import time

    import psycopg

    from shared.store.database import Database

    url = ctx.services.fresh_database("bench_transactions")
    insert_due(url, 10 * rounds)
    ids = [list(range(1 + 10 * i, 11 + 10 * i)) for i in range(rounds)]
    database = Database(url, max_size=2, name="bench-tx", autocommit=False)
    try:
        with database.transaction() as conn:
            conn.execute("SELECT 1")
        start = time.perf_counter()
        for chunk in ids:
            with database.transaction() as conn:
                conn.execute(TX_UPDATE, {"ids": chunk})
        wrapped = (time.perf_counter() - start) / rounds * 1000
    finally:
        database.close()
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for chunk in ids:
            conn.execute(TX_UPDATE, {"ids": chunk})
        bare = (time.perf_counter() - start) / rounds * 1000
    ctx.results.hotspots["transaction_ms"] = {"tock_transaction": wrapped,
                                              "autocommit_statement": bare}
    ctx.progress.say(f"  10-row UPDATE: {wrapped:.2f} ms in Database.transaction(), "
                     f"{bare:.2f} ms as one autocommit statement")


def measure(ctx: Context) -> None:
    n = ctx.profile.hotspot_jobs
    if n <= 0:
        return
    url = ctx.services.fresh_database("bench_hotspots")
    insert_due(url, n)
    from bench.pipeline import _reset_statements

    _reset_statements(url)
    with profile_all_threads() as profiles:
        run_in_memory(url, ctx.profile.consumer_concurrency, n, ctx.log_dir / "hotspots.log")
    stats = pstats.Stats(profiles[0], stream=io.StringIO())
    for prof in profiles[1:]:
        stats.add(prof)
    ctx.results.hotspots["memory_run_jobs"] = n
    ctx.results.hotspots["steps_ms_per_job"] = _steps(stats, n)
    ctx.results.hotspots["self_time_top"] = _self_time(stats, n)
    ctx.results.hotspots["statements_memory"] = statement_times(url, n)
    ctx.progress.say(f"  profiled {n} jobs in memory ({len(profiles)} threads)")
    measure_enqueue(ctx)
    measure_transactions(ctx)


def _entries(stats: pstats.Stats) -> Iterator[tuple[str, str, Any]]:
    for (filename, line, func), value in stats.stats.items():  # type: ignore[attr-defined]
        yield filename, f"{filename.rsplit('/', 1)[-1]}:{func}", (line, value)


def _steps(stats: pstats.Stats, jobs: int) -> list[dict[str, Any]]:
    out = []
    for _filename, short, (_line, value) in _entries(stats):
        if short in STEPS:
            _cc, ncalls, _tt, cumulative, _callers = value
            out.append({"step": STEPS[short], "function": short, "calls": ncalls,
                        "ms_per_job": round(cumulative * 1000 / jobs, 4)})
    return sorted(out, key=lambda s: -s["ms_per_job"])


def _self_time(stats: pstats.Stats, jobs: int, top: int = 20) -> list[dict[str, Any]]:
    rows = []
    for filename, short, (line, value) in _entries(stats):
        label = f"{filename}:{line}({short.split(':', 1)[1]})"
        if any(marker in label for marker in _IDLE):
            continue
        _cc, ncalls, tottime, _cum, _callers = value
        rows.append({"function": label.replace(str(ctx_root()), ""), "calls": ncalls,
                     "self_ms_per_job": round(tottime * 1000 / jobs, 4)})
    rows.sort(key=lambda r: -r["self_ms_per_job"])
    return rows[:top]


def ctx_root() -> str:
    from bench.services import ROOT

    return f"{ROOT}/"
