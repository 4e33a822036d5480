"""Peers on the same machine, in the same run: Procrastinate and PgQueuer (Postgres-only
Python job queues) each drain as many no-op jobs as tock's in-memory runs, at the same
concurrencies, on the same Postgres server. None goes through SQS, so the comparison is of
what all do: each job's database work and the Python around it (tock's also includes its
timer's dispatch). The peers run from their own virtualenv (`.bench-peers-venv`, made on
first use), so tock's environment never holds them."""

from __future__ import annotations

import json
import subprocess
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.pipeline import MEMORY_CONCURRENCY, Context

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".bench-peers-venv"


@dataclass(frozen=True)
class Peer:
    name: str
    """As the report names it."""
    key: str
    """In figure keys: peer.<key>.c8 ..."""
    requirements: tuple[str, ...]
    """Pinned, installed into the peers' virtualenv."""
    script: str
    """Beside this file: `setup URL N`, then `work URL CONCURRENCY` -> {"seconds": ...}."""
    succeeded: str
    """SQL: how many jobs the peer finished successfully."""
    how: str
    """The report's note on how it was run."""

    @property
    def version(self) -> str:
        return self.requirements[0].split("==")[1]


PEERS = (
    Peer("Procrastinate", "procrastinate", ("procrastinate==3.10.0",), "peer_procrastinate.py",
         "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
         "its defaults, an async task"),
    Peer("PgQueuer", "pgqueuer", ("pgqueuer==1.6.0", "asyncpg==0.32.0"), "peer_pgqueuer.py",
         "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
         "its defaults (asyncpg) but a batch no larger than the concurrency limit (its "
         "default 10 over a limit of 8 drained at a fifteenth of the rate), an async entrypoint"),
)


def measure(ctx: Context) -> None:
    """Each peer's jobs/s and Postgres CPU per job at each in-memory concurrency, and tock's
    in-memory figures over them."""
    jobs = ctx.profile.peer_jobs
    if not jobs:
        ctx.progress.say("  skipped in this profile")
        return
    python = _python(ctx)
    if python is None:
        return
    for peer in PEERS:
        for concurrency in MEMORY_CONCURRENCY:
            _drain(ctx, python, peer, jobs, concurrency)


def _drain(ctx: Context, python: Path, peer: Peer, jobs: int, concurrency: int) -> None:
    name = f"bench_peer_{peer.key}_{concurrency}"
    url = ctx.services.fresh_database(name)
    _call(python, peer, "setup", url, str(jobs), timeout=300)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")  # as tock's runs start from analyzed tables
    before = ctx.services.postgres_cpu_seconds()
    seconds = float(_call(python, peer, "work", url, str(concurrency),
                          timeout=120 + jobs / 20)["seconds"])
    after = ctx.services.postgres_cpu_seconds()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(peer.succeeded).fetchone()
    ctx.services.drop_database(name)
    if row is None or row[0] != jobs:
        raise RuntimeError(f"{peer.name} finished {row and row[0]} of {jobs} jobs")
    _figures(ctx, peer, concurrency, jobs, seconds,
             after - before if after is not None and before is not None else None)


def _figures(ctx: Context, peer: Peer, c: int, jobs: int, seconds: float,
             cpu: float | None) -> None:
    results = ctx.results
    key = f"peer.{peer.key}.c{c}"
    results.ratio(key, "peers", f"{peer.name} draining {jobs:,} no-op jobs, one worker, "
                  f"concurrency {c}", jobs / seconds, "jobs/s", "raw.pg.claim_complete_b100",
                  note=f"{peer.requirements[0]}, {peer.how}, the same Postgres")
    tock = results.figure(f"dbwork.memory.c{c}")
    if tock is not None:
        results.ratio(f"peer.vs_{peer.key}.c{c}", "peers",
                      f"tock over the in-memory transport / {peer.name}, concurrency {c}",
                      tock.value, "jobs/s", key,
                      note="tock's figure includes its timer's dispatch of each job")
    ctx.progress.say(f"  {peer.name}, concurrency {c}: {jobs / seconds:,.0f} jobs/s")
    if not cpu or cpu <= 0:
        return
    cpu_key = f"{key}.postgres"
    results.ratio(cpu_key, "peers", f"{peer.name}: jobs per CPU second of Postgres, "
                  f"concurrency {c}", jobs / cpu, "jobs/cpu-s", "raw.pg.cpu_claim_complete_b100",
                  note=f"{cpu / jobs * 1e6:.0f} us of Postgres CPU per job")
    tock_cpu = results.figure(f"cpu.memory.c{c}.postgres")
    if tock_cpu is not None:
        results.ratio(f"peer.vs_{peer.key}.c{c}.postgres", "peers",
                      f"tock's jobs per CPU second of Postgres / {peer.name}'s, "
                      f"concurrency {c}", tock_cpu.value, "jobs/cpu-s", cpu_key)


def _python(ctx: Context) -> Path | None:
    """The peers' virtualenv's Python, with every peer installed (made once per set of
    pins); None, said in the report, if they cannot be installed here (no package index):
    a missing peer is no failure of tock's."""
    python = VENV / "bin" / "python"
    pins = sorted(r for peer in PEERS for r in peer.requirements)
    marker = VENV / f".installed-{'+'.join(pins)}"
    versions = ctx.results.environment.setdefault("versions", {})
    if not marker.exists():
        ctx.progress.say(f"  installing {', '.join(pins)} into {VENV.name} (once) ...")
        try:
            venv.create(VENV, with_pip=True, clear=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", *pins],
                           check=True, timeout=600, capture_output=True, text=True)
        except (OSError, subprocess.SubprocessError) as exc:
            why = getattr(exc, "stderr", None) or str(exc)
            for peer in PEERS:
                versions[peer.key] = f"not measured: could not install {', '.join(pins)}"
            ctx.progress.say(f"  skipped: could not install the peers: "
                             f"{str(why).strip()[-300:]}")
            return None
        marker.touch()
    for peer in PEERS:
        versions[peer.key] = f"{peer.version} (the peers' virtualenv)"
    return python


def _call(python: Path, peer: Peer, *args: str, timeout: float) -> dict[str, Any]:
    """Run the peer's script; its last stdout line, a JSON object."""
    script = Path(__file__).with_name(peer.script)
    # -I: the script's folder (tock's bench modules) is not put on its sys.path.
    done = subprocess.run([str(python), "-I", str(script), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=str(ROOT))
    if done.returncode != 0:
        raise RuntimeError(f"{peer.name}'s script {args[0]} exited {done.returncode}: "
                           f"{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
