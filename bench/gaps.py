"""What would close each gap, for the report's shortfall section. Written from profiling
tock on these machines (cProfile over every thread, pg_stat_statements per statement, the
burst's drain curve) against the core as of the "fewer round trips per job" change (claims
and timer writes in autocommit without a WAL-flush wait, outcome writes one durable
statement, recovery scans every maintenance interval, timer batches of 100 sent as one
wave). The numbers behind them are in the report's tables. Keyed by figure-key prefix; the
first matching prefix wins."""

_CONSUMER = (
    "Where the time goes: a consumer claims per SQS receive, so at most 10 rows per claim "
    "statement (`Consumer._claim_rows`, `sql.CLAIM_MESSAGES`), and writes outcomes in "
    "batches of whatever has finished by then, about one receive's worth "
    "(`Consumer._write`, `sql.FINISH_ATTEMPTS`, a durable commit each). Per job the "
    "Python side builds a TaskContext, two prometheus observations and an INFO "
    "`job_succeeded` line. A message that arrives before the timer's dispatch commits "
    "(the timer sends, then commits) makes the consumer wait for that commit, about one "
    "SQS call: in `sql.WAIT_FOR_DISPATCH_COMMIT`, or inside `sql.CLAIM_MESSAGES` itself "
    "when the claim meets the timer's row locks (compare their mean ms in the statement "
    "tables; in the end-to-end run the wait was the largest database time per job). What "
    "would close it: (0) do not wait on the timer: when a claim misses or would block "
    "(`SET LOCAL lock_timeout`, or `NOWAIT`), give those messages a visibility of a "
    "second and move on with the rest of the batch; (1) claim "
    "the messages of both receivers of a queue in one statement (a claimer thread fed by "
    "the receivers), so claims carry 20+ rows; (2) let the completer wait a few "
    "milliseconds for a fuller batch when its previous write was small, which halves the "
    "durable commits per job; (3) per-batch rather than per-job log lines and metric "
    "calls; (4) more consumers only help while the SQS server has headroom (see the "
    "`raw.sqs.path` rows)."
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
        "The raw ceiling runs two statements per 100 jobs (a claim and a completion) in a "
        "bare loop. tock runs three kinds (the timer's fair claim: `DUE_LEVELS`, "
        "`DUE_TENANTS_*` and `CLAIM_TENANTS`; the consumer's "
        "`CLAIM_MESSAGES`, its `FINISH_ATTEMPTS`), and the consumer's batches are bounded by "
        "its free handler slots (a claim covers several receives, up to "
        "`TOCK_CLAIM_BATCH_SIZE`; an outcome commit waits up to `TOCK_GROUP_COMMIT_MS` for "
        "company), so at concurrency 8 a claim carries at most 8 rows. Timer and consumer "
        "also share one Python process (one GIL) here, and the per-job Python work "
        "(context, tracking, metrics, a log line) is in this figure: compare the database "
        "time per statement (tables above) with the wall time per job. "
        "`sql.FINISH_ATTEMPTS` also pays the foreign-key check of `tock_attempts.job_id`. "
        "What would close it further: completion without the foreign key, and fewer Python "
        "objects per job; a higher consumer concurrency raises the batch sizes. " + _CONSUMER
    ),
    "latency.simultaneous": (
        "The `latency.simultaneous.floor` figure is the p99 the raw SQS path alone allows "
        "for this many jobs on this server: LocalStack serves a few hundred messages a second "
        "from one Python process, so 100 ms for 500 jobs cannot be reached against it by any "
        "pipeline; the ratio to that floor is the number to read here. The due-to-dispatch "
        "column is the timer's share: it claims 100 jobs, sends them as one wave of 10 "
        "SendMessageBatch calls, commits, and only then claims the next 100. Against real "
        "SQS, what would bring p99 under 100 ms: overlap the next claim with the current "
        "wave's sends (two dispatch transactions in flight, or several timers, which SKIP "
        "LOCKED already allows), plus the consumer changes listed for end to end."
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
        "claim probes `tock_jobs_due_idx` once per priority level (`sql.DUE_LEVELS`), walks the "
        "tenants with due work through `tock_jobs_fair_idx` (`sql.DUE_TENANTS_*`, one probe "
        "per tenant) and takes each one's oldest rows (`sql.CLAIM_TENANTS`), stopping at "
        "the first future row, so pending rows cost it one B-tree level per 100x; a real "
        "slowdown with size would point at dead index entries left by claimed rows (vacuum "
        "`tock_jobs` more often: a per-table `autovacuum_vacuum_scale_factor`)."
    ),
    "fair.": (
        "Fair share is the timer's: B's jobs get half of each batch from the first pass "
        "after they are due, so their lag is about two passes of the timer against one "
        "with no backlog; with both dispatch threads busy on A's rows, a pass of B waits "
        "for a pass of A to commit first. A's rate is the claim alone (SQS is a sink); "
        "the fair claim costs one probe per tenant and level, `sql.DUE_TENANTS_*`."
    ),
    "dispatch.": (
        "The timer holds its claim transaction open across one wave of sends (by design: a "
        "crash before commit loses nothing) and claims the next batch only after it "
        "commits; overlapping the next claim with the current sends would close the gap."
    ),
}
