"""`python -m consumer --tasks myapp.tasks`: run a consumer until SIGTERM (exit 0), or until
a loop crashes (exit 70, so the orchestrator restarts it).

`--tasks` and `--queues` take one name or a comma-separated list, and may be repeated:
`--tasks a.tasks,b.tasks` is `--tasks a.tasks --tasks b.tasks` (a deployment parameter
holding a list passes it as one argument).

Before anything touches Postgres or SQS it checks what needs neither: its settings and
options, the task modules, the kill grace of process-isolated kinds, the probe port. Each
stops it with one line (exit 2); so does an AWS region or endpoint boto3 cannot use,
checked after the database (exit 3 while that is unreachable)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import sysconfig
import traceback
from pathlib import Path

from consumer.tasks import registry
from shared.core import validation
from shared.core.errors import ConfigError, InvalidInput
from shared.core.text import decimal_integer, shown
from shared.runtime.command_line import Parser
from shared.runtime.health import HealthServer
from shared.runtime.lifecycle import StopFlag
from shared.runtime.logs import configure, emit
from shared.runtime.settings import MAX_CONCURRENCY, ConsumerSettings
from shared.runtime.startup import (
    EXIT_CONFIG,
    database_problem,
    report_missing_queues,
    warn_unknown_settings,
)

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


def concurrency(value: str) -> int:
    """`--concurrency`: a whole number from 1 to MAX_CONCURRENCY in plain digits (not
    " 7", "1_0" or "+5", which int() would take)."""
    try:
        if value.startswith("+"):
            raise ValueError(value)
        number = decimal_integer(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{shown(value)} is not a whole number (plain digits, e.g. 8)") from None
    if not 1 <= number <= MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {MAX_CONCURRENCY} handlers at once, got {number}")
    return number


def queue_names(value: str) -> list[str]:
    """The queues of `--queues`: comma-separated, blanks around names dropped; an empty
    name (`a,,b`, an empty value) or an invalid one is refused."""
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"empty queue name in {value!r} (give queue names separated by commas, e.g. "
            "default,reports; leave --queues out for TOCK_QUEUES or 'default')")
    try:
        return [validation.queue(name) for name in names]
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _working_directory_importable() -> None:
    """Let --tasks name a module of the working directory however the consumer was started:
    `python -m consumer` puts the directory on the import path, the `tock` script does not.
    Last on the path, so it shadows no installed module. Handler processes inherit it."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)


def _import_problem(module: str, exc: Exception) -> str:
    """One line naming the module and what went wrong importing it; for an error raised
    while it ran (a bad @task, a duplicate kind), also where in the task code."""
    text = str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _task_code(f.filename)]
    if frames and not isinstance(exc, SyntaxError):  # a SyntaxError names its line
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return f"cannot import task module {module!r}: {text}"


def command_line(prog: str = "python -m consumer") -> Parser:
    """The consumer's command line."""
    parser = Parser(
        prog=prog,
        description="Receive tock jobs from SQS and run their handlers. "
                    "Settings come from TOCK_* environment variables.")
    parser.add_argument("--tasks", action="extend", type=task_modules, required=True,
                        metavar="MODULE",
                        help="module whose @task handlers to run; several: "
                             "comma-separated or repeated (a,b or --tasks a --tasks b)")
    parser.add_argument("--queues", action="extend", type=queue_names, metavar="QUEUES",
                        help="tock queues to receive from, comma-separated or repeated "
                             "(a,b or --queues a --queues b; default TOCK_QUEUES or "
                             "'default')")
    parser.add_argument("--concurrency", type=concurrency, metavar="N",
                        help="handlers run at once (default TOCK_CONCURRENCY or 8)")
    parser.add_argument("--isolation", choices=["thread", "process"],
                        help="run handlers in threads of this process (default "
                             "TOCK_ISOLATION or 'thread') or in child processes, one job "
                             "each, killed when they overrun their timeout; for the kinds "
                             "whose @task does not set isolation=")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m consumer") -> int:
    args = command_line(prog).parse_args(argv)
    overrides: dict[str, object] = {}
    if args.queues is not None:
        overrides["queues"] = list(dict.fromkeys(args.queues))  # in order, each once
    if args.concurrency is not None:
        overrides["concurrency"] = args.concurrency
    if args.isolation is not None:
        overrides["isolation"] = args.isolation
    try:
        settings = ConsumerSettings.load(**overrides)
    except ConfigError as exc:
        print(f"tock consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure(settings.log_format, settings.log_level, "consumer")
    warn_unknown_settings()
    modules: list[str] = list(dict.fromkeys(args.tasks))  # in order, each once
    _working_directory_importable()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever the module raises: one line, exit 2
            # The whole traceback, for TOCK_LOG_LEVEL=DEBUG.
            emit(log, "task_module_failed", logging.DEBUG, exc_info=True, module=module)
            print(f"tock consumer: {_import_problem(module, exc)}", file=sys.stderr)
            return EXIT_CONFIG
    if not registry.kinds():
        print(f"tock consumer: no @task handlers registered by {', '.join(modules)} (a task "
              "module defines its handlers with @task, see the README's Writing tasks)",
              file=sys.stderr)
        return EXIT_CONFIG
    try:
        _check_process_isolation(settings)
        # Bound before Postgres or SQS is touched: a taken port is a setting to fix.
        health = (HealthServer(settings.health_port, process="consumer")
                  if settings.health_port else None)
    except ConfigError as exc:
        print(f"tock consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # A stop asked for while it starts (its probes answer from here on) is kept, and
    # honoured as soon as the consumer exists: a clean exit, not a death by SIGTERM.
    early = StopFlag()
    early.install_signal_handlers()
    if health is not None:
        health.start()  # "starting" while the database is checked
    try:
        return _run(settings, modules, health, early)
    finally:
        if health is not None:
            health.close()


def _check_process_isolation(settings: ConsumerSettings) -> None:
    """For kinds that run in handler processes: the kill grace against the lease (for
    those that ask for it in a consumer whose own setting is threads; loading the settings
    checked the other case) and that each handler can be sent to a process. Before SQS or
    Postgres is touched: with TOCK_CREATE_QUEUES the queue would otherwise be created by a
    consumer that then refuses to start. The executor checks both again."""
    isolated = registry.process_isolated(settings.isolation)
    if not isolated:
        return
    problem = settings.kill_grace_problem(
        "isolation=process" if settings.isolation == "process"
        else f"process-isolated kind(s) {[t.kind for t in isolated]}")
    if problem:
        raise ConsumerSettings.refused(problem)
    from consumer.executor import check_sendable  # the executor's modules, only if needed

    check_sendable(isolated)


def _run(settings: ConsumerSettings, modules: list[str], health: HealthServer | None,
         early: StopFlag) -> int:
    problem = database_problem(settings.database_url)
    if early.is_set():  # asked to stop meanwhile: what the check found no longer matters
        return 0
    if problem:
        print(f"tock consumer: {problem[1]}", file=sys.stderr)
        return problem[0]
    from consumer.service import Consumer

    try:
        consumer = Consumer(settings, registry, task_modules=modules)
    except ConfigError as exc:  # the AWS region or endpoint
        print(f"tock consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    consumer.stop_flag.install_signal_handlers()
    if early.is_set():
        consumer.stop_flag.set()
    checking = f"starting: checking the SQS queue(s) {', '.join(settings.queues)}"
    if health is not None:
        health.live = consumer.supervisor.live
        health.ready = lambda: (False, checking)
    # After the probes answer (live, not ready): with SQS away this check waits out about
    # three call timeouts per queue, and a start-up probe that got no answer meanwhile
    # would have the platform restart the consumer for an outage, over and over.
    report_missing_queues(consumer.pipe.transport, settings.queues)
    if health is not None:
        health.ready = consumer.supervisor.ready
    try:
        code = consumer.run_forever()
    except ConfigError as exc:  # a handler process could not start; a worker id in use
        print(f"tock consumer: {exc}", file=sys.stderr)
        consumer.close()
        return EXIT_CONFIG
    if consumer.cut_short:
        # A thread is still blocked on the database (or SQS): the interpreter's exit would
        # wait for the pools it holds. Leave now; the leases expire and the timer recovers.
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
