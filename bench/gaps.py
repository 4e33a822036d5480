"""What would close each gap, for the report's shortfall section. Written from profiling
tock on these machines (cProfile over every thread, pg_stat_statements per statement, the
burst's drain curve) against the core as it is now: the timer's fair claim
(`DUE_LEVELS`, `DUE_PAIRS_*`, `CLAIM_PAIRS`) on two dispatch threads that overlap a claim
with the previous batch's sends; consumers that claim several receives in one statement
(`TOCK_CLAIM_BATCH_SIZE`), group-commit outcomes (`TOCK_GROUP_COMMIT_MS`) and move a
finished job to the history in its outcome statement; one heartbeat row per worker. The
numbers behind them are in the report's tables. Keyed by figure-key prefix; the first
matching prefix wins."""

from __future__ import annotations

import re
from typing import Any

Figures = dict[str, dict[str, Any]]
"""A run's figures by key, as results.json holds them."""

RUN_CPU = "<the CPU the in-memory runs used>"
"""Marker in a note for `_run_cpu`'s sentences, written from the run's figures."""
TARGET_CORES = "<the cores the in-memory target takes>"
"""Marker in a note for `_target_cores`'s sentence, written from the run's figures."""
TARGET_US = "<the CPU per job the in-memory target allows>"
"""Marker in a note for a million over the in-memory target rate (in us), from the run's
raw claim + completion ceiling."""

_CONSUMER = (
    "Where the time goes: " + RUN_CPU + " When the consumer was profiled over the "
    "in-memory transport at concurrency 32 (cProfile, not in this run), its 32 executor "
    "threads waited for work 99.9% of the time, and the two claimer threads waited for free "
    "handler slots about 40% of theirs. A slot is held from before the receive until the "
    "handler returns, so the claim's round trip and the per-job hand-offs between threads "
    "(claimer, work queue, executor, outcome queue, completer: each a lock and a wake-up "
    "under one GIL) take their share of each job's time, and one completer thread writes "
    "every outcome (`sql.FINISH_ATTEMPTS`: the attempt row, the move to the history, a "
    "durable commit per group) and logs an INFO "
    "`job_succeeded` line per job, a group's lines in one write (a write per line cost "
    "about a quarter of the process's CPU per job: 280 against 220 us). Claims are as "
    "large as the free slots allow, so at concurrency 8 a claim "
    "carries at most 8 rows. A message that arrives before the timer's dispatch commits "
    "makes the claim wait for that commit (`sql.WAIT_FOR_DISPATCH_COMMIT`, at most "
    "`LOCK_WAIT_MS`). What would close it: (1) executors that take claimed jobs in batches "
    "and handlers run without a thread hand-off per job; (2) one claimer statement fed by "
    "every receiver of a queue, so claims carry more rows at low concurrency; (3) more "
    "consumer processes, which is what production does "
    "(one process per core), and which help only while the SQS server has headroom (see "
    "the `raw.sqs.path` rows)."
)

_PIPELINE = (
    "End to end includes the timer's sends on the same SQS server: compare with "
    "the `raw.sqs.path` rows (send + receive + delete per message), which put the "
    "ceiling of a one-server pipeline lower than the receive + delete cycle alone. "
    "For database work per job, the raw ceiling runs two statements per 100 jobs (a "
    "claim and a completion) in a bare loop. tock runs five per batch: the timer's "
    "fair claim (`DUE_LEVELS`, "
    "`DUE_PAIRS_FROM`, `CLAIM_PAIRS`), the consumer's `CLAIM_MESSAGES` and its "
    "`FINISH_ATTEMPTS`, which also moves each finished job and its attempts to the "
    "history partitions and keeps the attempts' foreign key. The consumer's batches "
    "are bounded by its free handler slots, so at concurrency 8 a claim carries at "
    "most 8 rows (compare the concurrency 32 row). There timer and consumer share one "
    "Python process (one GIL), and the per-job Python work is in the figure: the "
    "statement tables put the database time at about 0.1 ms per job, under half of the "
    "wall time per job. The `cpu.memory.*` figures of the same runs say what bounds the "
    "in-memory rate: the CPU each job costs in tock's one process (the timer's and the "
    "consumer's threads, under one GIL) and in Postgres, which share this machine's "
    "cores; see the note on them. " + _CONSUMER
)

_CPU = (
    "The in-memory target is half the raw claim + completion loop's rate (the `cores` "
    "figure's note gives it for this run). Timer and consumer run in one Python process "
    "there, and the `python` figure is that process's CPU per job: one process cannot go "
    "past one core of Python (the GIL), so its rate is at most a million over that figure "
    "(in us) jobs/s, whatever the machine, and the target needs the figure at a million "
    "over the target rate or less (" + TARGET_US + "). Postgres's CPU per "
    "job (the `postgres` figure, against the raw loop's in the same run) comes on top, on "
    "the same cores, and the `cores` figure adds the two up at the target rate. "
    + TARGET_CORES + " Where Postgres's share goes: tock writes each job "
    "three times in the hot table (the timer's claim, the consumer's claim, the move to "
    "the history) where the raw loop writes it twice, each update of a row (not HOT: "
    "every write changes its state, which the indexes carry) enters it in seven indexes "
    "of the hot table, the fair claim reads before it writes, and at concurrency 8 the "
    "consumer's claims carry at most 8 rows, so the statements and commits per job "
    "double (compare the two concurrencies). Where the process's share goes: per job, "
    "the claim's rows and parameters through psycopg, an outcome and its parameters, a "
    "JSON log line and a few metrics, and the thread hand-offs (work queue, executor, "
    "outcome queue), each a wake-up of another thread; the profile tables above break it "
    "down. In production the timer and each consumer are separate processes on their "
    "own cores and consumers scale out, so neither bound is the fleet's."
)
"""One note for the consume-only, end-to-end and in-memory figures: the report lists them
together under it."""

GAP_NOTES: dict[str, str] = {
    "consume.": _PIPELINE,
    "e2e.": _PIPELINE,
    "dbwork.": _PIPELINE,
    "cpu.memory": _CPU,
    "latency.steady": (
        "At a steady rate well under capacity nothing queues, so the p99 is one job's trip: "
        "the producer's commit, the timer's wake-up on the insert's NOTIFY (the "
        "due-to-dispatch column), the SQS server's send-to-receive time and the "
        "consumer's claim. On these shared 2-core machines that p99 moves with the machine's "
        "load from run to run (33 ms to over 250 ms has been measured for the same code; "
        "the phase table gives the load average at each phase), so one run's figure is "
        "not a verdict on its own. Compare the due-to-dispatch p99 between runs to see "
        "which side moved."
    ),
    "latency.simultaneous": (
        "The `latency.simultaneous.floor` figure is the p99 the raw SQS path alone allows "
        "for this many jobs on this server: LocalStack serves a few thousand messages a "
        "second from one Python process, so the pipeline's floor is set by the SQS server, "
        "not by tock; the ratio to that floor is the number to read here. The "
        "due-to-dispatch column is the timer's share (batches of 100, two dispatch threads "
        "overlapping claims with sends)."
    ),
    "burst.": (
        "The burst drains at the rate of the slower of the timer's sends and the consumers' "
        "receives on one SQS server; see the burst paragraph and the drain curve."
    ),
    "latency.memory": (
        "Over the in-memory transport the timer, the consumer and the 500 jobs share one "
        "Python process: the p99 is the time the last of the 500 waits for a handler slot "
        "and the GIL behind the others (five batches of 100, then claims and outcomes of "
        "up to 32 at a time), not a wait on Postgres. It is the in-memory rate again: 500 "
        "jobs times the process's CPU per job (`cpu.memory.c32.python`, 200-300 us on the "
        "machines measured) is 100-150 ms of one core under one GIL before any wait, so the "
        "last of them cannot start within 100 ms in one process at that cost; see the note "
        "on the CPU figures."
    ),
    "memory.": (
        "RSS grew while the backlog moved: look for caches keyed by job (the consumer's "
        "`_inflight` map is emptied per job; prometheus label sets grow with kinds and queues)."
    ),
    "scale.history": (
        "The history lives in its own partitioned tables, so the hot table and the claim's "
        "indexes do not see it; a drop here would point at the key trigger "
        "(`tock_claim_key`, only for keyed jobs) or at autovacuum busy on the history. "
        "It compares with the base table's claim measured loop for loop beside it "
        "(`scale.claim.base_at.history`), each the median of seven sub-second loops, "
        "which spread by a fifth here."
    ),
    "scale.claim": (
        "Measure again before acting: each size's claim is the median of seven loops of well "
        "under a second, after a CHECKPOINT of the setup's writes, compared with the "
        "10k-row base table's claim measured loop for loop beside it "
        "(`scale.claim.base_at.*`, every pair of loops in results.json), and the loops "
        "spread more than the table moves them: on one 5M-row table here, eight "
        "loops gave 23,900-30,800 jobs/s, against 29,190 at 10k in one run. The claim "
        "probes `tock_jobs_due_idx` once per priority level (`sql.DUE_LEVELS`), walks the "
        "(kind, queue, tenant) with due work through `tock_jobs_fair_idx` (`sql.DUE_PAIRS_*`, "
        "one probe per step) and takes each pair's oldest rows (`sql.CLAIM_PAIRS`), so "
        "pending rows cost it one B-tree level per 100x. At 5M pending the table and its "
        "indexes (about 2 GB) outgrow `shared_buffers` (1 GB here) and each claimed row "
        "writes an entry into each of the hot table's indexes, each a B-tree level "
        "deeper than at 10k: `sql.CLAIM_PAIRS` touched 36 buffers per claimed row at 5M "
        "against 26 at 10k (pg_stat_statements, none read from disk), which the rate "
        "follows. Tried: dropping the "
        "per-state index (one of those writes) left the 5M claim where it was, within the "
        "loop-to-loop spread."
    ),
    "fair.sqs.": (
        "Through SQS a newcomer's jobs wait in the queue behind whatever of the backlog is "
        "already there: SQS has no tenants. The dispatch window (README, The dispatch "
        "window) keeps that to about `TOCK_DISPATCH_WINDOW_SECONDS` (0.25 s) of the fleet's "
        "work plus a batch (B's own jobs go out ahead of any more of A's: fair share levels "
        "the tenants' jobs in SQS), so B's p99 behind A is B's p99 alone plus about a "
        "third of a second; the ratio is met only while B alone is slower than that. On "
        "LocalStack, whose own send-to-receive time is 0.15-0.25 s at p99 here, it has "
        "measured from 2x to about 5x between runs; without the window (the `no_window` "
        "figure) B waits "
        "behind every message of A's already sent. A shorter age shortens the wait but, "
        "on an SQS whose send-to-receive time is near it, holds back sends that consumers "
        "would have taken: the consumers need about one receive round of A's messages "
        "waiting in SQS to stay busy, and a single queue hands those out before B's. "
        "Past that floor SQS itself must order by tenant: tock sends each job's tenant "
        "as its MessageGroupId (`TOCK_SQS_FAIR_QUEUES`), which makes an AWS standard "
        "queue a fair queue. LocalStack carries the group but delivers in send order "
        "(checked: 10 of B's sent after 1,000 of A's came back last), so this run cannot "
        "show what fair queues change. A's throughput (`fair.sqs.a_rate_during`) is its "
        "completions in the 3 s from B's arrival against the 3 s before, in which B's 100 "
        "jobs are a few percent; counted only while B's jobs ran "
        "(`fair.sqs.a_rate_b_window`, from B's arrival to B's last finish, under a second "
        "here), B's jobs take their turn on "
        "the same busy consumers and A's own rate is at most one minus their share, which "
        "the `fair.sqs.fleet_rate_during` figure (A and B together) gives in its note."
    ),
    "fair.a_rate_": (
        "A's rate from B's arrival on is compared with the mean of A's rates in the windows "
        "just before and just after (the same number of A's jobs each, a few seconds with "
        "SQS a sink), because A's rate falls as its backlog drains with or without B (the "
        "`fair.a_rate_after` figure; measured with no B at all, consecutive windows of a 1M "
        "drain here fell from about 19-22k to 15-17k jobs/s over the first 350,000, with no "
        "checkpoint between, and came back after an autovacuum; the claim statement's own "
        "time stayed at 5.4 ms). "
        "B's 500 jobs are 1% of the window "
        "and the due watcher's pass for a round is one claim; on this 2-core machine the "
        "dispatch threads and their Postgres backends keep both cores busy, so anything "
        "else that runs (a checkpoint, autovacuum) lands in one window or another."
    ),
    "fair.": (
        "Both p99s are dispatch lags of about a millisecond (SQS is a sink here), so the "
        "ratio is that of two very small numbers, and one late wake-up of one thread on "
        "this 2-core machine (its two dispatch threads' Postgres backends keep both cores "
        "busy) moves one round's by several times. A round of B's 100 goes out whole, in "
        "one claim, so its p99 is the round's lag, and the target is judged on the median "
        "of the rounds (each round is one trial of the experiment); the slowest rounds' "
        "ratio (`fair.b_lag_ratio_slowest`), which the p99 pooled over every round would "
        "be, is reported beside it. Behind A's "
        "backlog the due watcher (timer_service/due_watcher.py) sleeps until 10 ms before "
        "B's first job falls due, holds the backlog passes that have not started "
        "(Dispatcher.priority_pass), and claims B's jobs in one pass at their due time, "
        "so its claim does not wait for a core behind the dispatch threads' backends. "
        "In an A/B over 300,000 overdue jobs, B's rounds then left within 0.4-0.6 ms of "
        "their due time (1-8 ms without the hold); what remains over 2x is a late "
        "wake-up of the watcher's own thread (the GIL, a core) in a round. "
        "With no backlog each round leaves in the first pass after they fall due. Past "
        "dispatch, B's jobs also wait behind what of A's is in SQS: the `fair.sqs` "
        "figures measure that, through LocalStack and the consumers."
    ),
    "dispatch.": (
        "The timer holds each claim transaction open across its sends (by design: a crash "
        "before commit loses nothing); two dispatch threads overlap one batch's claim with "
        "the previous batch's sends, so the rate follows the SQS server's send rate (the "
        "`raw.sqs.send` ceiling)."
    ),
}


def gap_note(key: str, figures: Figures, environment: dict[str, Any]) -> str:
    """What would close the gap of the figure `key` (the first matching prefix's note), with
    its markers filled in from this run's `figures` (by key) and `environment`."""
    text = next((note for prefix, note in GAP_NOTES.items() if key.startswith(prefix)),
                "No analysis recorded for this figure.")
    cores = int(environment.get("cpu_count") or 0)
    if RUN_CPU in text:
        text = text.replace(RUN_CPU, _run_cpu(figures, cores))
    if TARGET_CORES in text:
        text = text.replace(TARGET_CORES, _target_cores(figures, cores))
    if TARGET_US in text:
        ceiling = figures.get("raw.pg.claim_complete_b100", {}).get("value")
        text = text.replace(TARGET_US, f"{1e6 / (0.5 * ceiling):.0f} us in this run"
                            if ceiling else "120-150 us on the machines measured")
    return text


def _memory_runs(figures: Figures) -> list[tuple[int, dict[str, Any]]]:
    """The in-memory runs' concurrencies, each with its rate figure."""
    runs = []
    for fig_key, fig in figures.items():
        match = re.fullmatch(r"dbwork\.memory\.c(\d+)", fig_key)
        if match and fig.get("value"):
            runs.append((int(match.group(1)), fig))
    return sorted(runs, key=lambda run: run[0])


def _run_cpu(figures: Figures, cores: int) -> str:
    """The CPU the in-memory runs used (CPU per job times jobs/s), and what that says bound
    their rate."""
    used = []
    for c, rate in _memory_runs(figures):
        python = figures.get(f"cpu.memory.c{c}.python")
        postgres = figures.get(f"cpu.memory.c{c}.postgres")
        if not python or not python.get("value"):
            continue
        process = python["value"] * rate["value"] / 1e6
        both = process + rate["value"] / postgres["value"] \
            if postgres and postgres.get("value") else None
        used.append((c, process, both))
    if not used:
        return "this run has no CPU figures of the in-memory runs to say what bound them."

    def listed(values: list[str]) -> str:
        return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]

    text = ("in this run's in-memory runs (CPU per job times jobs/s), tock's process used "
            + listed([f"{process:.2f} of a core at concurrency {c}" for c, process, _ in used]))
    together = [f"{both:.2f}" for _, _, both in used if both is not None]
    if len(together) == len(used):
        text += (f"; tock and Postgres together {listed(together)}"
                 + (f" of the machine's {cores} cores" if cores else " cores"))
    text += ". "
    top_process = max(process for _, process, _ in used)
    top_both = max((both for _, _, both in used if both is not None), default=None)
    if top_process >= 0.9:
        return text + ("The one process was at the core of Python its GIL allows: its CPU "
                       "per job bound the rate.")
    if cores and top_both is not None and top_both >= 0.9 * cores:
        return text + ("The machine's cores were busy: tock's and Postgres's CPU per job "
                       "bound the rate.")
    return text + ("Neither the one process (at most a core of Python, under the GIL) nor "
                   "tock and Postgres together used all the CPU there was, so waits between "
                   "threads, or whatever else ran on the machine (the phase table's load "
                   "average counts everything), bound the rate below what the CPU per job "
                   "allows; the `cores` figures say what the target's rate would take even "
                   "without them.")


def _target_cores(figures: Figures, cores: int) -> str:
    """What the `cores` figures say about reaching the in-memory target on this machine."""
    values = sorted(f["value"] for k, f in figures.items()
                    if re.fullmatch(r"cpu\.memory\.c\d+\.cores", k) and f.get("value"))
    if not values or not cores:
        return "The `cores` figures are missing from this run."
    span = (f"{values[0]:.1f}" if len(values) == 1
            else f"{values[0]:.1f}-{values[-1]:.1f}")
    if values[0] > cores:
        return (f"So on this machine the target is out of reach by CPU arithmetic, not by "
                f"waiting: the `cores` figures put its rate at {span} cores, and the machine "
                f"has {cores}.")
    if values[-1] > cores:
        return (f"The `cores` figures put its rate at {span} cores against the machine's "
                f"{cores}: within reach by CPU at the lower cost per job, not at the higher.")
    return (f"The `cores` figures put its rate at {span} cores, within the machine's "
            f"{cores}: CPU does not rule the target out here, the waits do.")
