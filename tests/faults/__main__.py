"""`python -m tests.faults --profile full [--out docs/faults.md] [--scenario kill9 ...]`:
run the fault scenarios against servers started here, print the table, write markdown.
Exit status 1 if any invariant was violated."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.profiles import PROFILES
from tests.faults.report import markdown, text_table
from tests.faults.result import Result
from tests.faults.runner import HarnessError, run_scenario
from tests.faults.scenarios import SCENARIOS
from tests.faults.services import Services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--out", default="docs/faults.md", help="markdown report path")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                        help="run only these (repeatable; default: all)")
    parser.add_argument("--seed", type=int, help="random seed (default: a new one)")
    parser.add_argument("--logs", help="keep process logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    names = args.scenario or list(SCENARIOS)
    work = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="tock-faults-"))
    print(f"fault suite, profile {profile.name}: logs under {work}", file=sys.stderr)
    started = time.monotonic()
    services = Services.start(work / "services")
    results: list[Result] = []
    try:
        for name in names:
            t0 = time.monotonic()
            print(f"--- {name}: {SCENARIOS[name].title}", file=sys.stderr)
            try:
                result = run_scenario(services, SCENARIOS[name], profile, work, args.seed)
            except HarnessError as exc:
                print(f"    harness error: {exc}", file=sys.stderr)
                raise
            results.append(result)
            print(result.summary(), file=sys.stderr)
            print(f"    ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    finally:
        services.stop()
    seconds = time.monotonic() - started
    print(text_table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(results, profile, seconds))
    print(f"\nwritten {out} ({seconds:.0f} s); logs under {work}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
