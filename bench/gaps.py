"""What would close each gap, for the report's shortfall section. Written from profiling
tock on these machines (cProfile over every thread, pg_stat_statements per statement, the
burst's drain curve); the numbers behind them are in the report's tables. Keyed by
figure-key prefix; the first matching prefix wins."""

_CONSUMER = (
    "Where the time goes: per received batch (at most 10 messages, the SQS limit) a consumer "
    "runs two transactions, the claim (`Consumer._claim_rows`, `sql.CLAIM_MESSAGES`) and the "
    "completion (`Consumer._write`, `sql.FINISH_ATTEMPTS`). Each costs four round trips (the "
    "pool's `check_connection` on checkout, BEGIN, the statement, COMMIT) and a durable WAL "
    "flush; the statements themselves take 1-2 ms, the transactions around them several "
    "times that (compare `_claim_rows`/`_write` ms per job with the statements' mean ms "
    "below). A message that arrives before the timer's dispatch transaction commits (the "
    "timer sends before it commits) makes the receiver block in `SELECT ... FOR UPDATE` "
    "(`_claim_rows(wait_for_locks=True)`) for the rest of that transaction, i.e. while the "
    "timer is still sending, holding its reserved slots. Each job also writes two INFO log "
    "lines (`job_started`, `job_succeeded`), each formatted as JSON and flushed. "
    "What would close it: (1) `SET LOCAL synchronous_commit = off` in the claim transaction "
    "and in the timer's dispatch transaction: losing either in a crash is already handled by "
    "the fences (a redelivered message claims again; an uncommitted token is stale), so they "
    "need no WAL flush; (2) `shared.db.make_pool` without `check=ConnectionPool.check_"
    "connection` on every checkout (check idle connections in the background instead), and "
    "single-statement transactions in autocommit: four round trips become one; (3) in "
    "`Consumer._claim`, do not wait on locks: give the missed messages a short visibility "
    "(ChangeMessageVisibility a second or two) and move on; (4) one log line per claimed or "
    "completed batch, or per-job events at DEBUG."
)

GAP_NOTES: dict[str, str] = {
    "consume.": _CONSUMER,
    "e2e.": (
        "End to end also includes the timer's sends on the same SQS server: compare with "
        "the `raw.sqs.path` rows (send + receive + delete per message), which put the "
        "ceiling of a one-server pipeline lower than the receive + delete cycle alone. "
        + _CONSUMER
    ),
    "dbwork.": (
        "The raw ceiling claims and completes 100 rows per transaction, in autocommit, one "
        "statement each; tock's consumer claims at most 10 rows per transaction (one SQS "
        "receive) and completes what has finished by then (about one receive's worth), so "
        "it pays ten times the commits per job, each with four round trips. Timer and "
        "consumer also share one Python process here. Per statement (table below), the "
        "timer's `sql.CLAIM_DUE` costs more per job than the consumer's claim: it visits ten "
        "priority levels, each a LATERAL `LIMIT ... FOR UPDATE SKIP LOCKED`, and draws a "
        "`gen_random_uuid()` per row; `sql.FINISH_ATTEMPTS` also pays the foreign-key check "
        "of `tock_attempts.job_id` (a `FOR KEY SHARE` lock on the job row it just updated) "
        "that the bare completion does not (not measured apart). What would close it, "
        "beyond the consumer fixes below: claim the messages of several receives in one "
        "statement (the two receivers of a queue feeding one claimer), let the completer "
        "wait a few milliseconds for a fuller batch when the previous write was small, and "
        "in `CLAIM_DUE` skip the levels that have nothing due (one `SELECT DISTINCT "
        "priority` over the due index, or a per-level next-due cache like NEXT_DUE_AT's). "
        + _CONSUMER
    ),
    "latency.simultaneous": (
        "The `latency.simultaneous.floor` figure is the p99 the raw SQS path alone allows "
        "for this many jobs on this server: LocalStack serves a few hundred messages a second "
        "from one Python process, so 100 ms for 500 jobs cannot be reached against it by any "
        "pipeline; the ratio to that floor is the number to read here. The due-to-dispatch "
        "column shows the timer's share (it sends a 200-job batch as 20 SendMessageBatch "
        "calls, 8 in flight, before it commits). Even at a low steady rate about half of "
        "due-to-start is due-to-dispatch: every timer pass (`Timer.run_once`) runs "
        "`Rescuer.rescue_expired` and `Rescuer.redispatch_stuck` in their own transactions "
        "before `Dispatcher.dispatch_due`, although `TimerSettings.maintenance_interval_"
        "seconds` (2 s) exists for them and is not read anywhere; the profile shows each of "
        "those empty transactions costing about as much as a claim. Running them every "
        "maintenance interval instead of every pass takes two transactions (eight round "
        "trips) off the path of a freshly due job. Against real SQS, what would bring p99 "
        "under 100 ms: that, more send concurrency in the timer "
        "(`TimerSettings.send_concurrency`), a smaller first batch (commit and let "
        "consumers start on 50 while the rest is sent), plus the consumer fixes listed for "
        "end to end."
    ),
    "burst.": (
        "The burst drains at the rate of the slower of the timer's sends and the consumers' "
        "receives on one SQS server; see the burst paragraph and the drain curve."
    ),
    "memory.": (
        "RSS grew while the backlog moved: look for caches keyed by job (the consumer's "
        "`_inflight` map is emptied per job; prometheus label sets grow with kinds and queues)."
    ),
    "scale.claim": (
        "Measure again before acting: each size's claim loop runs for well under a second, "
        "so a spike of other load on the machine moves this ratio more than the table does "
        "(on these machines it has landed on both sides of 1.0 from run to run). The due "
        "scan walks `tock_jobs_due_idx` once per priority level (`sql.CLAIM_DUE`) and stops "
        "at the first future row, so pending rows cost it one B-tree level per 100x; a real "
        "slowdown with size would point at dead index entries left by claimed rows (vacuum "
        "`tock_jobs` more often: a per-table `autovacuum_vacuum_scale_factor`)."
    ),
    "dispatch.": (
        "The timer holds its claim transaction open across the sends (by design: a crash "
        "before commit loses nothing); its rate is bounded by SendMessageBatch round trips at "
        "`send_concurrency` in flight. More concurrency, or overlapping the next claim with "
        "the current batch's sends, would close the gap."
    ),
}
