"""Peers on the same machine, in the same run: Procrastinate (a Postgres-only Python job
queue) drains as many no-op jobs as tock's in-memory runs, at the same concurrencies, on
the same Postgres server. Neither goes through SQS, so the comparison is of what both do:
each job's database work and the Python around it (tock's also includes its timer's
dispatch). Procrastinate runs from its own virtualenv (`.bench-peers-venv`, made on first
use), so tock's environment never holds it."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path
from typing import Any

import psycopg

from bench.pipeline import MEMORY_CONCURRENCY, Context

PROCRASTINATE = "procrastinate==3.10.0"
ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".bench-peers-venv"
SCRIPT = Path(__file__).with_name("peer_procrastinate.py")


def procrastinate(ctx: Context) -> None:
    """Procrastinate's jobs/s and Postgres CPU per job at each in-memory concurrency, and
    tock's in-memory figures over them."""
    jobs = ctx.profile.peer_jobs
    if not jobs:
        ctx.progress.say("  skipped in this profile")
        return
    python = _python(ctx)
    if python is None:
        return
    for concurrency in MEMORY_CONCURRENCY:
        name = f"bench_peer_procrastinate_{concurrency}"
        url = ctx.services.fresh_database(name)
        _call(python, "setup", url, str(jobs), timeout=300)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # as tock's runs start from analyzed tables
        before = ctx.services.postgres_cpu_seconds()
        seconds = float(_call(python, "work", url, str(concurrency),
                              timeout=120 + jobs / 20)["seconds"])
        after = ctx.services.postgres_cpu_seconds()
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM procrastinate_jobs "
                               "WHERE status = 'succeeded'").fetchone()
        ctx.services.drop_database(name)
        if row is None or row[0] != jobs:
            raise RuntimeError(f"Procrastinate finished {row and row[0]} of {jobs} jobs")
        _figures(ctx, concurrency, jobs, seconds,
                 after - before if after is not None and before is not None else None)


def _figures(ctx: Context, c: int, jobs: int, seconds: float, cpu: float | None) -> None:
    results = ctx.results
    key = f"peer.procrastinate.c{c}"
    results.ratio(key, "peers", f"Procrastinate draining {jobs:,} no-op jobs, one worker, "
                  f"concurrency {c}", jobs / seconds, "jobs/s", "raw.pg.claim_complete_b100",
                  note=f"{PROCRASTINATE}, its defaults, an async task, the same Postgres")
    if results.figure(f"dbwork.memory.c{c}") is not None:
        tock = results.figure(f"dbwork.memory.c{c}")
        assert tock is not None
        results.ratio(f"peer.vs_procrastinate.c{c}", "peers",
                      f"tock over the in-memory transport / Procrastinate, concurrency {c}",
                      tock.value, "jobs/s", key,
                      note="tock's figure includes its timer's dispatch of each job")
    ctx.progress.say(f"  Procrastinate, concurrency {c}: {jobs / seconds:,.0f} jobs/s")
    if not cpu or cpu <= 0:
        return
    cpu_key = f"{key}.postgres"
    results.ratio(cpu_key, "peers", f"Procrastinate: jobs per CPU second of Postgres, "
                  f"concurrency {c}", jobs / cpu, "jobs/cpu-s", "raw.pg.cpu_claim_complete_b100",
                  note=f"{cpu / jobs * 1e6:.0f} us of Postgres CPU per job")
    tock_cpu = results.figure(f"cpu.memory.c{c}.postgres")
    if tock_cpu is not None:
        results.ratio(f"peer.vs_procrastinate.c{c}.postgres", "peers",
                      f"tock's jobs per CPU second of Postgres / Procrastinate's, "
                      f"concurrency {c}", tock_cpu.value, "jobs/cpu-s", cpu_key)


def _python(ctx: Context) -> Path | None:
    """The peers' virtualenv's Python, with Procrastinate installed (made once); None, said
    in the report, if it cannot be installed here (no package index): a missing peer is no
    failure of tock's."""
    python = VENV / "bin" / "python"
    marker = VENV / f".{PROCRASTINATE}"
    versions = ctx.results.environment.setdefault("versions", {})
    if not marker.exists():
        ctx.progress.say(f"  installing {PROCRASTINATE} into {VENV.name} (once) ...")
        try:
            venv.create(VENV, with_pip=True, clear=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", PROCRASTINATE],
                           check=True, timeout=600, capture_output=True, text=True)
        except (OSError, subprocess.SubprocessError) as exc:
            why = getattr(exc, "stderr", None) or str(exc)
            versions["procrastinate"] = f"not measured: could not install {PROCRASTINATE}"
            ctx.progress.say(f"  skipped: could not install {PROCRASTINATE}: "
                             f"{str(why).strip()[-300:]}")
            return None
        marker.touch()
    versions["procrastinate"] = PROCRASTINATE.split("==")[1] + " (the peers' virtualenv)"
    return python


def _call(python: Path, *args: str, timeout: float) -> dict[str, Any]:
    """Run the peer script; its last stdout line, a JSON object."""
    # -I: the script's folder (tock's bench modules) is not put on its sys.path.
    done = subprocess.run([str(python), "-I", str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=str(ROOT))
    if done.returncode != 0:
        raise RuntimeError(f"peer script {args[0]} exited {done.returncode}: "
                           f"{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result

