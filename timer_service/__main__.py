"""`python -m timer_service`: run one timer instance until SIGTERM (exit 0), or until a
loop crashes (exit 70, so the orchestrator restarts it)."""

from __future__ import annotations

import argparse
import sys

from shared.core.errors import ConfigError
from shared.runtime.logs import configure
from shared.runtime.settings import TimerSettings
from shared.runtime.startup import database_problem


def main(argv: list[str] | None = None, prog: str = "python -m timer_service") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Dispatch due tock jobs to SQS and recover lost ones. "
                    "Settings come from TOCK_* environment variables.")
    parser.parse_args(argv)
    try:
        settings = TimerSettings.load()
    except ConfigError as exc:
        print(f"tock timer: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level, "timer")
    problem = database_problem(settings.database_url)
    if problem:
        print(f"tock timer: {problem[1]}", file=sys.stderr)
        return problem[0]
    from timer_service.service import Timer

    timer = Timer(settings)
    timer.stop_flag.install_signal_handlers()
    if settings.health_port:
        from shared.runtime.health import HealthServer

        HealthServer(settings.health_port, live=timer.supervisor.live,
                     ready=timer.supervisor.ready, process="timer").start()
    return timer.run_forever()


if __name__ == "__main__":
    sys.exit(main())
