"""`python -m consumer --tasks ...`: the task modules come as a comma-separated list, as
repeats, or both (ECS passes its ConsumerTasksModule parameter as one argument), and a
module that cannot be imported, whatever it raises, stops the consumer with one line
naming it (exit 2), not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from consumer.__main__ import command_line, main, task_modules

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE_DB = "postgresql://tock@127.0.0.1:1/tock"
"""Nothing listens on port 1: past the imports, the database check stops the consumer
with exit 3 at once."""


@pytest.mark.parametrize(("value", "modules"), [
    ("myapp.tasks", ["myapp.tasks"]),
    ("myapp.tasks,myapp.reports", ["myapp.tasks", "myapp.reports"]),
    (" myapp.tasks , myapp.reports ", ["myapp.tasks", "myapp.reports"]),
])
def test_a_tasks_value_is_a_comma_separated_list_of_modules(value, modules):
    assert task_modules(value) == modules


@pytest.mark.parametrize("value", ["", " ", "myapp.tasks,", ",myapp.tasks", "a,,b", "a, ,b"])
def test_an_empty_module_name_is_refused_with_the_value(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--tasks", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --tasks: empty module name in {value!r}" in err


def _consumer(tmp_path: Path, *tasks: str) -> subprocess.CompletedProcess[str]:
    """Run the consumer with `tmp_path` importable and an unreachable database."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TOCK_DATABASE_URL": UNREACHABLE_DB,
           "TOCK_LOG_FORMAT": "human", "TOCK_LOG_LEVEL": "INFO"}
    args = [a for t in tasks for a in ("--tasks", t)]
    return subprocess.run([sys.executable, "-m", "consumer", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _module(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))


def _announcing(tmp_path: Path, name: str, kind: str) -> None:
    """A task module that registers `kind` and says on stderr that it was imported."""
    _module(tmp_path, name, f"""\
        import sys
        from consumer import task

        @task({kind!r})
        def handle(payload, ctx):
            pass

        print("imported {name}", file=sys.stderr)
        """)


def test_comma_separated_and_repeated_modules_are_all_imported_once(tmp_path):
    _announcing(tmp_path, "tasks_a", "a.one")
    _announcing(tmp_path, "tasks_b", "b.one")
    _announcing(tmp_path, "tasks_c", "c.one")
    done = _consumer(tmp_path, "tasks_a, tasks_b", "tasks_c,tasks_a")
    # Past the imports: the database check is what stops it.
    assert done.returncode == 3, done.stderr
    assert "TOCK_DATABASE_URL" in done.stderr
    for name in ("tasks_a", "tasks_b", "tasks_c"):
        assert done.stderr.count(f"imported {name}") == 1, done.stderr


def test_the_tock_script_imports_task_modules_from_the_working_directory(tmp_path):
    # `tock consumer`, unlike `python -m consumer`, does not put the directory on the path.
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _announcing(package, "tasks", "myapp.one")
    tock = Path(sys.executable).with_name("tock")
    env = {**os.environ, "TOCK_DATABASE_URL": UNREACHABLE_DB, "TOCK_LOG_FORMAT": "human"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(tock), "consumer", "--tasks", "myapp.tasks"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stderr  # past the import: the database check
    assert "imported tasks" in done.stderr


def _refused(done: subprocess.CompletedProcess[str], module: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("tock consumer:")]
    assert line.startswith(f"tock consumer: cannot import task module {module!r}: ")
    return line


def test_an_invalid_task_decoration_is_one_line_and_exit_2(tmp_path):
    _module(tmp_path, "bad_isolation", """\
        from consumer import task

        @task("b.x", isolation="proc")
        def handle(payload, ctx):
            pass
        """)
    line = _refused(_consumer(tmp_path, "bad_isolation"), "bad_isolation")
    assert "InvalidInput: isolation of kind 'b.x' must be 'thread' or 'process'" in line
    # Where in the task module, not where in tock.
    assert line.endswith(f"(at {tmp_path / 'bad_isolation.py'}:3)")


def test_a_kind_registered_twice_names_the_module_that_did_it(tmp_path):
    _announcing(tmp_path, "first", "b.dup")
    _announcing(tmp_path, "second", "b.dup")
    line = _refused(_consumer(tmp_path, "first,second"), "second")
    assert "InvalidInput: a handler for kind 'b.dup' is already registered" in line
    assert line.endswith(f"(at {tmp_path / 'second.py'}:4)")


def test_any_error_at_import_is_refused_the_same_way(tmp_path):
    _module(tmp_path, "raises", "raise RuntimeError('no config file')\n")
    _module(tmp_path, "needs", "import no_such_dependency_anywhere\n")
    _module(tmp_path, "broken", "def f(:\n")
    line = _refused(_consumer(tmp_path, "raises"), "raises")
    assert line.endswith(f"RuntimeError: no config file (at {tmp_path / 'raises.py'}:1)")
    line = _refused(_consumer(tmp_path, "needs"), "needs")
    assert "No module named 'no_such_dependency_anywhere'" in line
    line = _refused(_consumer(tmp_path, "broken"), "broken")
    assert "SyntaxError: " in line and "broken.py, line 1" in line


def test_the_traceback_is_logged_at_debug_level(tmp_path):
    _module(tmp_path, "raises", "raise RuntimeError('no config file')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TOCK_DATABASE_URL": UNREACHABLE_DB,
           "TOCK_LOG_FORMAT": "human", "TOCK_LOG_LEVEL": "DEBUG"}
    done = subprocess.run([sys.executable, "-m", "consumer", "--tasks", "raises"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "task_module_failed" in done.stderr and "Traceback" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(
        "tock consumer: cannot import task module 'raises': RuntimeError")


def test_a_handler_that_is_not_callable_is_refused_at_import(tmp_path):
    _module(tmp_path, "not_callable", """\
        from consumer import task

        task("nc")(5)
        """)
    line = _refused(_consumer(tmp_path, "not_callable"), "not_callable")
    assert "InvalidInput: the handler of kind 'nc' must be a function taking (payload, " \
           "ctx), not 5" in line


@pytest.mark.parametrize(("value", "says"), [
    ("", "argument --queues: empty queue name in ''"),
    (" ", "argument --queues: empty queue name in ' '"),
    ("default,", "argument --queues: empty queue name in 'default,'"),
    ("a b", "argument --queues: queue 'a b' is not a valid queue name"),
    ("default,a/b", "argument --queues: queue 'a/b' is not a valid queue name"),
])
def test_an_empty_or_invalid_queues_option_is_refused_naming_it(value, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--tasks", "demo.tasks", "--queues", value])
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(("value", "says"), [
    ("0", "argument --concurrency: must be from 1 to 1000 handlers at once, got 0"),
    ("1001", "must be from 1 to 1000 handlers at once, got 1001"),
    ("-3", "must be from 1 to 1000 handlers at once, got -3"),
    ("1_0", "argument --concurrency: '1_0' is not a whole number"),
    ("+5", "'+5' is not a whole number"),
    (" 7", "' 7' is not a whole number"),
    ("\uff15", "is not a whole number"),
    ("2.5", "'2.5' is not a whole number"),
])
def test_a_concurrency_not_a_plain_count_in_range_is_refused_naming_the_flag(value, says,
                                                                             capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--tasks", "demo.tasks", "--concurrency", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "TOCK_CONCURRENCY" not in err


def test_concurrency_takes_plain_digits():
    args = command_line().parse_args(["--tasks", "demo.tasks", "--concurrency", "32"])
    assert args.concurrency == 32


def test_a_kill_grace_too_long_for_a_process_kind_stops_it_before_postgres(tmp_path):
    _module(tmp_path, "isolated", """\
        from consumer import task

        @task("i.heavy", isolation="process")
        def handle(payload, ctx):
            pass
        """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TOCK_DATABASE_URL": UNREACHABLE_DB,
           "TOCK_LEASE_SECONDS": "3", "TOCK_HEARTBEAT_SECONDS": "1",
           "TOCK_VISIBILITY_TIMEOUT_SECONDS": "10", "TOCK_CREATE_QUEUES": "1"}
    env.pop("TOCK_KILL_GRACE_SECONDS", None)
    done = subprocess.run([sys.executable, "-m", "consumer", "--tasks", "isolated"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    # A settings error (2), found before the database is asked (it would say 3) and so
    # before any SQS queue is created.
    assert done.returncode == 2, done.stderr
    assert "kill_grace_seconds (5.0) must be under lease_seconds (3.0) with " \
           "process-isolated kind(s) ['i.heavy']" in done.stderr
    assert "TOCK_KILL_GRACE_SECONDS" in done.stderr and "Traceback" not in done.stderr


def test_a_process_handler_that_cannot_be_sent_stops_it_before_postgres(tmp_path):
    _module(tmp_path, "nested", """\
        from consumer import task

        def make():
            def inner(payload, ctx):
                pass
            return inner

        task("i.nested", isolation="process")(make())
        """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TOCK_DATABASE_URL": UNREACHABLE_DB,
           "TOCK_CREATE_QUEUES": "1"}
    done = subprocess.run([sys.executable, "-m", "consumer", "--tasks", "nested"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    # 2, not the database's 3: refused before Postgres is asked or a queue created.
    assert done.returncode == 2, done.stderr
    assert "the handler of kind 'i.nested'" in done.stderr
    assert "module-level functions" in done.stderr and "Traceback" not in done.stderr


def test_modules_that_register_no_handler_are_named_plainly(tmp_path):
    _module(tmp_path, "plain_a", "X = 1\n")
    done = _consumer(tmp_path, "plain_a", "json")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "tock consumer: no @task handlers registered by plain_a, json (a task module "
        "defines its handlers with @task, see the README's Writing tasks)")


def test_queues_may_be_repeated_as_tasks_may():
    args = command_line().parse_args(["--tasks", "demo.tasks", "--queues", "a",
                                      "--queues", "b,c"])
    assert args.queues == ["a", "b", "c"]


@pytest.mark.parametrize("argv", [
    ["--concurrency", "4", "--concurrency", "8"],
    ["--isolation", "thread", "--isolation", "process"],
])
def test_a_single_value_option_given_twice_is_refused(argv, capsys):
    # Kept last, `--concurrency 4 --concurrency 8` would run 8 where a script meant 4.
    with pytest.raises(SystemExit) as stopped:
        main(["--tasks", "demo.tasks", *argv])
    assert stopped.value.code == 2
    assert f"{argv[0]} was given more than once; it takes one value" in capsys.readouterr().err
