"""What a run measured: figures next to their raw ceilings, the series behind the plots,
and the environment, written to `results.json`."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class Figure:
    """One measured number, and (when it has one) the raw ceiling it is compared with."""

    key: str
    group: str
    label: str
    value: float
    unit: str
    ceiling: str | None = None
    """Key of the raw figure this one is a ratio to."""
    ceiling_value: float | None = None
    ratio: float | None = None
    target: str | None = None
    """The issue's target, in words (for example `ratio >= 0.8`)."""
    met: bool | None = None
    note: str = ""
    minimum_ratio: float | None = None
    samples: list[float] = field(default_factory=list)
    """Raw ceilings are measured more than once per run; the ceiling is the best sample
    (noise from other work on the machine only ever lowers a measurement)."""


@dataclass
class Results:
    profile: str
    started_at: str
    environment: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    """Raw data behind the plots and tables (latencies, drain curve, RSS samples ...)."""
    hotspots: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    """Phases that failed: the run goes on without them and exits non-zero."""
    finished_at: str | None = None
    duration_seconds: float | None = None

    def add(self, figure: Figure) -> Figure:
        if any(f.key == figure.key for f in self.figures):
            raise ValueError(f"figure {figure.key!r} recorded twice")
        self.figures.append(figure)
        return figure

    def figure(self, key: str) -> Figure | None:
        return next((f for f in self.figures if f.key == key), None)

    def raw(self, key: str, group: str, label: str, value: float, unit: str,
            note: str = "") -> Figure:
        """A figure without a ceiling. A raw ceiling (group `raw-*`) recorded again gains a
        sample and keeps the best one."""
        existing = self.figure(key)
        if existing is not None and group.startswith("raw-") and existing.group == group:
            existing.samples.append(value)
            existing.value = max(existing.samples)
            return existing
        fig = Figure(key, group, label, value, unit, note=note)
        if group.startswith("raw-"):
            fig.samples.append(value)
        return self.add(fig)

    def ratio(self, key: str, group: str, label: str, value: float, unit: str, ceiling: str, *,
              minimum: float | None = None, note: str = "") -> Figure:
        """A figure compared with the raw figure `ceiling`; `minimum` is the target ratio."""
        base = self.figure(ceiling)
        if base is None:
            raise KeyError(f"ceiling {ceiling!r} has not been measured")
        target = f"ratio >= {minimum}" if minimum is not None else None
        fig = self.add(Figure(key, group, label, value, unit, ceiling, target=target,
                              note=note, minimum_ratio=minimum))
        self._compare(fig, base)
        return fig

    def finalize(self) -> None:
        """Recompute every ratio against its ceiling's final (best) value."""
        for fig in self.figures:
            if fig.ceiling is not None:
                base = self.figure(fig.ceiling)
                if base is not None:
                    self._compare(fig, base)

    @staticmethod
    def _compare(fig: Figure, base: Figure) -> None:
        fig.ceiling_value = base.value
        # A value written as null (NaN) in a loaded results.json has no ratio.
        fig.ratio = (fig.value / base.value
                     if fig.value is not None and base.value is not None and base.value > 0
                     else None)
        if fig.minimum_ratio is not None and fig.ratio is not None:
            fig.met = fig.ratio >= fig.minimum_ratio

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        """The results a results.json holds (see `validate`), to finalize and render again;
        keys this version does not know are left out."""
        known = {f.name for f in fields(Figure)}
        return cls(
            profile=data["profile"], started_at=data["started_at"],
            environment=data.get("environment", {}),
            figures=[Figure(**{k: v for k, v in f.items() if k in known})
                     for f in data["figures"]],
            series=data.get("series", {}), hotspots=data.get("hotspots", {}),
            errors=data.get("errors", []), finished_at=data.get("finished_at"),
            duration_seconds=data.get("duration_seconds"))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = _clean({
            "schema_version": SCHEMA_VERSION,
            "profile": self.profile,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_seconds": self.duration_seconds,
            "environment": self.environment,
            "figures": [asdict(f) for f in self.figures],
            "series": self.series,
            "hotspots": self.hotspots,
            "errors": self.errors,
        })
        return data

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, default=str) + "\n")


def _clean(value: Any) -> Any:
    """NaN and infinity are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


REQUIRED_KEYS = ("schema_version", "profile", "environment", "figures", "series")
FIGURE_KEYS = ("key", "group", "label", "value", "unit", "ceiling", "ceiling_value", "ratio",
               "target", "met", "note")


def validate(data: dict[str, Any]) -> list[str]:
    """Problems with a loaded results.json (empty when it is well formed)."""
    problems = [f"missing key {k!r}" for k in REQUIRED_KEYS if k not in data]
    if problems:
        return problems
    keys = {f.get("key") for f in data["figures"]}
    for fig in data["figures"]:
        missing = [k for k in FIGURE_KEYS if k not in fig]
        if missing:
            problems.append(f"figure {fig.get('key')!r} lacks {missing}")
            continue
        if not isinstance(fig["value"], int | float):
            problems.append(f"figure {fig['key']!r} has no numeric value")
        if fig["ceiling"] is not None:
            if fig["ceiling"] not in keys:
                problems.append(f"figure {fig['key']!r} names unknown ceiling {fig['ceiling']!r}")
            elif fig["ratio"] is not None and fig["ceiling_value"]:
                expected = fig["value"] / fig["ceiling_value"]
                if abs(expected - fig["ratio"]) > 1e-6 * max(1.0, abs(expected)):
                    problems.append(f"figure {fig['key']!r} ratio does not match its ceiling")
    return problems
