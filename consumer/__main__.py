"""`python -m consumer --tasks myapp.tasks`: run a consumer until SIGTERM (exit 0), or until
a loop crashes (exit 70, so the orchestrator restarts it).

`--tasks` takes one module or a comma-separated list, and may be repeated:
`--tasks a.tasks,b.tasks` is `--tasks a.tasks --tasks b.tasks` (a deployment parameter
holding a list passes it as one argument)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import sysconfig
import traceback
from pathlib import Path

from shared.core.errors import ConfigError
from shared.runtime.logs import configure, emit
from shared.runtime.settings import ConsumerSettings
from shared.runtime.startup import database_problem, report_missing_queues

log = logging.getLogger("tock.consumer")

_TOCK_DIRS = tuple(str(Path(__file__).resolve().parents[1] / d) + "/"
                  for d in ("consumer", "shared"))
_STDLIB = sysconfig.get_paths()["stdlib"] + "/"


def _task_code(filename: str) -> bool:
    """Whether a traceback frame is in code a task module brought (its own, a library's),
    not in tock's (which says where tock refused, not where the module asked for it) or
    in Python's import machinery."""
    if filename.startswith(("<", *_TOCK_DIRS)):
        return False
    return not filename.startswith(_STDLIB) or "-packages/" in filename


def task_modules(value: str) -> list[str]:
    """The modules of one `--tasks` value: comma-separated, blanks around names dropped;
    an empty name (`a,,b`, a trailing comma, an empty value) is refused."""
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"empty module name in {value!r} (give module names separated by commas, "
            "e.g. myapp.tasks,myapp.reports)")
    return names


def _import_problem(module: str, exc: Exception) -> str:
    """One line naming the module and what went wrong importing it; for an error raised
    while it ran (a bad @task, a duplicate kind), also where in the task code."""
    text = str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _task_code(f.filename)]
    if frames and not isinstance(exc, SyntaxError):  # a SyntaxError names its line
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return f"cannot import task module {module!r}: {text}"


def main(argv: list[str] | None = None, prog: str = "python -m consumer") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Receive tock jobs from SQS and run their handlers. "
                    "Settings come from TOCK_* environment variables.")
    parser.add_argument("--tasks", action="extend", type=task_modules, required=True,
                        metavar="MODULE",
                        help="module whose @task handlers to run; several: "
                             "comma-separated or repeated (a,b or --tasks a --tasks b)")
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
    modules: list[str] = list(dict.fromkeys(args.tasks))  # in order, each once
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever the module raises: one line, exit 2
            # The whole traceback, for TOCK_LOG_LEVEL=DEBUG.
            emit(log, "task_module_failed", logging.DEBUG, exc_info=True, module=module)
            print(f"tock consumer: {_import_problem(module, exc)}", file=sys.stderr)
            return 2
    from consumer.service import Consumer
    from consumer.tasks import registry

    if not registry.kinds():
        print(f"tock consumer: no @task handlers registered by {modules}", file=sys.stderr)
        return 2
    problem = database_problem(settings.database_url)
    if problem:
        print(f"tock consumer: {problem[1]}", file=sys.stderr)
        return problem[0]
    consumer = Consumer(settings, registry, task_modules=modules)
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
