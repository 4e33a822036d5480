"""`python -m timer_service`: run one timer instance until SIGTERM."""

from __future__ import annotations

import argparse
import sys

from shared.core.errors import ConfigError
from shared.runtime.logs import configure
from shared.runtime.settings import TimerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m timer_service",
        description="Dispatch due tock jobs to SQS and recover lost ones. "
                    "Settings come from TOCK_* environment variables.")
    parser.parse_args(argv)
    try:
        settings = TimerSettings.load()
    except ConfigError as exc:
        print(f"tock timer: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level, "timer")
    from timer_service.service import Timer

    timer = Timer(settings)
    timer.stop_flag.install_signal_handlers()
    if settings.health_port:
        from shared.runtime.health import HealthServer, timer_probes

        live, ready = timer_probes(timer)
        HealthServer(settings.health_port, live=live, ready=ready, process="timer").start()
    timer.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
