"""`tock`: one command for operators. Each subcommand lives in its own module and registers
itself with `add_parser(subparsers)`; exit codes: 0 ok, 1 operation refused (e.g. not
found, invalid transition), 2 bad usage or configuration, 3 a service is unavailable or
too busy to answer in time (nothing was written: try again)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence

from cli import audit
from cli.arguments import add_common, positive_seconds
from cli.output import print_json
from shared.core.errors import (
    ConfigError,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    Retryable,
    TockError,
    TransportError,
)
from shared.runtime.command_line import Parser
from shared.runtime.settings import unknown_variables

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13
"""What a Unix tool's shell reports when the reader went away (SIGPIPE): `tock jobs | head`."""

Command = Callable[[argparse.Namespace], int]


HISTORY_MIGRATION = "0007_history.sql"
"""Creates the history tables only: finished rows already in tock_jobs move afterwards."""

MIGRATE_DESCRIPTION = (
    "Apply the database migrations this version of tock ships and the database lacks, in "
    "order, each in its own transaction, recorded in the table tock_migrations. It is "
    "idempotent and safe to re-run, also from several places at once (an advisory lock "
    "makes concurrent runs wait for each other): it applies only what is missing, and "
    "with nothing missing it changes nothing. --dry-run lists the applied and pending "
    "migrations and applies nothing. Upgrading past "
    f"{HISTORY_MIGRATION} only creates the history tables: the finished jobs (succeeded, "
    "dead, cancelled) already in tock_jobs are then moved to the history in the background "
    "by the retention loop of a timer of this version, in bounded batches "
    "(TOCK_RETENTION_BATCH_SIZE rows per transaction, every TOCK_RETENTION_INTERVAL_SECONDS), "
    "never holding a long lock. "
    "0010, 0011 and 0014 build an index on tock_jobs each, holding back writes to it for about a "
    "second per million unfinished jobs: with a large backlog, apply them at a quiet moment.")


def _migrate(args: argparse.Namespace) -> int:
    from cli.connect import check_reachable
    from shared.runtime.settings import CommonSettings
    from shared.store.migrate import migrate

    settings = CommonSettings.load(**({"database_url": args.database_url}
                                      if args.database_url else {}))
    check_reachable(settings.database_url, migrated=False)
    if args.dry_run:
        return _list_migrations(settings.database_url, as_json=args.json)
    from shared.store.migrate import MigrationBlocked

    def waiting(name: str, holders: str) -> None:
        print(f"tock: migration {name} is waiting for a lock on its tables ({holders}); "
              "rolled back, trying again (writers are not held up meanwhile)",
              file=sys.stderr)

    try:
        applied = migrate(settings.database_url, lock_timeout=args.lock_timeout,
                          waiting=waiting)
    except MigrationBlocked as exc:
        print(f"tock: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print_json({"applied": applied, "moves_history": HISTORY_MIGRATION in applied
                    and applied[0] != "0001_core.sql"})
        return EXIT_OK
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied
                                                    else "; database is up to date"))
    if HISTORY_MIGRATION in applied and applied[0] != "0001_core.sql":
        print("next: a timer of this version moves the finished jobs still in tock_jobs to "
              "the history in the background, in bounded batches (TOCK_RETENTION_BATCH_SIZE "
              "rows per transaction; its tock_history_moved_total counts them)")
    return EXIT_OK


def _list_migrations(database_url: str, *, as_json: bool = False) -> int:
    """`tock migrate --dry-run`: what is applied and what is pending; applies nothing."""
    import psycopg

    from shared.store.errors import translated
    from shared.store.migrate import applied, available

    with translated(), psycopg.connect(database_url, autocommit=True,
                                       connect_timeout=5) as conn:
        done = applied(conn)
    shipped = [name for name, _ in available()]
    pending = [name for name in shipped if name not in done]
    if as_json:
        print_json({"applied": done, "pending": pending,
                    "not_shipped": [name for name in done if name not in shipped]})
        return EXIT_OK
    for name in done:
        print(f"applied  {name}" + ("" if name in shipped
                                    else "  (not shipped with this version of tock)"))
    for name in pending:
        print(f"pending  {name}")
    print(f"{len(done)} applied, {len(pending)} pending: "
          + ("`tock migrate` applies them (nothing was applied now)" if pending
             else "the database is up to date"))
    return EXIT_OK


def _launch(command: str, argv: list[str]) -> int:
    """`tock timer ...` and `tock consumer ...`: the process's own command line, options
    and --help included, handed over whole (argparse's REMAINDER drops a leading option)."""
    if command == "timer":
        from timer_service.__main__ import main as timer_main

        return timer_main(argv, prog="tock timer")
    from consumer.__main__ import main as consumer_main

    return consumer_main(argv, prog="tock consumer")


def build_parser() -> argparse.ArgumentParser:
    from shared.store.migrate import GIVE_UP_AFTER_SECONDS, LOCK_TIMEOUT_SECONDS

    parser = Parser(
        prog="tock", description="tock: a distributed job scheduler on Postgres and SQS. "
        "Settings come from TOCK_* environment variables.")
    parser.add_argument("--version", action="version", version=f"tock {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply database migrations (idempotent)",
                       description=MIGRATE_DESCRIPTION)
    add_common(p)
    p.add_argument("--dry-run", "--list", dest="dry_run", action="store_true",
                   help="list the applied and pending migrations; apply nothing")
    def lock_timeout(text: str) -> float:
        # Past the give-up time it could never be retried (and past Postgres's own bound,
        # 2147483.647 s, the server refuses it only once a migration is pending).
        value = positive_seconds(text)
        if value > GIVE_UP_AFTER_SECONDS:
            raise argparse.ArgumentTypeError(
                f"must be at most {GIVE_UP_AFTER_SECONDS:g} seconds (when a migration gives "
                f"up), got {text}")
        return value

    p.add_argument("--lock-timeout", type=lock_timeout, default=LOCK_TIMEOUT_SECONDS,
                   metavar="SECONDS",
                   help="how long a migration waits for a lock on a table before it rolls "
                        "back and tries again, so that writers queued behind it wait no "
                        f"longer (default {LOCK_TIMEOUT_SECONDS:g}; it gives up after "
                        f"{GIVE_UP_AFTER_SECONDS:g} s, exit 3)")
    p.set_defaults(func=_migrate)

    # Listed for --help; main() hands their arguments over before parsing.
    sub.add_parser("timer", help="run a timer instance (python -m timer_service)")
    sub.add_parser("consumer", help="run a consumer (python -m consumer --tasks MODULE)")

    for register in _extensions():
        register(sub)
    return parser


def _extensions() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommand modules beyond the process launchers, in `tock --help` order: jobs
    (enqueue, jobs, show), bulk (retry, cancel), cluster (stats, workers, dashboard),
    schedules, tenants and limits."""
    from cli import bulk, cluster, jobs, limits, schedules, tenants

    return [jobs.add_parser, bulk.add_parser, cluster.add_parser, schedules.add_parser,
            tenants.add_parser, limits.add_parser]


def _refuse_options_before_the_command(parser: argparse.ArgumentParser,
                                       argv: list[str]) -> None:
    """`tock --database-url URL stats` read the URL as the command ("invalid choice"), and
    `tock --json stats` said --json was unrecognized: each command takes its options after
    its name. Say that, with the command line that works."""
    if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version"):
        return
    commands = next(a.choices for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction))
    command = next((a for a in argv if a in commands), None)
    option = argv[0].split("=", 1)[0]
    if option not in _options_of(commands.values()):
        parser.error(f"no tock command takes {option}: tock --help lists the commands, "
                     "tock COMMAND --help their options")
    if command is not None:
        rest = [a for a in argv if a != command]
        parser.error(f"{option} goes after the command: tock {command} {' '.join(rest)}")
    parser.error(f"{option} goes after a command, as in: tock stats {option} ...")


def _innermost(parser: argparse.ArgumentParser,
               args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand `args` went through (`tock schedules list`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _innermost(chosen, args)
    return parser


def _note_unknown_settings() -> None:
    """Name each TOCK_* variable no tock setting has, as the processes warn at start."""
    for name, near in unknown_variables(os.environ):
        print(f"tock: note: {name} is set but no tock setting has that name"
              + (f"; did you mean {near}?" if near else ""), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    # The pool's own reconnection warnings would repeat, several lines each, what the one
    # error line below says.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["timer"], ["consumer"]):
        return _launch(argv[0], argv[1:])
    parser = build_parser()
    _refuse_options_before_the_command(parser, argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        # Named by the parser of the action they followed, with its usage, not tock's.
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    func: Command = args.func
    if not getattr(args, "warns_of_settings", False):  # a process logs them itself
        _note_unknown_settings()
    try:
        audit.configure_from_environment()
        return func(args)
    except BrokenPipeError:
        # The reader (head, less) has gone: stop quietly, as Unix tools do. What is left in
        # stdout's buffer goes nowhere, or its flush at exit would raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (InvalidInput, ConfigError) as exc:
        print(f"tock: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (JobNotFound, InvalidTransition) as exc:
        print(f"tock: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (Retryable, TransportError) as exc:
        # Unavailable, or too busy to answer in time (a statement or lock timeout, a
        # deadlock): nothing was written, and trying again may work; not a refusal.
        print(f"tock: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except TockError as exc:  # anything else tock raised: its message, not a traceback
        print(f"tock: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_REFUSED


def _version() -> str:
    """The installed package's version (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tock")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _options_of(parsers: Iterable[argparse.ArgumentParser]) -> set[str]:
    """Every option string of these parsers and of their subcommands'."""
    found: set[str] = set()
    for each in parsers:
        for action in each._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                found |= _options_of(action.choices.values())
    return found


if __name__ == "__main__":
    sys.exit(main())
