"""Connections to Postgres: one `Database` (a connection pool) per process role, and a
`Listener` for LISTEN/NOTIFY. Errors leave this module classified (shared.store.errors).
Callers use the stores (`JobStore`, `ScheduleStore`, `OperatorStore`), not connections."""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from shared.core.errors import (
    ConnectionLost,
    DatabaseClosed,
    DatabaseReadOnly,
    DatabaseUnavailable,
    InvalidInput,
    Retryable,
)
from shared.store.errors import translated
from shared.store.pool_log import hush_pool_repeats
from shared.store.watchdog import Watchdog

Connection = psycopg.Connection[Any]

RECHECK_SECONDS = 0.5
DOWN_RECHECK_SECONDS = 1.0
"""While a pool that fails fast knows its database is down, it asks again at most this
often; calls in between fail at once with the last answer."""

SERVICE_IDLE_IN_TRANSACTION_SECONDS = 120.0
"""A timer or consumer that stops talking inside a transaction (frozen: SIGSTOP, a hung
host) would hold its row locks for as long as it is stopped: a due job claimed, a schedule
locked, skipped by every other timer meanwhile (11 minutes in a fault walkthrough). The
server ends such a session after this long, and the locks go with it. Well past the
longest a transaction waits on purpose: a dispatch's sends, SQS retries included (3 tries
of TOCK_SQS_CALL_TIMEOUT_SECONDS; the timer raises the bound with a longer one)."""

LINK_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5,
    # A server that vanished without closing the connection (a partition, a dead host) is
    # noticed within about 10 s, not after the kernel's default of many minutes.
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""libpq connection options of every tock connection."""

_INHERITED: list[ConnectionPool[Any]] = []
"""Pools a forked child inherited from its parent: kept referenced, never closed, because
their connections are the parent's sessions (closing one would end it for the parent)."""


class Database:
    """A lazily opened pool to one database.

    `check` tests each connection on checkout (one round trip), so a restarted Postgres
    costs the caller nothing; the services turn it off because their loops retry anyway,
    and instead the whole pool is checked once after a lost connection, so the other stale
    connections of a restarted server are dropped at once instead of failing one pass each.
    `autocommit` lets a single statement run as one round trip (no BEGIN/COMMIT);
    multi-statement work goes through `transaction()`. `synchronous_commit=False` is for
    writes whose loss in a database crash the fences already absorb (see the callers);
    otherwise the pool sets it on, whatever the server's default.

    `timeout` bounds the wait for a connection. The services use a short one: while
    Postgres is down, each loop pass fails fast and the next one (the supervisor retries
    within a second) asks for a new connection, so a loop works again within about a
    second of the server coming back. `reconnect_timeout` is how long the pool itself keeps
    reconnecting in the background (1 s, 2 s, 4 s ... apart) for a caller that waits.

    `setting` (the producer client's pools) makes the pool fail fast when the database
    cannot be used at all, with one `DatabaseUnavailable` that names the database (password
    redacted), libpq's reason and `setting`, the place to fix it: the first use connects
    once before the pool starts, so a wrong URL, password or host, or a server that is not
    running, fails within one connection attempt instead of after `timeout` of the pool's
    background retries (and their log lines). Once the pool has worked, a call waits up to
    `timeout` for a connection as before, riding out a restart; if that wait runs out the
    error says why (asked once more), and until a connection attempt succeeds again the
    following calls fail at once instead of each waiting out `timeout`. With
    `connect_at_open=False` (the dashboard's, which must start and answer its probes with
    the database down) `open()` does not connect first: the errors still say why.

    `planner`: server settings ("name=value") for every session of the pool, for a pool
    that runs one statement whose plan the planner gets wrong (the consumer's claims).
    """

    def __init__(self, url: str, *, max_size: int = 10, name: str = "tock", check: bool = True,
                 autocommit: bool = True, synchronous_commit: bool = True,
                 timeout: float = 30.0, reconnect_timeout: float = 300.0,
                 setting: str | None = None, answer_timeout: float | None = None,
                 answer_setting: str | None = None,
                 idle_in_transaction_seconds: float | None = None,
                 connect_at_open: bool = True, planner: Sequence[str] = ()) -> None:
        hush_pool_repeats()  # an outage's reconnection warnings, once per 30 s
        self.url = url
        self.name = name
        self.timeout = timeout
        self.max_size = max_size
        self.setting = setting
        self._connect_at_open = connect_at_open
        kwargs: dict[str, Any] = {"application_name": name, "autocommit": autocommit,
                                  **LINK_OPTIONS}
        kwargs.update(primary_only(url))
        # JIT compiling pays only for long analytical statements; tock's are short, and a
        # compile (0.2 s for the dashboard's counts at 1M jobs) would be most of their time.
        # Options in the URL come after ours, so they win.
        # `answer_timeout` (the producer client's): the server ends a statement past it, and
        # the watchdog a call whose server says nothing at all (shared.store.watchdog).
        self._answer_timeout = answer_timeout
        self._answer_setting = answer_setting
        # Durable pools pin synchronous_commit on: a server (or a database or role) set to off
        # would lose accepted jobs and recorded outcomes in a crash, silently.
        options = ["-c jit=off",
                   f"-c synchronous_commit={'on' if synchronous_commit else 'off'}",
                   *([f"-c statement_timeout={round(answer_timeout * 1000)}"]
                     if answer_timeout is not None else []),
                   *([f"-c idle_in_transaction_session_timeout="
                      f"{round(idle_in_transaction_seconds * 1000)}"]
                     if idle_in_transaction_seconds is not None else []),
                   *(f"-c {p}" for p in planner),
                   str(conninfo_to_dict(url).get("options") or "")]
        kwargs["options"] = " ".join(o for o in options if o)
        self._kwargs = kwargs
        self._check = check
        self._reconnect_timeout = reconnect_timeout
        self._closed = False
        self._fresh_pool()
        self.unavailable_at: float | None = None
        """When (time.monotonic()) a statement last found the database unavailable: the
        timer's rescuer gives workers a lease to renew after that (timer_service/rescuer.py)."""

    def _fresh_pool(self) -> None:
        """A new, unopened pool and the state that goes with it (at creation, and in a
        forked child, which must not use its parent's connections)."""
        self._pid = os.getpid()
        # A watchdog of its own too: a forked child's copy of its parent's would cut the
        # sockets of the parent's calls (shared with the parent) at their deadlines, and
        # its lock may have been held by a parent thread at the fork.
        self._watchdog = (Watchdog(self._answer_timeout) if self._answer_timeout is not None
                          else None)
        self.pool = ConnectionPool(
            self.url, min_size=1, max_size=self.max_size, open=False, name=self.name,
            check=self._check_connection if self._check else None,
            kwargs=self._kwargs, timeout=self.timeout,
            reconnect_timeout=self._reconnect_timeout,
        )
        if self._watchdog is not None:
            # The pool's check of its idle connections (`check()`, after a lost connection)
            # under the watchdog too: unwatched, a connection whose server or proxy hangs
            # would hold the recheck, and the connections it took out of the pool, for ever.
            self.pool.check_connection = self._check_connection  # type: ignore[method-assign]
        self._opened = False
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._asking = threading.Lock()
        self._answer: tuple[float, str | None] = (-math.inf, None)  # when asked, why unusable
        self._down = False
        self._rechecking = threading.Lock()
        self._sweeping = threading.Lock()

    def _forked(self) -> bool:
        """In a child forked after the pool was made: leave the parent's connections (and
        its pool, whose threads did not survive the fork) alone and start afresh. Two
        processes sharing one connection would read each other's replies."""
        if self._pid == os.getpid():
            return False
        _INHERITED.append(self.pool)
        self._fresh_pool()
        return True

    @classmethod
    def for_service(cls, url: str, *, name: str, max_size: int,
                    synchronous_commit: bool = True,
                    idle_in_transaction_seconds: float = SERVICE_IDLE_IN_TRANSACTION_SECONDS,
                    planner: Sequence[str] = ()) -> Database:
        """A pool for a timer or consumer loop (see above): no checkout checks, a 2 s wait
        for a connection, reconnection driven by the loops' own retries, and transactions
        the server ends when the process stops talking in one (see
        SERVICE_IDLE_IN_TRANSACTION_SECONDS)."""
        return cls(url, max_size=max_size, name=name, check=False, timeout=2.0,
                   reconnect_timeout=1.0, synchronous_commit=synchronous_commit,
                   idle_in_transaction_seconds=idle_in_transaction_seconds, planner=planner)

    def open(self) -> None:
        """Start the pool (idempotent); connections are made in the background. A pool that
        fails fast (`setting`) first connects once, and raises `DatabaseUnavailable` saying
        why if it cannot: the pool is not started then, and the next call tries again."""
        self._forked()
        # A producer's pool (`setting`) says it was closed; the services' loops may still be
        # winding down as their pools close, and treat the pool's error as an outage.
        if self._closed and self.setting is not None:
            raise DatabaseClosed(f"the {self.name} pool was closed (close() was called): "
                                 "make a new one to use the database again")
        if self._opened:
            return
        if self.setting is not None and self._connect_at_open:
            self._require_answer(time.monotonic())
        with self._lock:
            if not self._opened:
                self.pool.open(wait=False)
                self._opened = True

    def close(self) -> None:
        """Close the pool for good: later calls raise `DatabaseClosed`. In a forked child,
        the parent's connections are left alone."""
        self._forked()
        self._closed = True
        self.pool.close()
        if self._watchdog is not None:
            self._watchdog.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A pooled connection inside one transaction: commits on success, rolls back on
        error."""
        self._ready()
        held: list[Connection] = []
        try:
            with translated(), self.pool.connection() as conn, self._watching(conn), \
                    _dropped_if_read_only(conn):
                held.append(conn)  # before BEGIN: a cut there is the watchdog's doing too
                with conn.transaction():
                    yield conn
        except DatabaseReadOnly:
            # Refused, not lost: nothing was written; the connection is gone. Still an
            # outage for the rescuer: no worker can renew its lease meanwhile.
            self.unavailable_at = time.monotonic()
            raise
        except DatabaseUnavailable as exc:
            self.unavailable_at = time.monotonic()
            self._recheck()
            raise self._unanswered(held) or self._explained(exc) from exc.__cause__
        except Retryable as exc:
            raise self._timed_out(exc) from exc.__cause__

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection for single autocommit statements (one round trip each). A
        connection lost once it was handed out raises `ConnectionLost`: a statement sent on
        it may have committed (each one commits by itself)."""
        self._ready()
        held: list[Connection] = []
        try:
            with translated(), self.pool.connection() as conn, self._watching(conn), \
                    _dropped_if_read_only(conn):
                held.append(conn)
                yield conn
        except DatabaseReadOnly:
            # Refused, not lost: nothing was written; the connection is gone. Still an
            # outage for the rescuer: no worker can renew its lease meanwhile.
            self.unavailable_at = time.monotonic()
            raise
        except DatabaseUnavailable as exc:
            self.unavailable_at = time.monotonic()
            self._recheck()
            error = self._unanswered(held) or self._explained(exc)
            if held and not isinstance(error, ConnectionLost):
                error = ConnectionLost(str(error), error.sqlstate)
            raise error from exc.__cause__
        except Retryable as exc:
            raise self._timed_out(exc) from exc.__cause__

    def _watching(self, conn: Connection) -> contextlib.AbstractContextManager[None]:
        """The watchdog on `conn` for the block, if this pool has one."""
        if self._watchdog is None:
            return contextlib.nullcontext()
        return self._watchdog.watch(conn)

    def _check_connection(self, conn: Connection) -> None:
        """The pool's check on checkout (one round trip), under the watchdog: a hung server
        must not hold a caller in the check either.

        A connection that fails it is the first of a restarted server's stale ones: the
        rest are tested at once (`pool.check()` replaces every dead one). Otherwise the
        pool would throw them away one per checkout, sleeping 1, 2, 4 ... s between them,
        and a producer whose pool held seven idle connections waited out its whole 30 s
        for one though the server was back in a second (a fault walkthrough). When the
        watchdog cut the check (a hung server, each test a wait), they are tested on a
        thread of its own instead (`_recheck`)."""
        try:
            with self._watching(conn):
                ConnectionPool.check_connection(conn)
        except Exception:
            if self._watchdog is not None and self._watchdog.fired(conn):
                self._recheck()
            elif self._sweeping.acquire(blocking=False):  # not again from within the sweep
                try:
                    with contextlib.suppress(Exception):  # the pool logs what it drops
                        self.pool.check()
                finally:
                    self._sweeping.release()
            raise

    def _timed_out(self, exc: Retryable) -> Retryable:
        """A statement the server cancelled at this pool's statement_timeout, saying so
        (Postgres says only "canceling statement due to statement timeout")."""
        if self._watchdog is None or exc.sqlstate != "57014" or type(exc) is not Retryable:
            return exc
        where = (f"; a longer statement (a very large batch) needs a larger "
                 f"{self._answer_setting}" if self._answer_setting else "")
        return Retryable(f"{exc}: it ran longer than the call timeout, "
                         f"{self._watchdog.seconds:g} s (waiting for a lock another "
                         f"transaction holds, or a slow server); nothing was written{where}",
                         exc.sqlstate)

    def _unanswered(self, held: list[Connection]) -> DatabaseUnavailable | None:
        """The error of a call whose connection the watchdog cut, saying so; None if it
        did not."""
        if self._watchdog is None or not held or not self._watchdog.fired(held[0]):
            return None
        return ConnectionLost(
            f"the database at {redacted(self.url)} did not answer within "
            f"{self._watchdog.limit:g} s, though the connection stayed open (a hung server "
            "or proxy): the call was given up")

    def _ready(self) -> None:
        """Open the pool; while a pool that fails fast knows the database is down, raise at
        once unless it answers again."""
        self.open()
        if self._down:
            self._require_answer(time.monotonic())
            self._down = False

    def _require_answer(self, asked: float) -> None:
        """`DatabaseUnavailable`, saying why, unless the database answers (`_answer`)."""
        why = self._answer_since(asked)
        if why is not None:
            raise DatabaseUnavailable(self._unusable(why))

    def _answer_since(self, asked: float) -> str | None:
        """None if the database answers a connection made after `asked`, else why not.
        Callers asking together make one attempt, not one each (a concurrent caller's
        attempt counts), and while the database is down it is asked at most once per
        DOWN_RECHECK_SECONDS: calls in between get the last answer at once."""
        with self._asking:
            when, why = self._answer
            recent_failure = why is not None and time.monotonic() - when < DOWN_RECHECK_SECONDS
            if when < asked and not recent_failure:
                why = self._ask()
                self._answer = (time.monotonic(), why)
            return why

    def _ask(self) -> str | None:
        """None if a connection made like the pool's answers a query, else why not."""
        try:
            with psycopg.connect(self.url, **self._kwargs) as conn, self._watching(conn):
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return reason(exc)
        return None

    def _unusable(self, why: str) -> str:
        return f"cannot use the database at {redacted(self.url)}: {why} (check {self.setting})"

    def _explained(self, exc: DatabaseUnavailable) -> DatabaseUnavailable:
        """For a pool that fails fast, a wait for a connection that ran out as an error that
        says why (the pool only says it waited): the database, asked once more, or a pool
        whose connections were all in use the whole time."""
        if self.setting is None or not isinstance(exc.__cause__, PoolTimeout):
            return exc
        why = self._answer_since(time.monotonic())
        if why is None:
            stats = self.pool.get_stats()
            busy = stats.get("pool_size", 0) >= self.max_size and not stats.get("pool_available")
            return DatabaseUnavailable(
                f"no free connection to the database at {redacted(self.url)} within "
                f"{self.timeout:g} s: " + (
                    f"all {self.max_size} connections of the pool were in use (a larger "
                    "pool_max_size, TOCK_POOL_MAX_SIZE, or shorter transactions would help)"
                    if busy else "it answers again now (it may have just come back); try "
                    "again"))
        self._down = True
        return DatabaseUnavailable(f"{self._unusable(why)}; no connection within "
                                   f"{self.timeout:g} s")

    def _recheck(self) -> None:
        """After a lost connection, test the idle ones (at most twice a second) so a
        restarted server's stale connections are replaced together. A pool with a watchdog
        tests them on a thread of its own, one test at a time: each test of a hung server's
        connection waits out the watchdog, which must not hold the caller."""
        now = time.monotonic()
        if now - self._checked_at < RECHECK_SECONDS:
            return
        self._checked_at = now
        if self._watchdog is None:
            self._check_idle()
        elif self._rechecking.acquire(blocking=False):
            threading.Thread(target=self._check_idle, args=(self._rechecking,),
                             name="tock-db-recheck", daemon=True).start()

    def _check_idle(self, done: threading.Lock | None = None) -> None:
        try:
            with contextlib.suppress(Exception):  # the pool logs what it drops
                self.pool.check()
        finally:
            if done is not None:
                done.release()

    def listener(self, channel: str) -> Listener:
        """A dedicated connection that LISTENs on `channel`."""
        return Listener(self.url, channel)


class Listener:
    """LISTEN on one channel over its own connection; `wait(t)` returns on the first
    NOTIFY or after t seconds."""

    def __init__(self, url: str, channel: str) -> None:
        with translated():
            # On the primary, as the pools are: NOTIFYs are sent there, and a demoted server
            # (up, but no longer written to) would never wake the listener.
            self._conn = psycopg.connect(url, autocommit=True, application_name="tock-listen",
                                         **LINK_OPTIONS, **primary_only(url))
            self._conn.execute(f"LISTEN {channel}")  # a constant of ours, never user input

    def wait(self, timeout: float) -> bool:
        """True if a notification came within `timeout` seconds."""
        with translated():
            return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        self._conn.close()


def check_url(url: str) -> str:
    """`url` if libpq can use it (a postgresql:// URL or key=value pairs), else ValueError
    saying why, with any password left out. Blank is refused: libpq would read it as
    "every default" (a local socket, the OS user's name), not as the setting's default."""
    if not url.strip():
        raise ValueError("is empty; give a URL such as postgresql://user@host:port/database")
    if "://" in url and not url.startswith(("postgresql://", "postgres://")):
        scheme = url.split("://", 1)[0]
        raise ValueError(f"must be a postgresql:// URL, not {scheme}://")
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "not a libpq URL"
        reason = _without_passwords(reason, url)
        raise ValueError(f"is not a Postgres connection URL ({reason}); expected "
                         "postgresql://user@host:port/database") from None
    # libpq parses the port only when it connects, so a typo there would read as the
    # database being away (exit 3, retried forever) rather than as bad input.
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"has port {port[:20]!r}; a port is a number from 1 to 65535")
    return url


_URL_PASSWORD = re.compile(r"(://[^:/@]*:)([^@]*)@")
_PASSWORD_PAIR = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)")


def redacted(url: str) -> str:
    """`url` with its password replaced by ***, for messages: in a URL's user part or
    `?password=` parameter, or in a `password=` pair of the key=value form."""
    return _PASSWORD_PAIR.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url))


def _without_passwords(text: str, url: str) -> str:
    """libpq's parse error `text` about `url`, with no password in it: libpq quotes the
    whole URL, or the one token it could not decode (which may be the password)."""
    text = redacted(text.replace(url, redacted(url)))
    secrets = [m[2] for pattern in (_URL_PASSWORD, _PASSWORD_PAIR)
               for m in pattern.finditer(url) if m[2]]
    return re.sub(r'"[^"]*"', lambda m: '"***"' if any(s in m[0] for s in secrets)
                  else m[0], text)


def reason(exc: psycopg.Error) -> str:
    """Why a connection failed, in libpq's words on one line (connection refused, password
    authentication failed, a host that does not resolve ...)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()
             and not line.strip().startswith("Is the server running")]
    # libpq tries each address (and SSL, then not) and says the same of each: once is enough
    parts: dict[str, str] = {}
    for line in lines:
        parts.setdefault(line.removeprefix("connection failed: "), line)
    return "; ".join(parts.values()) or type(exc).__name__


_URL_REFUSED = ("invalid value for parameter", "unrecognized configuration parameter",
                "invalid connection option", "invalid sslmode value",
                "invalid integer value", "password authentication failed",
                "does not exist", "no pg_hba.conf entry",
                "server does not support SSL, but SSL was required")
"""What libpq or the server says of a URL whose settings, user, password or database are
wrong, in Postgres's English messages (another lc_messages reads as unavailable)."""


def url_refused(reason: str) -> bool:
    """Whether a failed connection's `reason` (see `reason`) says the URL itself is wrong,
    which waiting will not mend, rather than that the server is down or busy."""
    return any(words in reason for words in _URL_REFUSED)


_FULL = ("too many clients", "remaining connection slots are reserved")
"""What Postgres says when max_connections is reached (53300)."""
_READ_ONLY = ("session is read-only", "hot standby")
"""What libpq says of a server that answers but takes no writes (target_session_attrs)."""


def server_refusal(reason: str) -> str | None:
    """For a failed connection's `reason` from a server that is up but would not serve us,
    what to do about it (the URL is right: naming it as the culprit would mislead); None
    for any other reason."""
    if any(words in reason for words in _FULL):
        return ("it takes no more connections: max_connections is reached; other clients' "
                "idle connections, or a pooler, are the fix, not the URL")
    if any(words in reason for words in _READ_ONLY):
        return ("it answers but takes no writes: a standby, or default_transaction_read_only "
                "is on; tock needs the primary")
    return None


def primary_only(url: str) -> dict[str, Any]:
    """The libpq option that connects only to a server that takes writes (a URL naming
    several hosts finds the primary; a standby or a demoted primary is refused), unless
    the URL sets `target_session_attrs` itself."""
    if "target_session_attrs" in conninfo_to_dict(url):
        return {}
    return {"target_session_attrs": "read-write"}


def probe(url: str, timeout: float = 2.0) -> str | None:
    """None if the database answers a query within `timeout`, else why not, in words
    (a pool would only say it timed out). It asks as the pools connect (`primary_only`):
    a read-only server answers, but no pool could use it."""
    try:
        with psycopg.connect(url, connect_timeout=max(int(timeout), 1),
                             application_name="tock-probe", **primary_only(url)) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return reason(exc)
    return None


def connect(url: str, *, autocommit: bool = False) -> Connection:
    """One dedicated connection (migrations, tests)."""
    with translated():
        return psycopg.connect(url, autocommit=autocommit, application_name="tock")


@contextmanager
def _dropped_if_read_only(conn: Connection) -> Iterator[None]:
    """A connection whose server refused a write as read-only (a standby, or a primary
    demoted by a failover) is closed before the pool takes it back, so the pool replaces
    it with one to where the URL leads now, instead of handing it out again.
    The stores classify psycopg's error before it leaves their block (Store._execute),
    so both the raw error and tock's `DatabaseReadOnly` count."""
    try:
        yield
    except (psycopg.Error, DatabaseReadOnly) as exc:
        if exc.sqlstate == "25006":
            conn.close()
        raise


def adopt_connection(connection: object) -> Connection:
    """A caller's own connection, to run tock's statements in the caller's transaction:
    a psycopg 3 connection, or a SQLAlchemy Connection or Session on the psycopg driver."""
    if isinstance(connection, psycopg.Connection):
        return _not_in_pipeline(connection)
    inner: Any = connection
    if hasattr(inner, "connection") and callable(inner.connection):  # Session
        inner = inner.connection()
    raw = getattr(getattr(inner, "connection", None), "dbapi_connection", None)
    if isinstance(raw, psycopg.Connection):
        return _not_in_pipeline(raw)
    raise InvalidInput(
        "connection must be a psycopg 3 Connection, or a SQLAlchemy Connection or Session "
        f"using the psycopg driver (postgresql+psycopg://); got {type(connection).__name__}"
    )


def _not_in_pipeline(connection: Connection) -> Connection:
    """A connection tock cannot use is refused before anything is sent: closed, in an
    aborted transaction, or in pipeline mode (a statement's rows come only at the
    pipeline's next sync, so the jobs an insert made could not be returned)."""
    if connection.closed:
        raise InvalidInput("connection is closed")
    if connection.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise InvalidInput("connection is in pipeline mode (inside `with conn.pipeline()`), "
                           "where tock cannot read back the jobs it writes: call it outside "
                           "the pipeline block, in the same transaction")
    if connection.info.transaction_status == pq.TransactionStatus.INERROR:
        raise InvalidInput("connection's transaction has already failed (an earlier "
                           "statement in it raised), so Postgres ignores every statement "
                           "until it ends: roll it back, then call again")
    return connection
