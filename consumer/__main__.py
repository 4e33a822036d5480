"""`python -m consumer --tasks myapp.tasks`: run a consumer until SIGTERM (exit 0), or until
a loop crashes (exit 70, so the orchestrator restarts it)."""

from __future__ import annotations

import argparse
import importlib
import sys

from shared.core.errors import ConfigError
from shared.runtime.logs import configure
from shared.runtime.settings import ConsumerSettings
from shared.runtime.startup import database_problem, report_missing_queues


def main(argv: list[str] | None = None, prog: str = "python -m consumer") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Receive tock jobs from SQS and run their handlers. "
                    "Settings come from TOCK_* environment variables.")
    parser.add_argument("--tasks", action="append", required=True, metavar="MODULE",
                        help="module whose @task handlers to run (repeatable)")
    parser.add_argument("--queues", help="comma-separated tock queues (default TOCK_QUEUES "
                                         "or 'default')")
    parser.add_argument("--concurrency", type=int, help="handlers run at once")
    parser.add_argument("--isolation", choices=["thread", "process"],
                        help="run handlers in threads of this process (default "
                             "TOCK_ISOLATION or 'thread') or in child processes, one job "
                             "each, killed when they overrun their timeout; for the kinds "
                             "whose @task does not set isolation=")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {}
    if args.queues:
        overrides["queues"] = [q.strip() for q in args.queues.split(",") if q.strip()]
    if args.concurrency is not None:
        overrides["concurrency"] = args.concurrency
    if args.isolation is not None:
        overrides["isolation"] = args.isolation
    try:
        settings = ConsumerSettings.load(**overrides)
    except ConfigError as exc:
        print(f"tock consumer: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level, "consumer")
    for module in args.tasks:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"tock consumer: cannot import task module {module!r}: {exc}",
                  file=sys.stderr)
            return 2
    from consumer.service import Consumer
    from consumer.tasks import registry

    if not registry.kinds():
        print(f"tock consumer: no @task handlers registered by {args.tasks}", file=sys.stderr)
        return 2
    problem = database_problem(settings.database_url)
    if problem:
        print(f"tock consumer: {problem[1]}", file=sys.stderr)
        return problem[0]
    consumer = Consumer(settings, registry, task_modules=args.tasks)
    report_missing_queues(consumer.pipe.transport, settings.queues)
    consumer.stop_flag.install_signal_handlers()
    if settings.health_port:
        from shared.runtime.health import HealthServer

        HealthServer(settings.health_port, live=consumer.supervisor.live,
                     ready=consumer.supervisor.ready, process="consumer").start()
    try:
        return consumer.run_forever()
    except ConfigError as exc:  # a handler process could not start
        print(f"tock consumer: {exc}", file=sys.stderr)
        consumer.close()
        return 2


if __name__ == "__main__":
    sys.exit(main())
