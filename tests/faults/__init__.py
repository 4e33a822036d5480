"""Fault injection: real timers and consumers against a Postgres and a LocalStack that this
suite starts (and kills, restarts, partitions) itself; an independent handler-run log; and
an invariant checker that compares the two.

    .venv/bin/python -m pytest -q -p no:randomly tests/faults       # small profile
    .venv/bin/python -m tests.faults --profile full --out docs/faults.md

Modules: `tasks` (the consumer's task module: writes the run log), `proxy` (a TCP proxy
that partitions consumers from Postgres), `services` (the suite's own Postgres and
LocalStack), `cluster` (the processes, restarted like an orchestrator would), `records`
(what the checker reads: fault windows, the run log, tock's tables), `invariants` (the
checker), `result` (its findings), `profiles` (the sizes and shared settings of a run),
`scenarios` (the faults), `runner` (running one scenario), `report` (the table).
"""
