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
