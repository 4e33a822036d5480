"""Fair share between tenants: tenant A has `fair_backlog` jobs overdue, tenant B then
enqueues 100 due jobs, `fair_rounds` times over: each round is one trial of the issue's
experiment. B's due-to-dispatch p99 in the median round against the median round's with no
backlog at all (and the slowest rounds' too), and A's
dispatch rate from B's arrival on against A's rate around it: the mean of the windows just
before and just after. A's rate falls as its backlog drains with or without B (README,
History and retention: a long drain claims more slowly as it goes), so the window before
alone would count that fall against B.

SQS is replaced by a sink that takes every message: this phase measures the timer's
claim, the part fair share changes; the path through SQS and the consumers is measured by
the end-to-end phases. (Fair share is decided at dispatch: once in SQS, messages go in
SQS order; README, Fair share between tenants.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

from bench import noop_tasks, waiting
from bench.pipeline import Context
from bench.stats import percentiles, rate
from shared.runtime.settings import TimerSettings
from shared.transport.base import EntryFailure, Outgoing, Received
from timer_service.service import Timer

SMALL = 100
"""Tenant B's jobs per round."""

INSERT = """
INSERT INTO tock_jobs (kind, queue, payload, tenant, run_at)
SELECT %(kind)s, 'default', '{}', %(tenant)s,
       coalesce(%(at)s::timestamptz, now() - interval '1 hour')
       + make_interval(secs => g * 0.000001)
FROM generate_series(1, %(n)s) AS g
"""

DISPATCHED = """
SELECT count(*) FROM tock_jobs WHERE tenant = %(tenant)s AND state = 'dispatched'
"""

LAGS = """
SELECT extract(epoch FROM dispatched_at - run_at)::float8 FROM tock_jobs
WHERE tenant = 'B' AND state = 'dispatched' ORDER BY id
"""

# A's rate over `window` of its dispatches just before B's arrival (`side` "before"), or
# from it on, skipping `skip` (`side` "from"): cut by rank from the timestamps Postgres
# wrote, so how long the phase took to look does not move the windows.
A_WINDOW = """
SELECT count(*), extract(epoch FROM max(t) - min(t))::float8 FROM (
    SELECT dispatched_at AS t FROM tock_jobs
    WHERE tenant = 'A' AND state = 'dispatched'
      AND CASE WHEN %(side)s = 'before' THEN dispatched_at < %(at)s
               ELSE dispatched_at >= %(at)s END
    ORDER BY CASE WHEN %(side)s = 'before' THEN -extract(epoch FROM dispatched_at)
                  ELSE extract(epoch FROM dispatched_at) END
    OFFSET %(skip)s LIMIT %(window)s
) w
"""

A_SINCE = """
SELECT count(*) FROM tock_jobs
WHERE tenant = 'A' AND state = 'dispatched' AND dispatched_at >= %(at)s
"""

DB_NOW = "SELECT now()"
TARGET_LAG_RATIO = 2.0
TARGET_RATE_RATIO = 0.9


class Sink:
    """A transport that takes every message and keeps none. It counts them by tenant (the
    message group), so the phase waits on A's progress without asking Postgres: counting
    A's dispatched rows every 0.1 s took 20-100 ms a count as they grew to 350,000, CPU
    taken from the timer it measures on a 2-core machine."""

    def __init__(self, backlog: dict[str, int]) -> None:
        self._sent: Counter[str] = Counter()
        self._backlog = backlog
        self._changed = threading.Condition()

    def send_batch(self, queue: str, entries: Sequence[Outgoing]) -> list[EntryFailure]:
        with self._changed:
            self._sent.update(e.group or "" for e in entries)
            self._changed.notify_all()
        return []

    def sent(self, tenant: str) -> int:
        with self._changed:
            return self._sent[tenant]

    def wait_sent(self, tenant: str, n: int, *, timeout: float, what: str) -> None:
        """Until `n` messages of `tenant` were sent; TimeoutError after `timeout` s, and
        RuntimeError at once if the tenant's whole backlog went out short of `n`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._sent[tenant] < n:
                if self._sent[tenant] >= self._backlog.get(tenant, n):
                    raise RuntimeError(f"{what}: all {self._sent[tenant]:,} of tenant "
                                       f"{tenant}'s jobs went out first; a larger "
                                       "fair_backlog is needed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what} "
                                       f"({self._sent[tenant]:,} sent)")
                self._changed.wait(left)

    def receive(self, queue: str, max_messages: int, wait_seconds: int,
                visibility_timeout: int) -> list[Received]:
        return []

    def delete_batch(self, queue: str, receipts: list[str]) -> list[EntryFailure]:
        return []

    def change_visibility_batch(self, queue: str, receipts: list[str],
                                visibility_timeout: int) -> list[EntryFailure]:
        return []

    def check(self, queue: str) -> None:
        return None

    def depth(self, queue: str) -> int:
        return 0

    def counts(self, queue: str) -> tuple[int, int]:
        return 0, 0

    def created_at(self, queue: str) -> datetime | None:
        return None


def fairness(ctx: Context) -> None:
    backlog = ctx.profile.fair_backlog
    rounds = ctx.profile.fair_rounds
    alone = _small_tenant_alone(ctx)
    ctx.progress.say(f"  B alone: due-to-dispatch p99 {alone['median_round_p99_ms']:.1f} ms "
                     f"in the median round, {alone['slowest_round_p99_ms']:.1f} ms in the "
                     "slowest")
    url = ctx.services.fresh_database("bench_fair")
    started = time.monotonic()
    _insert(url, backlog, "A")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE tock_jobs")
        conn.execute("CHECKPOINT")  # the insert's writes flushed, not during the measure
    ctx.progress.say(f"  {backlog:,} jobs of tenant A overdue "
                     f"({time.monotonic() - started:.0f} s to insert)")
    window = ctx.profile.fair_window
    with _running_timer(url, backlog) as sink:
        sink.wait_sent("A", 2 * window, timeout=600, what=f"A's first {2 * window:,} sent")
        b_due = _tenant_b_rounds(url, rounds)
        # Every A job sent from here on was claimed after B's arrival, so this many more
        # hold both windows after it; then their commits (a send precedes its commit).
        sink.wait_sent("A", sink.sent("A") + 2 * window, timeout=600,
                       what=f"A's {2 * window:,} after B's")
        waiting.until(url, A_SINCE, lambda v: v >= 2 * window, params={"at": b_due},
                      timeout=60, what=f"A's {2 * window:,} after B's committed",
                      interval=0.5)
    with psycopg.connect(url, autocommit=True) as conn:
        lags = [r[0] for r in conn.execute(LAGS).fetchall()]
        a_before = _a_rate(conn, b_due, window, side="before")
        a_during = _a_rate(conn, b_due, window, side="from")
        a_after = _a_rate(conn, b_due, window, side="from", skip=window)
    with_backlog = by_round(lags)
    ctx.results.series["fairness"] = {
        "backlog": backlog, "window": window, "b_alone": alone,
        "b_with_backlog": with_backlog, "a_rate_before": a_before, "a_rate_during": a_during,
        "a_rate_after": a_after}
    r = ctx.results
    r.raw("fair.b_alone.p99", "fairness",
          f"tenant B ({SMALL} due jobs), nothing else due: due-to-dispatch p99 in the "
          "median round", alone["median_round_p99_ms"], "ms",
          note=f"{rounds} rounds; the slowest round's: {alone['slowest_round_p99_ms']:.2f} ms")
    r.raw("fair.b_backlog.p99", "fairness",
          f"tenant B ({SMALL} due jobs) behind {backlog:,} overdue of tenant A: "
          "due-to-dispatch p99 in the median round", with_backlog["median_round_p99_ms"],
          "ms", note=f"{rounds} rounds; the slowest round's: "
                     f"{with_backlog['slowest_round_p99_ms']:.2f} ms")
    fig = r.raw("fair.b_lag_ratio", "fairness",
                "B's p99 with A's backlog / B's p99 alone (median rounds)",
                _ratio(with_backlog, alone, "median_round_p99_ms"), "x",
                note="each round of 100 is one trial of the experiment: its p99")
    fig.target, fig.met = f"<= {TARGET_LAG_RATIO:.0f}x", fig.value <= TARGET_LAG_RATIO
    r.raw("fair.b_lag_ratio_slowest", "fairness",
          "B's p99 with A's backlog / B's p99 alone (slowest rounds)",
          _ratio(with_backlog, alone, "slowest_round_p99_ms"), "x",
          note=f"the slowest of {rounds} rounds each way; pooled over the rounds, B's p99 "
               "is about this round's (a round goes out in one claim)")
    r.ratio("fair.a_rate_before", "fairness", "tenant A's dispatch rate before B's jobs",
            a_before, "jobs/s", "raw.pg.claim_b100",
            note=f"{window:,} jobs; the timer's claim and commit, SQS a sink")
    r.ratio("fair.a_rate_after", "fairness",
            f"tenant A's dispatch rate in the {window:,} jobs after those", a_after, "jobs/s",
            "fair.a_rate_before", note="no B then: how much A's rate falls as it drains")
    r.raw("fair.a_rate_around", "fairness",
          "tenant A's dispatch rate around B's arrival: the mean of the windows before and "
          "after", (a_before + a_after) / 2, "jobs/s")
    r.ratio("fair.a_rate_during", "fairness",
            f"tenant A's dispatch rate from B's arrival on ({window:,} jobs)", a_during,
            "jobs/s", "fair.a_rate_around", minimum=TARGET_RATE_RATIO)
    ctx.progress.say(f"  B behind {backlog:,}: p99 {with_backlog['median_round_p99_ms']:.1f} "
                     f"ms in the median round, {with_backlog['slowest_round_p99_ms']:.1f} ms "
                     "in the slowest; A "
                     f"{a_before:,.0f} -> {a_during:,.0f} -> {a_after:,.0f} jobs/s")


def _small_tenant_alone(ctx: Context) -> dict[str, Any]:
    url = ctx.services.fresh_database("bench_fair_alone")
    with _running_timer(url):
        time.sleep(0.5)  # let the timer settle into its idle wait, as in the backlog run
        _tenant_b_rounds(url, ctx.profile.fair_rounds)
    with psycopg.connect(url, autocommit=True) as conn:
        return by_round([r[0] for r in conn.execute(LAGS).fetchall()])


def by_round(lags: Sequence[float]) -> dict[str, Any]:
    """B's lags (in id order, `SMALL` per round): the p99 of each round, their median and
    the slowest, and the pooled percentiles. Pooled over the rounds, the p99 is about the
    slowest round's: a round goes out in one claim, so its jobs share one lag."""
    per_round = [percentiles(lags[i:i + SMALL])["p99_ms"] for i in range(0, len(lags), SMALL)]
    return {**percentiles(lags), "round_p99s_ms": per_round,
            "median_round_p99_ms": float(np.median(per_round)) if per_round else float("nan"),
            "slowest_round_p99_ms": max(per_round, default=float("nan"))}


def _tenant_b_rounds(url: str, rounds: int) -> Any:
    """`rounds` rounds of B's `SMALL` jobs, each due 200 ms after it is enqueued and
    enqueued once the round before it went out; returns when the first round fell due."""
    first = None
    for n in range(1, rounds + 1):
        due = waiting.scalar(url, "SELECT now() + interval '200 milliseconds'")
        first = first or due
        _insert(url, SMALL, "B", at=due)
        waiting.until(url, DISPATCHED, _at_least(n * SMALL), params={"tenant": "B"},
                      timeout=120, what=f"B's round {n} dispatched")
    return first


def _at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n


class _running_timer:
    """A real Timer (all its loops) on a thread, sending into the sink."""

    def __init__(self, url: str, a_backlog: int = 0) -> None:
        # Nothing reaches a consumer here: the lost-message check must not re-send, and
        # the dispatch window, which would stop the timer at its size, is off.
        settings = TimerSettings(database_url=url, queue_prefix="fair-",
                                 dispatch_timeout_seconds=3600, dispatch_window=0)
        self.sink = Sink({"A": a_backlog})
        self.timer = Timer(settings, self.sink)
        self.thread = threading.Thread(target=self.timer.run_forever, daemon=True)

    def __enter__(self) -> Sink:
        self.thread.start()
        return self.sink

    def __exit__(self, *exc: object) -> None:
        self.timer.stop_flag.set()
        self.thread.join(timeout=30)


def _insert(url: str, n: int, tenant: str, *, at: Any = None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(INSERT, {"kind": noop_tasks.KIND, "tenant": tenant, "n": n, "at": at})


def _a_rate(conn: psycopg.Connection[Any], at: Any, window: int, *, side: str,
            skip: int = 0) -> float:
    row = conn.execute(A_WINDOW, {"at": at, "window": window, "side": side,
                                  "skip": skip}).fetchone()
    assert row is not None
    if row[0] < window or not row[1]:
        raise RuntimeError(f"tenant A's window {side} B's arrival (+{skip:,}) holds "
                           f"{row[0]:,} of {window:,} dispatches over {row[1] or 0:.3f} s: "
                           "a larger fair_backlog is needed to time it")
    return rate(row[0], row[1])


def _ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float:
    return float(a[key] / b[key]) if b[key] > 0 else float("inf")
