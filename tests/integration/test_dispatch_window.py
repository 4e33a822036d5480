"""The dispatch window: at most TOCK_DISPATCH_WINDOW jobs of a kind wait in SQS (sent, not
yet claimed); the rest wait in Postgres, where priority and fair share still order them,
and go out as consumers claim. Real timer and consumer code, real Postgres, real SQS
(LocalStack); due times are pinned through `now=`, and the window's recount clock through
the dispatcher's `monotonic`."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from shared.core.errors import ConfigError
from shared.core.states import JobState
from shared.ops import explain
from shared.runtime.settings import TimerSettings
from shared.store.operator_store import OperatorStore
from tests.integration.readings import metric
from tests.support.drive import dispatch, receive, run_all, timer_running
from tests.support.wait import wait_for
from timer_service.dispatcher import LANES_COUNTED, WINDOW_POLL_SECONDS
from timer_service.due_watcher import LOOK_AGAIN_SECONDS
from timer_service.service import Timer

WINDOW = 40


class Ticks:
    """A monotonic clock that moves a second per reading: every pass recounts."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def windowed(timer_settings, transport):
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10,
                                                    "dispatch_window": WINDOW}), transport)
    timer.dispatcher.monotonic = Ticks()
    yield timer
    timer.close()


def _in_sqs(db) -> Counter[str]:
    return Counter(dict(db.execute(
        "SELECT kind, count(*) FROM tock_jobs WHERE state = 'dispatched' GROUP BY kind"
    ).fetchall()))


def _due(db, n: int, *, kind: str = "k", tenant: str | None = None, priority: int = 0,
         now) -> None:
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, tenant, priority)
        SELECT %s, 'scheduled', %s - make_interval(secs => 60 - g * 0.001), '{}', %s, %s
        FROM generate_series(1, %s) g
    """, (kind, now, tenant, priority, n))


def test_a_full_window_holds_the_kind_in_postgres_and_claims_make_room(
        db, windowed, transport, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    registry.add("other", lambda payload, ctx: None)
    _due(db, 100, now=clock.now)
    _due(db, 5, kind="other", now=clock.now)
    assert dispatch(windowed, clock.now) == WINDOW + 5, "the window holds k, not other"
    assert dispatch(windowed, clock.now) == 0
    assert _in_sqs(db) == {"k": WINDOW, "other": 5}
    assert transport.depth("default") == WINDOW + 5
    assert metric("tock_dispatch_window_jobs", kind="k", queue="default") == WINDOW
    consumer = consumers(clock)
    done = 0
    while done < 105:
        entries = receive(consumer, 1)
        assert entries, "SQS ran dry before every job was sent"
        sent = dispatch(windowed, clock.now)
        assert _in_sqs(db)["k"] <= WINDOW, "never more than the window in SQS"
        assert sent <= len(entries), "only what consumers claimed is sent again"
        run_all(consumer, entries)
        done += len(entries)
    dispatch(windowed, clock.now)  # a pass that finds the window empty again
    assert metric("tock_dispatch_window_jobs", kind="k", queue="default") == 0
    assert db.execute("SELECT count(*) FROM tock_jobs_all WHERE state = 'succeeded'"
                      ).fetchone()[0] == 105


def test_while_the_window_holds_work_back_a_dispatch_thread_looks_again_later_not_at_once(
        db, windowed, clock):
    """The held jobs are overdue, so the next due time is now: a dispatch thread that went
    by it went straight back to a pass that claimed nothing, four statements and a commit
    each, over and over while consumers drained the window (most of a backlog's passes)."""
    _due(db, WINDOW + 10, now=clock.now)
    assert dispatch(windowed, clock.now) == WINDOW
    dispatcher = windowed.dispatcher
    assert dispatcher.run_once(clock.now) == 0
    waits: list[float] = []
    dispatcher.wait = lambda seconds: waits.append(seconds) or False  # type: ignore[method-assign]
    dispatcher.idle()
    assert waits == [WINDOW_POLL_SECONDS], "a look again once consumers had time to claim"
    assert dispatcher.run_once(clock.now) == 0
    dispatcher.idle()
    assert waits == [WINDOW_POLL_SECONDS] * 2, "and again while the window stays full"


def test_a_queue_nobody_consumes_holds_its_kind_back_on_that_queue_only(
        db, windowed, transport, registry, consumers, clock):
    """The window was per kind: the kind's jobs waiting on a queue with no consumer held
    the same kind back on every other queue, for as long as that queue had none."""
    transport.create_queue("bulk", visibility_timeout=60)
    registry.add("k", lambda payload, ctx: None)
    _due(db, 3 * WINDOW, now=clock.now)
    db.execute("UPDATE tock_jobs SET queue = 'bulk'")  # no consumer receives from it
    assert dispatch(windowed, clock.now) == WINDOW
    _due(db, 25, now=clock.now)  # the same kind, on the default queue
    later = clock.now + timedelta(seconds=windowed.settings.dispatch_window_seconds + 1)
    assert dispatch(windowed, later) == 25, "the kind still goes out on its other queue"
    assert dict(db.execute("SELECT queue, count(*) FROM tock_jobs WHERE state = 'dispatched'"
                           " GROUP BY queue").fetchall()) == {"bulk": WINDOW, "default": 25}
    for queue in ("bulk", "default"):
        assert metric("tock_dispatch_window_jobs", kind="k", queue=queue) is not None
    consumer = consumers(clock, concurrency=25)
    entries = receive(consumer, 25)
    assert {e.item.queue for e in entries} == {"default"} and len(entries) == 25
    run_all(consumer, entries)
    _due(db, 5, now=clock.now)
    assert dispatch(windowed, later) == 5, "and again once those are claimed"
    assert db.execute("SELECT count(*) FROM tock_jobs WHERE queue = 'bulk' AND "
                      "state = 'dispatched'").fetchone()[0] == WINDOW, "bulk stays at its window"


def test_a_kind_with_more_in_sqs_than_the_count_reads_is_held_on_every_queue(
        db, windowed, transport, clock):
    """Past LANES_COUNTED windows of a kind in SQS (the window was just lowered, say) the
    count stops reading, and a queue it did not reach could have been sent more."""
    transport.create_queue("bulk", visibility_timeout=60)
    _due(db, LANES_COUNTED * WINDOW + 10, now=clock.now)
    db.execute("UPDATE tock_jobs SET state = 'dispatched', dispatched_at = %s, "
               "queue = 'bulk'", (clock.now,))
    _due(db, 5, now=clock.now)  # the same kind, on the default queue
    _due(db, 5, kind="other", now=clock.now)
    assert dispatch(windowed, clock.now) == 5, "only the other kind goes out"
    assert db.execute("SELECT count(*) FROM tock_jobs WHERE kind = 'k' AND "
                      "state = 'scheduled'").fetchone()[0] == 5


def test_a_kind_whose_jobs_wait_in_sqs_gets_no_more_until_consumers_catch_up(
        db, windowed, registry, consumers, clock):
    """Below the count, the age: once a batch of a tenant's jobs of a kind has waited in
    SQS longer than dispatch_window_seconds, consumers are behind on them, and more of
    them would only wait behind; another tenant's still go out."""
    registry.add("k", lambda payload, ctx: None)
    _due(db, 15, now=clock.now)
    assert dispatch(windowed, clock.now) == 15
    _due(db, 15, now=clock.now)
    later = clock.now + timedelta(seconds=windowed.settings.dispatch_window_seconds + 1)
    assert dispatch(windowed, later) == 0, "15 waited past the age: the tenant is held"
    _due(db, 5, tenant="B", now=clock.now)
    assert dispatch(windowed, later) == 5, "another tenant of the kind is not"
    consumer = consumers(clock, concurrency=11)
    entries = receive(consumer, 11)  # at least 6 of the first tenant's, whatever the order
    assert len(entries) == 11
    waiting = db.execute("SELECT count(*) FROM tock_jobs WHERE state = 'dispatched' AND "
                         "tenant IS NULL").fetchone()[0]
    assert waiting < 10, "under a batch of the first tenant's jobs still waits"
    assert dispatch(windowed, later) == 15
    run_all(consumer, entries)


class Manual:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_tenant_consumers_fell_behind_on_gets_back_what_they_took_not_the_whole_window(
        db, timer_settings, transport, registry, consumers, clock):
    """A timeline through LocalStack showed the age as a hold making a backlog flow in
    bursts: once consumers caught up, the timer sent the lane's whole room of the tenant
    at once (300-600 jobs), which a newcomer's messages then waited behind. Paced, the
    tenant's depth is cut to 3/4 of what waited, and each pass sends what consumers took
    since (plus a slow growth), while a newcomer still goes out at once."""
    registry.add("k", lambda payload, ctx: None)
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10,
                                                    "dispatch_window": 1000}), transport)
    ticks = timer.dispatcher.monotonic = Manual()

    def a_in_sqs() -> int:
        return db.execute("SELECT count(*) FROM tock_jobs WHERE state = 'dispatched' AND "
                          "tenant = 'A'").fetchone()[0]

    try:
        _due(db, 100, tenant="A", now=clock.now)
        assert dispatch(timer, clock.now) == 100, "nothing waited yet: up to the window"
        _due(db, 500, tenant="A", now=clock.now)
        later = clock.now + timedelta(seconds=timer.settings.dispatch_window_seconds + 1)
        ticks.t = 1.0
        assert dispatch(timer, later) == 0, "100 waited past the age: cut to 75, none sent"
        assert metric("tock_dispatch_paced_tenants", kind="k", queue="default") == 1
        consumer = consumers(clock, concurrency=80)
        taken = receive(consumer, 40)
        assert len(taken) >= 40 and a_in_sqs() < 75
        ticks.t += 0.021  # a recount; the growth of 0.021 s is a fraction of a job
        sent = dispatch(timer, later)
        assert a_in_sqs() == 75, f"topped up to its depth, not to the window ({sent} sent)"
        more = receive(consumer, 10)
        ticks.t += 0.021
        assert dispatch(timer, later) == len(more), "what consumers took goes out again"
        assert a_in_sqs() == 75
        _due(db, 50, tenant="B", now=clock.now)
        ticks.t += 0.021
        assert dispatch(timer, later) == 50, "a newcomer is not paced: all of it at once"
        run_all(consumer, taken + more)
    finally:
        timer.close()


def test_beside_a_held_tenant_another_sends_up_to_its_level_not_its_whole_backlog(
        db, timer_settings, transport, clock):
    """A walkthrough found tenants taking turns of whole backlogs whatever their weights:
    while the window held one, the other was alone in the plan and took every batch until
    its own jobs aged, hundreds of jobs that consumers then handed out before any of the
    first's. The held tenant's jobs in SQS still set the level: the other sends up to it
    (per weight), and the rest of its backlog waits in Postgres."""
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10,
                                                    "dispatch_window": 1000}), transport)
    timer.dispatcher.monotonic = Ticks()

    def sent() -> Counter[str]:
        return Counter(dict(db.execute(
            "SELECT coalesce(tenant, ''), count(*) FROM tock_jobs WHERE state = 'dispatched' "
            "GROUP BY 1").fetchall()))

    def drain(at) -> None:
        while timer.dispatcher.dispatch_due(at)[0]:
            pass

    try:
        _due(db, 15, tenant="A", now=clock.now)
        assert dispatch(timer, clock.now) == 15
        _due(db, 30, tenant="A", now=clock.now)
        _due(db, 200, tenant="B", now=clock.now)
        later = clock.now + timedelta(seconds=timer.settings.dispatch_window_seconds + 1)
        drain(later)
        first = sent()
        assert first["A"] == 15, "A's 15 waited past the age: A is held"
        assert 15 <= first["B"] < 15 + 10, f"B up to A's level, under a batch past it: {first}"
        db.execute("INSERT INTO tock_tenant_weights (tenant, weight) VALUES ('B', 3)")
        drain(later)
        weighted = sent()
        assert weighted["A"] == 15
        assert 3 * 15 <= weighted["B"] < 3 * 15 + 3 * 10, \
            f"at weight 3, B holds about three times A's: {weighted}"
    finally:
        timer.close()


def test_a_held_tenant_does_not_level_a_tenant_sending_to_another_queue(
        db, timer_settings, transport, clock):
    """SQS hands out in send order within a queue: A's backlog on one queue delays
    nothing on another, so C, whose jobs go to another queue, is not held to A's level."""
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10,
                                                    "dispatch_window": 1000}), transport)
    timer.dispatcher.monotonic = Ticks()
    transport.create_queue("bulk", visibility_timeout=60)
    try:
        _due(db, 15, tenant="A", now=clock.now)
        assert dispatch(timer, clock.now) == 15
        _due(db, 30, tenant="A", now=clock.now)
        _due(db, 60, tenant="C", now=clock.now)
        db.execute("UPDATE tock_jobs SET queue = 'bulk' WHERE tenant = 'C'")
        later = clock.now + timedelta(seconds=timer.settings.dispatch_window_seconds + 1)
        while timer.dispatcher.dispatch_due(later)[0]:
            pass
        sent = dict(db.execute("SELECT tenant, count(*) FROM tock_jobs WHERE state = "
                               "'dispatched' GROUP BY 1").fetchall())
        assert sent == {"A": 15, "C": 60}
    finally:
        timer.close()


def test_while_the_window_holds_a_tenant_the_watcher_serves_a_newcomer_when_it_falls_due(
        db, windowed, clock):
    """A held tenant's dispatch threads look again every WINDOW_POLL_SECONDS, not at the
    next due time: the due watcher takes a newcomer's job when it falls due instead, and
    none of the held tenant's."""
    watcher = windowed.due_watcher
    _due(db, 15, now=clock.now)
    assert dispatch(windowed, clock.now) == 15
    assert not windowed.dispatcher.window_held(), "nothing has waited yet"
    _due(db, 15, now=clock.now)
    later = clock.now + timedelta(seconds=windowed.settings.dispatch_window_seconds + 1)
    assert dispatch(windowed, later) == 0
    held = windowed.dispatcher.window_held()
    assert held.holds("k", "default", "") and not held.holds("k", "default", "B")
    assert windowed.dispatcher.backlogged() == frozenset(), "no full batch: no backlog"
    # The held tenant's next job is the dispatch threads' business, not the watcher's.
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload)
                  VALUES ('k', now() + interval '100 milliseconds', '{}')""")
    assert watcher.seconds_to_sleep(frozenset(), held) == (LOOK_AGAIN_SECONDS, False)
    db.execute("DELETE FROM tock_jobs WHERE run_at > now()")
    db.execute("""INSERT INTO tock_jobs (kind, run_at, payload, tenant)
                  VALUES ('k', now() + interval '150 milliseconds', '{}', 'B')""")
    seconds, falls_due = watcher.seconds_to_sleep(frozenset(), held)
    assert falls_due and 0 < seconds <= 0.15
    watcher.run_once(later)
    states = dict(db.execute("SELECT coalesce(tenant, ''), array_agg(DISTINCT state::text) "
                             "FROM tock_jobs GROUP BY 1").fetchall())
    assert states == {"B": ["dispatched"], "": ["dispatched", "scheduled"]}
    assert _in_sqs(db)["k"] == 16, "B's job, and none more of the held tenant's"


def test_what_waits_goes_out_by_priority_then_fair_share(
        db, windowed, registry, consumers, clock):
    registry.add("k", lambda payload, ctx: None)
    _due(db, 200, tenant="A", now=clock.now)
    assert dispatch(windowed, clock.now) == WINDOW
    _due(db, 10, tenant="B", now=clock.now)
    _due(db, 1, tenant="A", priority=9, now=clock.now)
    assert dispatch(windowed, clock.now) == 0, "B and the urgent job wait for room"
    consumer = consumers(clock, concurrency=20)
    entries = receive(consumer, 20)
    assert len(entries) >= 20
    dispatch(windowed, clock.now)
    rows = db.execute("""SELECT coalesce(tenant, ''), priority, count(*) FROM tock_jobs
                         WHERE state = 'dispatched' GROUP BY 1, 2""").fetchall()
    got = {(tenant, priority): n for tenant, priority, n in rows}
    assert got.get(("A", 9)) == 1, "the urgent job goes first"
    assert got.get(("B", 0), 0) >= 9, f"B takes about half of the room: {got}"
    run_all(consumer, entries)


def test_a_newcomer_goes_out_ahead_of_more_of_a_tenant_already_waiting_in_sqs(
        db, windowed, clock):
    """SQS hands out messages in about the order they were sent: what decides how long B's
    jobs wait is how many of A's go out before them. The pass levels the tenants' jobs in
    SQS, so B (nothing there) takes the batch but the slot every tenant keeps."""
    def sent() -> Counter[str]:
        return Counter(dict(db.execute(
            "SELECT coalesce(tenant, ''), count(*) FROM tock_jobs WHERE state = 'dispatched' "
            "GROUP BY 1").fetchall()))

    _due(db, 200, tenant="A", now=clock.now)
    for _ in range(2):
        windowed.dispatcher.dispatch_due(clock.now)
    assert sent() == {"A": 20}
    _due(db, 30, tenant="B", now=clock.now)
    windowed.dispatcher.dispatch_due(clock.now)
    assert sent() == {"A": 21, "B": 9}, "B first: A already has 20 waiting"
    windowed.dispatcher.dispatch_due(clock.now)
    assert sent() == {"A": 22, "B": 18}, "9 + 10 is still under A's 21: B again"


def test_a_lost_full_window_is_sent_again_so_the_kind_is_not_held_for_ever(
        db, windowed, transport, clock):
    """A full window whose messages SQS lost (a purged queue) would hold the kind for good;
    the rescuer's evidence check makes them due again, and they go out, still within the
    window."""
    _due(db, 100, now=clock.now)
    assert dispatch(windowed, clock.now) == WINDOW
    transport.client.purge_queue(QueueUrl=transport.url("default"))
    wait_for(lambda: transport.depth("default") == 0, timeout=30, message="queue purged")
    later = clock.now + timedelta(seconds=windowed.settings.dispatch_timeout_seconds + 1)
    redispatched = 0
    for _ in range(20):  # a batch per pass
        result = windowed.run_once(later)
        redispatched += result.redispatched
        if not result.redispatched:
            break
    assert redispatched == WINDOW
    dispatch(windowed, later)
    assert _in_sqs(db) == {"k": WINDOW}
    wait_for(lambda: transport.depth("default") == WINDOW, timeout=30,
             message="the window's jobs back in SQS")


def test_explain_says_the_kinds_window_is_full(db, database, client, windowed, clock):
    _due(db, WINDOW + 1, now=clock.now)
    dispatch(windowed, clock.now)
    waiting = db.execute("SELECT id FROM tock_jobs WHERE state = 'scheduled'").fetchone()[0]
    store = OperatorStore(database)
    with store.transaction() as tx:
        job = client.get(waiting)
        text = explain.explain(job, explain.gather(tx, job)).text()
    assert (f"{WINDOW} job(s) of kind k are in SQS on queue 'default' waiting for a "
            "consumer") in text, text
    # No consumer takes them: that, not the timer, is what to fix.
    assert text.startswith("Due since ") and (
        f"held in Postgres: {WINDOW} job(s) of kind k already wait in SQS on queue "
        "'default', and no live consumer receives from it") in text, text
    assert "Next: Start a consumer for queue 'default'" in text
    assert "check that a timer is running" not in text
    db.execute("UPDATE tock_jobs SET queue = 'bulk' WHERE state = 'dispatched'")
    with store.transaction() as tx:
        text = explain.explain(job, explain.gather(tx, job)).text()
    assert "in SQS" not in text, "another queue's jobs in SQS do not hold this one"
    assert "waiting for a timer to dispatch it" in text, text


def test_window_zero_sends_every_due_job(db, timer_settings, transport, clock):
    timer = Timer(timer_settings.model_copy(update={"batch_size": 10, "dispatch_window": 0}),
                  transport)
    try:
        _due(db, 100, now=clock.now)
        assert dispatch(timer, clock.now) == 100
    finally:
        timer.close()


def test_a_window_smaller_than_a_batch_is_refused():
    with pytest.raises(ConfigError, match=r"dispatch_window .* at least batch_size"):
        TimerSettings(database_url="postgresql://x/y", batch_size=100, dispatch_window=50)


def test_a_running_fleet_keeps_a_backlog_in_postgres_and_a_newcomer_starts_early(
        db, client, timer_settings, transport, running, registry):
    """Tenant A's 2,000 due jobs against a window of 100: tenant B's jobs, enqueued once
    A's window is full, start after at most about a window of A's, not after A's 2,000,
    and SQS never holds much more than the window. Real timer and consumer threads."""
    registry.add("k", lambda payload, ctx: None)
    settings = timer_settings.model_copy(update={"dispatch_window": 100})
    _due(db, 2000, tenant="A", now=db.execute("SELECT now()").fetchone()[0])
    deepest = 0
    with timer_running(settings, transport):
        wait_for(lambda: _in_sqs(db)["k"] >= 100, timeout=30, message="A's window full")
        seen = [-1]

        def settled() -> bool:  # the timer sent what it would: no consumer is running yet
            current = _in_sqs(db)["k"]
            same, seen[0] = current == seen[0], current
            return same
        wait_for(settled, timeout=60, interval=0.3, message="the timer stopped sending")
        b_jobs = [client.schedule("k", tenant="B").id for _ in range(20)]
        running()

        def b_started() -> bool:
            nonlocal deepest
            deepest = max(deepest, _in_sqs(db)["k"])
            return db.execute("SELECT count(*) FROM tock_jobs_all WHERE id = ANY(%s) AND "
                              "started_at IS NOT NULL", (b_jobs,)).fetchone()[0] == 20
        wait_for(b_started, timeout=60, interval=0.01, message="B's jobs started")
        last_b = db.execute("SELECT max(started_at) FROM tock_jobs_all WHERE id = ANY(%s)",
                            (b_jobs,)).fetchone()[0]
        a_before = db.execute("SELECT count(*) FROM tock_jobs_all WHERE tenant = 'A' AND "
                              "started_at < %s", (last_b,)).fetchone()[0]
        wait_for(lambda: db.execute("SELECT count(*) FROM tock_jobs_all WHERE state = "
                                    "'succeeded'").fetchone()[0] == 2020,
                 timeout=120, message="every job succeeded")
    assert a_before <= 400, f"B waited behind {a_before} of A's jobs (window 100)"
    # Soft: two dispatch threads may each send a batch on a count up to 20 ms old.
    assert deepest <= 100 + 3 * settings.batch_size, deepest
    assert {client.get(j).state for j in b_jobs} == {JobState.SUCCEEDED}


def test_more_lost_messages_than_a_batch_are_all_sent_again_at_once(db, windowed, transport):
    """A restarted SQS loses a whole window. The lost-message loop re-sends a batch per
    pass, and a full pass says so (1), which the loop follows at once with the next, not
    after its interval (10 s here): on the real clock, one call after another."""
    lost = 35
    db.execute("""
        INSERT INTO tock_jobs (kind, state, run_at, payload, dispatched_at, dispatch_token)
        SELECT 'k', 'dispatched', now() - interval '3 minutes', '{}',
               now() - interval '2 minutes', gen_random_uuid()
        FROM generate_series(1, %s)
    """, (lost,))
    loop = windowed.lost_messages
    assert loop.idle_seconds >= 10  # so a pass that said "nothing more" would wait that long

    def sent_again() -> int:
        return db.execute("SELECT count(*) FROM tock_jobs WHERE state <> 'dispatched'"
                          ).fetchone()[0]

    passes: list[tuple[int, int]] = []
    for _ in range(10):
        before = sent_again()
        more = loop.run_once()
        passes.append((sent_again() - before, more))
        if not more:
            break
    assert passes == [(10, 1), (10, 1), (10, 1), (5, 0)]
