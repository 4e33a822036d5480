"""The results table: printed by `python -m tests.faults` and written as markdown."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.faults.profiles import PROCESS_SETTINGS, Profile
from tests.faults.result import Result
from tests.faults.scenarios import SCENARIOS

COLUMNS = ["scenario", "jobs", "handler runs", "duplicate runs (explained / unexplained)",
           "lost", "double successes", "stale overwrites",
           "process restarts (killed / exited on their own)", "drain after the fault",
           "result"]


def rows(results: list[Result]) -> list[list[str]]:
    out = []
    for r in results:
        drain = "not drained" if r.drain_seconds is None else f"{r.drain_seconds:.1f} s"
        verdict = "pass" if r.ok else "FAIL: " + ", ".join(
            f"{k} {n}" for k, n in sorted(r.by_invariant().items()))
        out.append([r.scenario, str(r.jobs), str(r.runs),
                    f"{r.duplicate_runs} ({r.duplicates_explained} / "
                    f"{r.duplicates_unexplained})",
                    str(r.lost), str(r.double_successes), str(r.stale_overwrites),
                    f"{r.restarts} ({r.kills} / {r.self_exits})", drain, verdict])
    return out


def text_table(results: list[Result]) -> str:
    table = [COLUMNS, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(results: list[Result], profile: Profile, seconds: float) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Fault injection results",
        "",
        f"Profile `{profile.name}` ({profile.jobs} jobs per scenario, handlers of "
        f"{profile.ms[0]}-{profile.ms[1]} ms, 2 timers and 3 consumers of concurrency "
        f"{profile.concurrency}), run {when} in {seconds:.0f} s with "
        "`python -m tests.faults --profile " + profile.name + "`. Drain bound: "
        f"{profile.drain_bound:.0f} s after the fault ends.",
        "",
        "Process settings: " + ", ".join(f"`TOCK_{k}={v}`" for k, v in PROCESS_SETTINGS.items())
        + ".",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows(results)]
    out += ["", "Scenarios:", ""]
    for r in results:
        s = SCENARIOS.get(r.scenario)
        out.append(f"- `{r.scenario}`: {s.title if s else r.scenario}")
    out += ["", "A duplicate run is a handler run followed by another run of the same job "
            "(per the handlers' own run log). It is explained when the suite killed its "
            "process while it ran, or when it overlapped a Postgres crash or stop or a "
            "partition (the cases where the README allows a second run).", ""]
    failed = [r for r in results if not r.ok]
    if failed:
        out += ["## Violations", ""]
        for r in failed:
            out.append(f"### {r.scenario}")
            out.append("")
            out.append("```")
            out.append(r.summary(limit=15))
            out.append("```")
            out.append("")
    return "\n".join(out) + "\n"
