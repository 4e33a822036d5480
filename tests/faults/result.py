"""The invariant checker's findings: a `Violation` of one invariant, and the `Result` of a
scenario (counts, notes, violations) with its printed summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    invariant: str
    """lost | slow_drain | double_success | stale_overwrite | unexplained_duplicate |
    unexpected_exit | phantom_run | unfinished_run"""
    job_id: int | None
    detail: str

    def __str__(self) -> str:
        job = f" job {self.job_id}" if self.job_id is not None else ""
        return f"[{self.invariant}]{job}: {self.detail}"


@dataclass
class Result:
    scenario: str
    jobs: int
    succeeded: int = 0
    states: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    duplicate_runs: int = 0
    duplicates_explained: int = 0
    duplicates_unexplained: int = 0
    lost: int = 0
    double_successes: int = 0
    stale_overwrites: int = 0
    kills: int = 0
    self_exits: int = 0
    restarts: int = 0
    attempt_outcomes: dict[str, int] = field(default_factory=dict)
    drain_seconds: float | None = None
    drain_bound: float = 0.0
    fault_end: float = 0.0
    run_log_bad_lines: int = 0
    attempts_without_run: int = 0
    notes: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    log_dir: str = ""
    logs: str = field(default="", repr=False)
    """The process logs' report (`Cluster.log_report`), printed when a test fails."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_invariant(self) -> dict[str, int]:
        return dict(Counter(v.invariant for v in self.violations))

    def summary(self, limit: int = 25) -> str:
        drain = "not drained" if self.drain_seconds is None else f"{self.drain_seconds:.1f} s"
        lines = [
            f"scenario {self.scenario}: {'OK' if self.ok else 'FAILED'}",
            f"  jobs {self.jobs}, succeeded {self.succeeded}, states {self.states}",
            f"  handler runs {self.runs}, duplicate runs {self.duplicate_runs} "
            f"(explained {self.duplicates_explained}, unexplained "
            f"{self.duplicates_unexplained})",
            f"  lost {self.lost}, double successes {self.double_successes}, stale overwrites "
            f"{self.stale_overwrites}",
            f"  processes: killed by the suite {self.kills}, exited on their own "
            f"{self.self_exits}, restarts {self.restarts}",
            f"  drain after the fault: {drain} (bound {self.drain_bound:.0f} s)",
            f"  attempt rows by outcome: {self.attempt_outcomes}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.violations:
            lines.append(f"  violations by invariant: {self.by_invariant()}")
            lines += [f"    {v}" for v in self.violations[:limit]]
            if len(self.violations) > limit:
                lines.append(f"    ... and {len(self.violations) - limit} more")
        lines.append(f"  logs: {self.log_dir}")
        return "\n".join(lines)
