"""report.md from a results.json: tables of every figure next to its ceiling, the latency,
scale and memory tables, where the time goes, and what would close each gap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.gaps import gap_note

GROUP_TITLES = {
    "raw-postgres": "Raw Postgres ceilings", "raw-sqs": "Raw SQS ceilings",
    "enqueue": "Enqueue", "dispatch": "Dispatch", "end-to-end": "End to end",
    "cpu": "CPU per job (the in-memory runs)",
    "peers": "Peers on the same Postgres (no SQS on either side)",
    "latency": "Latency", "burst": "Burst", "scale": "Scale",
    "fairness": "Fair share (tenant B's 100 jobs behind tenant A's backlog)",
    "memory": "Memory",
    "table health": "Table health (HOT updates, dead tuples)",
}


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100 or digits == 0:
            return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.2f}"
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


COUNT_UNITS = frozenset({"rows", "jobs", "calls", "updates", "messages"})
"""Units of things counted: a whole number prints as one ("19 rows", not "19.00 rows")."""


def _value(f: dict[str, Any]) -> str:
    value = f["value"]
    if f["unit"] in COUNT_UNITS and isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{_num(value, 2)} {f['unit']}"


def _met(flag: bool | None) -> str:
    return {True: "yes", False: "**no**", None: ""}[flag]


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def render(data: dict[str, Any], plots: list[str]) -> str:
    env = data["environment"]
    figures = data["figures"]
    lines = [
        f"# tock benchmark report ({data['profile']} profile)", "",
        f"Run {data['started_at']} of tock {env.get('versions', {}).get('tock', 'unknown')}, "
        f"{(data.get('duration_seconds') or 0) / 60:.1f} minutes, "
        f"on {env.get('cpu_count')} x {env.get('cpu_model')}, load average "
        f"{_load(env.get('load_average_start'))} at the start and "
        f"{_load(env.get('load_average_end'))} at the end. "
        f"Postgres: {env.get('postgres_mode')}; SQS: {env.get('sqs_server')}.", "",
        "Every figure sits next to a raw ceiling measured on the same services in the same "
        "run; on a shared, noisy machine the ratios are the numbers to read, not the "
        "absolute rates.", "",
    ]
    for err in data.get("errors", []):
        lines += [f"**Phase failed: {err['phase']}**: `{err['error']}` (its figures are "
                  "missing; see results.json for the traceback).", ""]
    lines += ["## Targets", ""]
    targets = [f for f in figures if f["target"]]
    lines += _table(["figure", "value", "ceiling", "ratio", "target", "met"], [
        [f["label"], _value(f), _ceiling(f),
         _num(f["ratio"], 2), f["target"], _met(f["met"])] for f in targets])
    lines += ["## Every figure", ""]
    for group, title in GROUP_TITLES.items():
        mine = [f for f in figures if f["group"] == group]
        if not mine:
            continue
        lines += [f"### {title}", ""]
        lines += _table(["figure", "value", "ceiling", "ratio", "note"], [
            [f["label"], _value(f), _ceiling(f),
             _num(f["ratio"], 2), _note(f)] for f in mine])
    lines += _latency(data["series"])
    lines += _burst(figures)
    lines += _scale(data["series"])
    lines += _memory(figures)
    lines += _hotspots(data.get("hotspots", {}))
    lines += _gaps(figures, env)
    lines += _phases(data["series"].get("phases", []))
    lines += _environment(env)
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _note(f: dict[str, Any]) -> str:
    samples = f.get("samples") or []
    if len(samples) < 2:
        return str(f["note"])
    shown = "best of " + " / ".join(_num(float(s), 2) for s in samples)
    return f"{f['note']}; {shown}" if f["note"] else shown


def _load(values: Any) -> str:
    return " / ".join(f"{v:.2f}" for v in values) if values else "?"


def _ceiling(f: dict[str, Any]) -> str:
    if f["ceiling"] is None:
        return ""
    return f"{_num(f['ceiling_value'], 2)} (`{f['ceiling']}`)"


def _latency(series: dict[str, Any]) -> list[str]:
    rows = []
    for key, label in (("latency_simultaneous", "jobs due at one instant"),
                       ("latency_steady", "steady rate"), ("burst", "burst, due in one second")):
        s = series.get(key)
        if not s:
            continue
        d = s["due_to_start"]
        if key == "latency_steady":
            name = (f"{label} {s['rate_per_s']:.0f}/s "
                    f"(achieved {s['achieved_rate_per_s']:.0f}/s)")
        else:
            name = f"{s['jobs']:,} {label}"
        dispatch = s.get("due_to_dispatch", {}).get("p99_ms")
        rows.append([name, str(s.get("consumers")), _num(d["p50_ms"], 1), _num(d["p95_ms"], 1),
                     _num(d["p99_ms"], 1), _num(d["max_ms"], 1), _num(dispatch, 1)])
    if not rows:
        return []
    headers = ["load", "consumers", "p50 ms", "p95 ms", "p99 ms", "max ms",
               "due-to-dispatch p99 ms"]
    return ["## Latency (due-to-start = started_at - run_at, from Postgres)", "",
            *_table(headers, rows)]


def _burst(figures: list[dict[str, Any]]) -> list[str]:
    by_key = {f["key"]: f for f in figures}
    keys = ("burst.dispatch_rate", "burst.rate_while_dispatching", "burst.rate", "dispatch.sqs")
    if not all(k in by_key for k in keys):
        return []
    dispatch, during, overall, alone = (by_key[k] for k in keys)
    return [
        f"Burst: the timer dispatched the herd at {_num(dispatch['value'])} jobs/s (alone, "
        f"with no consumer running, it managed {_num(alone['value'])} jobs/s); consumers "
        f"finished {_num(during['value'])} jobs/s while it did, and the whole burst drained "
        f"at {_num(overall['value'])} jobs/s, {_num(overall['ratio'], 2)} of the raw "
        "send + receive + delete path of the same SQS server. Sends and receives share that "
        "one server: when the finished curve in burst_drain.png runs parallel to the "
        "dispatched one, the timer's sends are the bound; when it lags far behind until "
        "dispatch ends, the consumers were starved of SQS requests.", ""]


def _scale(series: dict[str, Any]) -> list[str]:
    points = series.get("scale")
    if not points:
        return []
    smallest = points[0]

    def ratio(value: float, base: float | None) -> str:
        return _num(value / base, 2) if base else "-"

    rows = []
    for p in points:
        # The claim on the smallest size's base table measured beside this size's, as
        # the `scale.claim.base_at.*` figures and the target use (results from before it
        # was measured per size compare with the smallest size's own claim).
        base = p.get("base_claim_jobs_per_s", smallest["claim_jobs_per_s"])
        rows.append([
            f"{p['pending_rows']:,}", _num(p["claim_jobs_per_s"]), _num(base),
            ratio(p["claim_jobs_per_s"], base), _num(p["dispatch_jobs_per_s"]),
            ratio(p["dispatch_jobs_per_s"], smallest["dispatch_jobs_per_s"]),
            f"{p['heap_bytes'] / 2**20:,.1f}", f"{p['index_bytes'] / 2**20:,.1f}",
            f"{p['indexes'].get('tock_jobs_due_idx', 0) / 2**20:,.1f}"])
    n = f"{smallest['pending_rows']:,}"
    headers = ["pending rows", "claim jobs/s", f"base claim jobs/s ({n} rows, beside)",
               "claim / base", "dispatch jobs/s", f"dispatch / at {n}", "heap MB",
               "all indexes MB", "due index MB"]
    return ["## Scale", "",
            f"Each size's claim is compared with the claim on a {n}-row base table measured "
            "loop for loop beside it (the `scale.claim.base_at.*` figures, which the target "
            "uses), the median of each side's loops; at "
            f"{n} both tables hold the same rows, so that row's distance from 1.00 is the "
            "loops' own spread. Dispatch is compared with the timer's pass at "
            f"{n} (`scale.dispatch.base`).", "",
            *_table(headers, rows)]


def _memory(figures: list[dict[str, Any]]) -> list[str]:
    mine = [f for f in figures if f["group"] == "memory"]
    if not mine:
        return []
    return ["## Memory", "",
            "RSS of the timer and consumer processes, sampled every 0.5 s while the latency "
            "and burst phases ran (backlog 0 -> burst -> 0); see memory_rss.png.", ""]


def _hotspots(h: dict[str, Any]) -> list[str]:
    if not h:
        return []
    lines = ["## Where the time goes", ""]
    if h.get("steps_ms_per_job"):
        lines += [f"cProfile over every thread of an in-process timer + consumer running "
                  f"{h.get('memory_run_jobs')} jobs over the in-memory transport "
                  "(cumulative time includes waiting on Postgres; profiling slows Python).", ""]
        lines += _table(["step", "function", "calls", "ms per job"], [
            [s["step"], f"`{s['function']}`", _num(s["calls"]), _num(s["ms_per_job"], 3)]
            for s in h["steps_ms_per_job"]])
    if h.get("self_time_top"):
        lines += ["Functions by self time (idle waits left out):", ""]
        lines += _table(["function", "calls", "self ms per job"], [
            [f"`{r['function']}`", _num(r["calls"]), _num(r["self_ms_per_job"], 4)]
            for r in h["self_time_top"][:12]])
    tx = h.get("transaction_ms")
    if tx:
        lines += [f"The same 10-row UPDATE costs {_num(tx['tock_transaction'], 2)} ms through "
                  "`Database.transaction()` (shared/store/database.py: pool check on "
                  "checkout, BEGIN, statement, COMMIT) and "
                  f"{_num(tx['autocommit_statement'], 2)} ms as one autocommit statement on "
                  "the same server, both with a durable commit.", ""]
    if h.get("enqueue_steps_ms_per_call"):
        lines += [f"`schedule()` one by one under cProfile ({h.get('enqueue_calls')} calls):", ""]
        lines += _table(["step", "function", "calls", "ms per call"], [
            [s["step"], f"`{s['function']}`", _num(s["calls"]), _num(s["ms_per_job"], 3)]
            for s in h["enqueue_steps_ms_per_call"]])
    for key, title in (("statements_e2e", "Database time per statement, end to end with the "
                                          "most consumers (pg_stat_statements)"),
                       ("statements_burst", "Database time per statement, burst"),
                       ("statements_memory", "Database time per statement, in-memory run")):
        if h.get(key):
            lines += [f"{title}:", ""]
            lines += _table(["statement", "calls", "mean ms", "rows", "ms per job"], [
                [f"`{s['statement']}`", _num(s["calls"]), _num(s["mean_ms"], 3),
                 _num(s["rows"]), _num(s["ms_per_job"], 3)] for s in h[key][:10]])
    return lines


def _gaps(figures: list[dict[str, Any]], env: dict[str, Any]) -> list[str]:
    missed = [f for f in figures if f["met"] is False]
    lines = ["## Shortfalls and what would close them", ""]
    if not missed:
        return [*lines, "Every target was met in this run.", ""]
    by_key = {f["key"]: f for f in figures}
    # Figures that share an explanation (1, 2 and 4 consumers) are listed together, each
    # under its own target.
    by_note: dict[str, list[dict[str, Any]]] = {}
    for f in missed:
        by_note.setdefault(gap_note(f["key"], by_key, env), []).append(f)
    for note, group in by_note.items():
        by_target: dict[str, list[dict[str, Any]]] = {}
        for f in group:
            by_target.setdefault(str(f["target"]), []).append(f)
        measured = " ".join(
            "; ".join(f"**{f['label']}**: {_value(f)}"
                      + (f" (ratio {f['ratio']:.2f})" if f["ratio"] is not None else "")
                      for f in mine) + f"; target {target}."
            for target, mine in by_target.items())
        lines += [f"- {measured}", "", f"  {note}", ""]
    return lines


def _phases(phases: list[dict[str, Any]]) -> list[str]:
    if not phases:
        return []
    return ["## Phases and machine load", "",
            "Other work on the machine shows up here: compare a figure with its ceiling only "
            "when the load around both was similar.", "",
            *_table(["phase", "seconds", "1-minute load average at its end"],
                    [[p["phase"], _num(p["seconds"], 1), _num(p["load_average_1m"], 2)]
                     for p in phases])]


def _environment(env: dict[str, Any]) -> list[str]:
    lines = ["## Environment", ""]
    lines += _table(["", ""], [
        ["CPU", f"{env.get('cpu_count')} x {env.get('cpu_model')}"],
        ["memory", f"{env.get('memory_total_gb')} GB"],
        ["platform", str(env.get("platform"))], ["python", str(env.get("python"))],
        *[[k, str(v)] for k, v in env.get("versions", {}).items()]])
    lines += ["Postgres settings (durable: nothing traded for speed):", ""]
    lines += _table(["setting", "value"],
                    [[k, f"`{v}`"] for k, v in env.get("postgres_settings", {}).items()])
    return lines


def write(data: dict[str, Any], out: Path, plots: list[str]) -> Path:
    path = out / "report.md"
    path.write_text(render(data, plots))
    return path
