"""Results bookkeeping, statement naming and the report, on made-up numbers."""

from __future__ import annotations

import pytest

from bench.hotspots import statement_name
from bench.results import Results, validate
from bench.runner import render
from shared.store import jobs_sql as sql


def _results() -> Results:
    r = Results("tiny", "2026-01-01T00:00:00+00:00")
    r.environment = {"cpu_count": 2, "cpu_model": "test", "postgres_settings": {"fsync": "on"}}
    r.raw("raw.sqs.cycle", "raw-sqs", "cycle", 1000.0, "msgs/s")
    r.ratio("e2e.c1", "end-to-end", "end to end, 1", 850.0, "jobs/s", "raw.sqs.cycle",
            minimum=0.8)
    r.ratio("e2e.c2", "end-to-end", "end to end, 2", 500.0, "jobs/s", "raw.sqs.cycle",
            minimum=0.8)
    return r


def test_ratio_and_target() -> None:
    r = _results()
    good, bad = r.figure("e2e.c1"), r.figure("e2e.c2")
    assert good is not None and bad is not None
    assert good.ratio == pytest.approx(0.85)
    assert good.met is True
    assert bad.met is False


def test_unknown_ceiling_and_duplicates_are_refused() -> None:
    r = _results()
    with pytest.raises(KeyError, match=r"raw\.nope"):
        r.ratio("x", "g", "x", 1.0, "jobs/s", "raw.nope")
    with pytest.raises(ValueError, match="twice"):
        r.raw("e2e.c1", "end-to-end", "again", 1.0, "jobs/s")


def test_a_ceiling_measured_twice_keeps_its_best_sample_and_ratios_follow() -> None:
    r = _results()
    r.raw("raw.sqs.cycle", "raw-sqs", "cycle", 400.0, "msgs/s")  # a noisy, lower sample
    assert r.figure("raw.sqs.cycle").value == 1000.0
    r.raw("raw.sqs.cycle", "raw-sqs", "cycle", 1700.0, "msgs/s")
    r.finalize()
    cycle, e2e = r.figure("raw.sqs.cycle"), r.figure("e2e.c1")
    assert cycle.samples == [1000.0, 400.0, 1700.0]
    assert cycle.value == 1700.0
    assert e2e.ceiling_value == 1700.0
    assert e2e.ratio == pytest.approx(850 / 1700)
    assert e2e.met is False
    assert validate(r.to_json()) == []


def test_validate_finds_broken_files() -> None:
    data = _results().to_json()
    assert validate(data) == []
    data["figures"][1]["ratio"] = 0.1
    assert any("ratio does not match" in p for p in validate(data))
    del data["series"]
    assert validate(data) == ["missing key 'series'"]


def test_nan_is_written_as_null(tmp_path) -> None:
    r = _results()
    r.raw("latency.x", "latency", "x", float("nan"), "ms")
    assert r.to_json()["figures"][-1]["value"] is None


def test_report_lists_targets_and_shortfalls(tmp_path) -> None:
    r = _results()
    r.series["throughput_vs_consumers"] = [{"consumers": 1, "jobs_per_s": 850.0},
                                           {"consumers": 2, "jobs_per_s": 500.0}]
    r.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    assert "## Targets" in report
    row = "| end to end, 2 | 500 jobs/s | 1,000 (`raw.sqs.cycle`) | 0.50 | ratio >= 0.8 | **no** |"
    assert row in report
    assert "- **end to end, 2**" in report
    assert (tmp_path / "throughput_vs_consumers.png").stat().st_size > 0


def test_statement_names_follow_pg_stat_statements_normalisation() -> None:
    # What pg_stat_statements shows for FINISH_ATTEMPTS-like text: every parameter and
    # constant as $n, comments kept.
    shown = sql.CLAIM_MESSAGES.replace("%(worker)s", "$1").replace("'running'", "$2")
    for n, name in enumerate(("now", "lease_seconds", "ids", "tokens", "default_max_attempts",
                              "default_timeout_seconds"), start=3):
        shown = shown.replace(f"%({name})s", f"${n}")
    assert statement_name(shown) == "sql.CLAIM_MESSAGES"
    assert statement_name("SELECT 1").startswith("SELECT $")


def test_a_failed_phase_is_recorded_and_the_run_goes_on() -> None:
    import io

    from bench.progress import Progress
    from bench.runner import _phase

    r = _results()
    progress = Progress(2, stream=io.StringIO())
    ran = []

    def broken() -> None:
        raise RuntimeError("timer died")

    _phase(progress, r, "dispatch", broken)
    _phase(progress, r, "latency", lambda: ran.append(True))
    assert ran == [True]
    assert [e["phase"] for e in r.errors] == ["dispatch"]
    assert "RuntimeError: timer died" in r.errors[0]["error"]
    assert [p["phase"] for p in progress.phases] == ["latency"]
    data = r.to_json()
    assert validate(data) == []
    assert data["errors"][0]["phase"] == "dispatch"


def _cpu_results() -> Results:
    """An in-memory run's figures as `pipeline.database_work` records them, with the raw
    claim + completion ceiling's better second sample arriving afterwards."""
    from bench.pipeline import CpuUse, _cpu_figures

    class _Ctx:
        def __init__(self, results: Results) -> None:
            self.results = results
            self.progress = type("P", (), {"say": staticmethod(lambda _text: None)})()

    r = Results("full", "2026-01-01T00:00:00+00:00")
    r.environment = {"cpu_count": 2, "cpu_model": "test", "postgres_settings": {}}
    r.raw("raw.pg.claim_complete_b100", "raw-postgres", "claim + complete", 10_000.0, "jobs/s")
    r.raw("raw.pg.cpu_claim_complete_b100", "raw-postgres", "per CPU s", 20_000.0,
          "jobs/cpu-s")
    r.ratio("dbwork.memory.c8", "end-to-end", "memory, 8", 2_000.0, "jobs/s",
            "raw.pg.claim_complete_b100", minimum=0.5)
    # 10,000 jobs: 250 us of this process's CPU and 200 us of Postgres's per job.
    _cpu_figures(_Ctx(r), 8, 10_000, CpuUse(python=2.5, postgres=2.0))  # type: ignore[arg-type]
    r.raw("raw.pg.claim_complete_b100", "raw-postgres", "claim + complete", 12_000.0, "jobs/s")
    return r


def test_the_cores_figure_uses_the_ceiling_the_report_prints(tmp_path) -> None:
    from bench.runner import finalize

    r = _cpu_results()
    cores = r.figure("cpu.memory.c8.cores")
    assert cores is not None
    assert cores.value == pytest.approx(450e-6 * 5_000)  # provisional: the first sample
    finalize(r)
    assert r.figure("raw.pg.claim_complete_b100").value == 12_000.0
    assert cores.value == pytest.approx(450e-6 * 6_000)
    assert "x 6,000 jobs/s" in cores.note and "12,000" in cores.note
    assert cores.target == "<= 2 (this machine's cores)" and cores.met is False

    # A results.json written before the ceiling's last sample (as older runs were) renders
    # with the final ceiling too.
    stale = _cpu_results()
    stale.finalize()  # ratios only: the cores figure keeps its provisional value
    stale.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    assert "| 2.70 cores |" in report and "x 6,000 jobs/s" in report
    assert "2.25 cores" not in report


def test_bs_share_comes_from_as_rate_over_the_same_window() -> None:
    from bench.fair_sqs import _share_note, finalize

    # A's rate over the 3 s from B's arrival (700) is not the window's: B's share there is
    # 1 - 600/750, not 1 - 700/750.
    assert _share_note(600.0, 750.0).startswith("B's jobs are 20% of these")
    r = _results()
    r.raw("fair.sqs.a_rate_before", "fairness", "before", 740.0, "jobs/s")
    r.raw("fair.sqs.a_rate_during", "fairness", "during", 679.0, "jobs/s")
    r.raw("fair.sqs.a_rate_b_window", "fairness", "in B's window", 668.6, "jobs/s")
    fleet = r.raw("fair.sqs.fleet_rate_during", "fairness", "A and B", 744.3, "jobs/s",
                  note="B's 100 jobs are 9% of these")
    finalize(r)
    assert fleet.note.startswith("B's jobs are 10% of these")


def test_shortfalls_show_each_figures_own_target(tmp_path) -> None:
    r = _results()
    r.raw("raw.pg.claim_complete_b100", "raw-postgres", "claim + complete", 10_000.0, "jobs/s")
    r.ratio("dbwork.memory.c8", "end-to-end", "memory, 8", 2_000.0, "jobs/s",
            "raw.pg.claim_complete_b100", minimum=0.5)
    r.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    shortfall = next(line for line in report.splitlines() if "**end to end, 2**" in line
                     and line.startswith("- "))
    assert ("**end to end, 2**: 500 jobs/s (ratio 0.50); target ratio >= 0.8. "
            "**memory, 8**: 2,000 jobs/s (ratio 0.20); target ratio >= 0.5.") in shortfall


def test_the_cpu_notes_follow_the_run(tmp_path) -> None:
    from bench.runner import finalize

    r = _cpu_results()
    finalize(r)
    r.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    # 250 us x 2,000 jobs/s of the process; + 2,000 / 5,000 jobs per CPU s of Postgres.
    assert "tock's process used 0.50 of a core at concurrency 8" in report
    assert "tock and Postgres together 0.90 of the machine's 2 cores" in report
    assert "0.65 of a core" not in report and "neither CPU- nor" not in report
    assert "the `cores` figures put its rate at 2.7 cores, and the machine has 2" in report
    assert "(167 us in this run)" in report


def test_scale_table_compares_each_size_with_its_own_base(tmp_path) -> None:
    r = _results()
    point = {"heap_bytes": 0, "index_bytes": 0, "indexes": {}, "dispatch_jobs_per_s": 100.0}
    r.series["scale"] = [
        {**point, "pending_rows": 10_000, "claim_jobs_per_s": 1_000.0,
         "base_claim_jobs_per_s": 900.0},
        {**point, "pending_rows": 5_000_000, "claim_jobs_per_s": 960.0,
         "base_claim_jobs_per_s": 1_200.0, "dispatch_jobs_per_s": 110.0}]
    r.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    assert ("| pending rows | claim jobs/s | base claim jobs/s (10,000 rows, beside) | "
            "claim / base | dispatch jobs/s | dispatch / at 10,000 |") in report
    assert "| 5,000,000 | 960 | 1,200 | 0.80 | 110 | 1.10 |" in report
    assert "| 10,000 | 1,000 | 900 | 1.11 | 100 | 1.00 |" in report


def test_counts_print_whole_and_notes_name_real_code(tmp_path) -> None:
    from bench.pipeline import DISPATCH_VS_CLAIM_NOTE

    r = _results()
    r.raw("health.tock_workers.dead", "table health", "dead tuples", 19.0, "rows")
    r.raw("raw.pg.claim_b100", "raw-postgres", "claim", 30_000.0, "jobs/s")
    r.ratio("dispatch.vs_claim", "dispatch", "timer dispatch vs the bare claim (batch 100)",
            2_600.0, "jobs/s", "raw.pg.claim_b100")
    r.hotspots["transaction_ms"] = {"tock_transaction": 1.5, "autocommit_statement": 1.2}
    r.write(tmp_path / "results.json")
    report = render(tmp_path).read_text()
    assert "| 19 rows |" in report
    assert DISPATCH_VS_CLAIM_NOTE in report
    assert "`Database.transaction()`" in report and "shared.db" not in report
