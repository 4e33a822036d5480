"""Fair share through SQS: the real fleet (the timer process and consumer processes on
LocalStack) runs tenant A's backlog, and tenant B's 100 jobs fall due once A's jobs are
streaming. B's due-to-start p99 (handler start, not dispatch) against B's alone on the
same fleet, with the dispatch window (TOCK_DISPATCH_WINDOW) and, for comparison, without
it (0), where B's jobs wait in SQS behind every message of A's already sent."""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Any

import psycopg

from bench import noop_tasks, waiting
from bench.pipeline import LIVE_WORKERS, Context
from bench.procs import Fleet
from bench.results import Results
from bench.stats import percentiles, rate

SMALL = 100
"""Tenant B's jobs."""
TARGET_LAG_RATIO = 2.0
TARGET_RATE_RATIO = 0.9
RATE_WINDOW_SECONDS = 3.0
"""A's throughput is compared over this long on each side of B's arrival: long enough that
B's 100 jobs are a few percent of the window's completions, as they are of a long drain
(the dispatch phase compares 50,000 of A's jobs on each side)."""

ONE_TICK = timedelta(microseconds=1)
"""timestamptz's resolution: `finished_at < t + ONE_TICK` is `finished_at <= t`."""

INSERT = """
INSERT INTO tock_jobs (kind, queue, payload, tenant, run_at)
SELECT %(kind)s, 'default', '{}', %(tenant)s, coalesce(%(at)s::timestamptz, now())
FROM generate_series(1, %(n)s) AS g
"""

AT = "SELECT now() + make_interval(secs => %(lead)s)"
MAX_ID = "SELECT coalesce(max(id), 0) FROM tock_jobs_all"

SUCCEEDED = """
SELECT count(*) FROM tock_jobs_all
WHERE tenant = %(tenant)s AND id > %(after)s AND state = 'succeeded'
"""

LAGS = """
SELECT extract(epoch FROM started_at - run_at)::float8 FROM tock_jobs_all
WHERE tenant = 'B' AND id > %(after)s AND state = 'succeeded'
"""

# Completions per second of %(tenants)s over [since, until), from the times Postgres wrote.
RATE = """
SELECT count(*), extract(epoch FROM max(finished_at) - min(finished_at))::float8
FROM tock_jobs_all
WHERE tenant = ANY(%(tenants)s) AND finished_at >= %(since)s AND finished_at < %(until)s
"""

IN_SQS = "SELECT count(*) FROM tock_jobs WHERE state = 'dispatched'"

WINDOW_PASSED = """
SELECT now() > %(at)s::timestamptz + make_interval(secs => %(seconds)s)
       OR NOT EXISTS (SELECT 1 FROM tock_jobs WHERE tenant = 'A')
"""


def fair_through_sqs(ctx: Context, consumers: int) -> None:
    p = ctx.profile
    window = {} if p.fair_sqs_window is None else {"TOCK_DISPATCH_WINDOW": str(p.fair_sqs_window)}
    # Each round is a whole trial on a fresh fleet: one trial's p99 of 100 jobs through
    # LocalStack moves by a hundred milliseconds between runs on a busy 2-core machine.
    rounds = [_run(ctx, f"fairsqs{n}" if n else "fairsqs", consumers, window)
              for n in range(p.fair_sqs_rounds)]
    alone = _median_round([r[0] for r in rounds])
    behind = _median_round([r[1] for r in rounds])
    a_before, a_during, a_in_b, fleet_during = (
        float(statistics.median(r[2][i] for r in rounds)) for i in range(4))
    queued = [r[3] for r in rounds]
    r = ctx.results
    size = p.fair_sqs_window or "default"
    of_rounds = (f"the median of {len(rounds)} rounds (each a fresh fleet); the slowest "
                 "round's: {:.0f} ms")
    r.raw("fair.sqs.b_alone.p99", "fairness",
          f"tenant B ({SMALL} due jobs) through SQS, nothing else queued: due-to-start p99",
          alone["p99_ms"], "ms", note=f"{consumers} consumer(s) on LocalStack; "
          + of_rounds.format(alone["slowest_p99_ms"]))
    r.raw("fair.sqs.b_backlog.p99", "fairness",
          f"tenant B ({SMALL} due jobs) through SQS behind {p.fair_sqs_backlog:,} of tenant "
          f"A's: due-to-start p99", behind["p99_ms"], "ms",
          note=f"dispatch window {size}; of A's jobs in SQS or prefetched as B's arrived: "
               f"{', '.join(f'{q:,}' for q in queued)}; "
               + of_rounds.format(behind["slowest_p99_ms"]))
    per_round = ", ".join(f"{b['p99_ms'] / a['p99_ms']:.2f}x" if a["p99_ms"] else "inf"
                          for a, b, *_ in rounds)
    fig = r.raw("fair.sqs.b_lag_ratio", "fairness",
                "through SQS: B's p99 behind A's backlog / B's p99 alone (median rounds)",
                behind["p99_ms"] / alone["p99_ms"] if alone["p99_ms"] else float("inf"), "x",
                note=f"round by round: {per_round}")
    fig.target, fig.met = f"<= {TARGET_LAG_RATIO:.0f}x", fig.value <= TARGET_LAG_RATIO
    r.ratio("fair.sqs.a_rate_before", "fairness",
            "through SQS: tenant A's completions before B's jobs", a_before, "jobs/s",
            "raw.sqs.cycle", note="the median of the rounds")
    r.ratio("fair.sqs.a_rate_during", "fairness",
            f"through SQS: tenant A's completions in the {RATE_WINDOW_SECONDS:g} s from B's "
            "arrival", a_during, "jobs/s", "fair.sqs.a_rate_before", minimum=TARGET_RATE_RATIO,
            note=f"against the {RATE_WINDOW_SECONDS:g} s before it (medians of the rounds; "
                 "round by round: " + ", ".join(f"{x[2][1] / x[2][0]:.2f}" if x[2][0] else "-"
                                                  for x in rounds) + ")")
    r.ratio("fair.sqs.a_rate_b_window", "fairness",
            "through SQS: tenant A's completions while B's jobs ran", a_in_b, "jobs/s",
            "fair.sqs.a_rate_before",
            note="B's jobs take their turn on the same busy consumers: A's share of this "
                 "window is at most the rest")
    r.ratio("fair.sqs.fleet_rate_during", "fairness",
            "through SQS: A's and B's completions together while B's jobs ran", fleet_during,
            "jobs/s", "fair.sqs.a_rate_before", note=_share_note(a_in_b, fleet_during))
    ctx.progress.say(f"  through SQS ({len(rounds)} rounds): B alone p99 {alone['p99_ms']:.0f} "
                     f"ms, behind A {behind['p99_ms']:.0f} ms (median rounds; {per_round})")
    series: dict[str, Any] = {"backlog": p.fair_sqs_backlog, "window": p.fair_sqs_window,
                              "b_alone": alone, "b_with_backlog": behind,
                              "a_in_sqs": queued,
                              "rounds": [{"b_alone": a, "b_with_backlog": b, "a_rates": list(x),
                                          "a_in_sqs": q} for a, b, x, q in rounds]}
    if p.fair_sqs_compare:
        _, unbounded, _, queued_off = _run(ctx, "fairsqs0", consumers,
                                               {"TOCK_DISPATCH_WINDOW": "0"})
        r.raw("fair.sqs.no_window.b_backlog.p99", "fairness",
              "the same with no dispatch window (TOCK_DISPATCH_WINDOW=0): B's p99",
              unbounded["p99_ms"], "ms",
              note=f"{queued_off:,} of A's jobs in SQS as B's arrived")
        ctx.progress.say(f"  without the window: B behind A {unbounded['p99_ms']:.0f} ms "
                         f"({queued_off:,} of A's in SQS as B's arrived)")
        series["no_window"] = {"b_with_backlog": unbounded, "a_in_sqs": queued_off}
    ctx.results.series["fairness_sqs"] = series


def _median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The round with the median p99 (the upper middle one of an even count: no average
    of two rounds, which neither ran), and the slowest round's p99."""
    ordered = sorted(rounds, key=lambda one: one["p99_ms"])
    return {**ordered[len(ordered) // 2], "slowest_p99_ms": ordered[-1]["p99_ms"]}


def _share_note(a_in_b: float, fleet_during: float) -> str:
    """B's share of the completions while B's jobs ran: one minus A's rate over A's and B's
    together, both over that same window (from B's arrival to B's last finish)."""
    if not fleet_during:
        return ""
    return (f"B's jobs are {1 - a_in_b / fleet_during:.0%} of these (1 - "
            "`fair.sqs.a_rate_b_window` / this rate, over the same window): with the "
            "consumers busy, A's own rate there is at most the rest")


def finalize(results: Results) -> None:
    """Word the B's-share note from the stored figures again (a results.json rendered
    again gets the note this version writes)."""
    a_in_b = results.figure("fair.sqs.a_rate_b_window")
    fleet = results.figure("fair.sqs.fleet_rate_during")
    if a_in_b is not None and fleet is not None:
        fleet.note = _share_note(a_in_b.value, fleet.value)


def _run(ctx: Context, phase: str, consumers: int, env: dict[str, str]
         ) -> tuple[dict[str, float], dict[str, float], tuple[float, float, float, float],
                    int]:
    """One fleet: B alone, then A's backlog and B behind it. Returns (B alone, B behind
    A, (A's rate in the window before B's arrival, in the window from it, while B's jobs
    ran, A's and B's together while B's jobs ran), A's jobs in SQS when B's were
    enqueued)."""
    p = ctx.profile
    url = ctx.services.fresh_database(f"bench_{phase}")
    fleet = ctx.fleet(phase, url, ctx.phase_queue(phase))
    try:
        fleet.start_timer(env)
        fleet.start_consumers(consumers)
        waiting.until(url, LIVE_WORKERS, lambda v: v == consumers, timeout=60,
                      what=f"{consumers} consumers up", fleet=fleet)
        alone = _tenant_b(url, fleet)
        after = waiting.scalar(url, MAX_ID)
        _insert(url, p.fair_sqs_backlog, "A")
        # Streaming: A's jobs have been going through for a while, SQS holds its share.
        streaming = min(p.fair_sqs_backlog // 5, 3 * (p.fair_sqs_window or 1000))
        waiting.until(url, SUCCEEDED, lambda v: v >= streaming,
                      params={"tenant": "A", "after": after}, timeout=600,
                      what=f"A's first {streaming:,} jobs", fleet=fleet)
        queued = waiting.scalar(url, IN_SQS)
        arrived = waiting.scalar(url, "SELECT now()")
        behind, b_done = _tenant_b(url, fleet, with_end=True)
        # The window after B's arrival must have passed (or A's backlog run out) first.
        waiting.until(url, WINDOW_PASSED, bool,
                      params={"at": arrived, "seconds": RATE_WINDOW_SECONDS}, timeout=120,
                      what="A's window after B's", fleet=fleet)
        # Up to and with B's last finish: an outcome group shares one finished_at, so a
        # window that stopped short of it would leave B's last group out.
        b_end = b_done + ONE_TICK if b_done is not None else None
        with psycopg.connect(url, autocommit=True) as conn:
            before = _rate(conn, arrived, lookback=True)
            during = _rate(conn, arrived, lookback=False)
            in_b = _rate(conn, arrived, lookback=False, until=b_end)
            both = _rate(conn, arrived, lookback=False, until=b_end, tenants=("A", "B"))
        return alone, behind, (before, during, in_b, both), queued
    finally:
        fleet.stop()


def _tenant_b(url: str, fleet: Fleet, *, with_end: bool = False) -> Any:
    after = waiting.scalar(url, MAX_ID)
    at = waiting.scalar(url, AT, {"lead": 0.2})
    _insert(url, SMALL, "B", at=at)
    waiting.until(url, SUCCEEDED, lambda v: v >= SMALL, params={"tenant": "B", "after": after},
                  timeout=600, what="B's jobs succeeded", fleet=fleet, interval=0.02)
    with psycopg.connect(url, autocommit=True) as conn:
        lags = percentiles([r[0] for r in conn.execute(LAGS, {"after": after}).fetchall()])
        end = conn.execute("SELECT max(finished_at) FROM tock_jobs_all WHERE tenant = 'B' "
                           "AND id > %(after)s", {"after": after}).fetchone()
    return (lags, end[0] if end else None) if with_end else lags


def _insert(url: str, n: int, tenant: str, *, at: Any = None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(INSERT, {"kind": noop_tasks.KIND, "tenant": tenant, "n": n, "at": at})


def _rate(conn: psycopg.Connection[Any], at: Any, *, lookback: bool, until: Any = None,
          tenants: tuple[str, ...] = ("A",)) -> float:
    """Completions per second of `tenants`: over RATE_WINDOW_SECONDS before `at`
    (lookback) or from it, or from `at` to `until`."""
    window = timedelta(seconds=RATE_WINDOW_SECONDS)
    since = at - window if lookback else at
    until = at if lookback else (until if until is not None else at + window)
    row = conn.execute(RATE, {"since": since, "until": until,
                              "tenants": list(tenants)}).fetchone()
    assert row is not None
    return rate(row[0], row[1] or 0.0)
