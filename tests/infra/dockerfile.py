"""A small Dockerfile reader: instructions with continuation lines joined, split by stage."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD/ENTRYPOINT/HEALTHCHECK CMD, else None."""
        text = re.sub(r"^(--\S+\s+)*(CMD\s+)?", "", self.args) if self.keyword == "HEALTHCHECK" \
            else self.args
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) \
            else None


def parse(path: Path) -> list[list[Instruction]]:
    """Stages of the Dockerfile, each a list of its instructions (FROM first)."""
    stages: list[list[Instruction]] = []
    logical = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, args = logical.partition(" ")
        instruction = Instruction(keyword.upper(), " ".join(args.split()))
        if instruction.keyword == "FROM":
            stages.append([])
        stages[-1].append(instruction)
        logical = ""
    return stages
