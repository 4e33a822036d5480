"""`python -m timer_service`: run one timer instance until SIGTERM (exit 0), or until a
loop crashes (exit 70, so the orchestrator restarts it). A setting that cannot work
(TOCK_*, the probe server's port, the AWS region or endpoint) stops it at once with one
line (exit 2), as does an unusable database (exit 3; 2 for missing migrations)."""

from __future__ import annotations

import sys

from shared.core.errors import ConfigError
from shared.runtime.command_line import Parser
from shared.runtime.health import HealthServer
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import configure
from shared.runtime.settings import TimerSettings
from shared.runtime.startup import EXIT_CONFIG, database_problem, warn_unknown_settings


def main(argv: list[str] | None = None, prog: str = "python -m timer_service") -> int:
    parser = Parser(
        prog=prog,
        description="Dispatch due tock jobs to SQS and recover lost ones. "
                    "Settings come from TOCK_* environment variables.")
    parser.parse_args(argv)
    try:
        settings = TimerSettings.load()
        # Bound before Postgres or SQS is touched: a taken port is a setting to fix.
        health = (HealthServer(settings.health_port, process="timer")
                  if settings.health_port else None)
    except ConfigError as exc:
        print(f"tock timer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return _run(settings, health)
    finally:
        if health is not None:
            health.close()


def _run(settings: TimerSettings, health: HealthServer | None) -> int:
    configure(settings.log_format, settings.log_level, "timer")
    warn_unknown_settings()
    # A stop asked for while it starts (its probes answer from here on) is kept, and
    # honoured as soon as the timer exists: a clean exit, not a death by SIGTERM.
    early = StopFlag()
    early.install_signal_handlers()
    if health is not None:
        health.start()  # "starting" while the database is checked
    problem = database_problem(settings.database_url)
    if early.is_set():  # asked to stop meanwhile: what the check found no longer matters
        return 0
    if problem:
        print(f"tock timer: {problem[1]}", file=sys.stderr)
        return problem[0]
    from timer_service.service import Timer

    try:
        timer = Timer(settings)
    except ConfigError as exc:  # the AWS region or endpoint
        print(f"tock timer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    timer.stop_flag.install_signal_handlers()
    if early.is_set():
        timer.stop_flag.set()
    if health is not None:
        health.live, health.ready = timer.supervisor.live, timer.supervisor.ready
    return timer.run_forever()


if __name__ == "__main__":
    sys.exit(main())
