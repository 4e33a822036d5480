"""`python -m bench --profile quick|full|tiny [--out DIR]`: measure tock against raw
Postgres and SQS ceilings on services started for this run; see bench/README in the
project README's "Benchmarks" section."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.profiles import PROFILES

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark tock: throughput, latency, burst, scale and memory, each next "
                    "to the raw Postgres/SQS ceiling measured in the same run.")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick",
                        help="quick: make bench (<10 min); full: make bench-full; "
                             "tiny: a smoke run of the machinery")
    parser.add_argument("--out", type=Path,
                        help="output directory (default bench/results/<UTC timestamp>)")
    parser.add_argument("--render-only", type=Path, metavar="DIR",
                        help="rewrite report.md and the plots from DIR/results.json")
    args = parser.parse_args(argv)
    from bench import runner

    if args.render_only:
        if not (args.render_only / "results.json").is_file():
            print(f"bench: no results.json in {args.render_only}", file=sys.stderr)
            return 2
        print(runner.render(args.render_only))
        return 0
    out = args.out or RESULTS / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if out.exists() and any(out.iterdir()):
        print(f"bench: {out} exists and is not empty; choose another --out", file=sys.stderr)
        return 2
    try:
        runner.run(PROFILES[args.profile], out)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    errors = json.loads((out / "results.json").read_text()).get("errors", [])
    if errors:
        print(f"bench: {len(errors)} phase(s) failed: "
              + ", ".join(e["phase"] for e in errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
