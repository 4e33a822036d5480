"""The client API against a real Postgres: upsert by name, update, pause/resume, delete,
get/list, preview, history."""

import re
from datetime import UTC, datetime, timedelta

import pytest

from shared.core.errors import InvalidInput, InvalidSchedule, ScheduleNotFound
from shared.core.schedules import Misfire, Overlap, slot_of

T0 = datetime(2026, 6, 1, 12, 0, 7, tzinfo=UTC)


def test_recurring_creates_then_upserts_idempotently(client, db):
    s = client.recurring("report-15s", "report", {"x": 1}, every=15, now=T0)
    assert s.changed
    assert s.next_slot == datetime(2026, 6, 1, 12, 0, 15, tzinfo=UTC)  # epoch-anchored
    assert s.next_fire_at == s.next_slot
    again = client.recurring("report-15s", "report", {"x": 1}, every=timedelta(seconds=15),
                             now=T0 + timedelta(hours=1))
    assert not again.changed
    assert again.next_slot == s.next_slot  # an unchanged re-declaration keeps its place
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 1


def test_changing_the_payload_keeps_the_place_changing_the_timing_restarts(client):
    client.recurring("r", "report", {"x": 1}, every=15, now=T0)
    payload = client.recurring("r", "report", {"x": 2}, every=15,
                        now=T0 + timedelta(minutes=5))
    assert payload.changed and payload.payload == {"x": 2}
    assert payload.next_slot == datetime(2026, 6, 1, 12, 0, 15, tzinfo=UTC)
    timing = client.recurring("r", "report", {"x": 2}, cron="0 3 * * *", tz="Europe/Berlin",
                              now=T0 + timedelta(minutes=5))
    assert timing.cron == "0 3 * * *" and timing.every is None
    assert timing.next_slot == datetime(2026, 6, 2, 1, 0, tzinfo=UTC)


def test_update_get_list_delete(client):
    client.recurring("a", "report", every=60, now=T0)
    client.recurring("b", "report", cron="*/5 * * * *", now=T0)
    updated = client.update_schedule("a", overlap="skip", misfire="latest", now=T0)
    assert (updated.overlap, updated.misfire) == (Overlap.SKIP, Misfire.LATEST)
    assert updated.every == timedelta(seconds=60)
    switched = client.update_schedule("a", cron="0 * * * *", now=T0)
    assert switched.cron == "0 * * * *" and switched.every is None
    assert [s.name for s in client.list_schedules()] == ["a", "b"]
    assert client.get_schedule("b").describe() == "cron '*/5 * * * *' in UTC"
    client.delete_schedule("a")
    with pytest.raises(ScheduleNotFound, match="no schedule named 'a'"):
        client.get_schedule("a")
    with pytest.raises(ScheduleNotFound):
        client.delete_schedule("a")
    with pytest.raises(ScheduleNotFound):  # its audit records went with it
        client.schedule_history("a")
    assert client.schedule_runs("a") == [] and client.schedule_history("b") == []
    with pytest.raises(InvalidInput, match="unknown schedule argument"):
        client.update_schedule("b", colour="red")
    with pytest.raises(InvalidSchedule, match="malformed"):
        client.update_schedule("b", cron="99 * * * *")


def test_invalid_definition_writes_nothing(client, db):
    with pytest.raises(InvalidSchedule, match="unknown time zone"):
        client.recurring("x", "report", cron="0 2 * * *", tz="Europe/Nowhere")
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 0


@pytest.mark.parametrize(("tz", "message"), [
    # The leap-second build of the tz database loads, but zoneinfo reads it with the wrong
    # offsets (02:00 in a Berlin December): a '0 9 * * *' would fire an hour early.
    ("right/Europe/Berlin", "unknown time zone 'right/Europe/Berlin'; did you mean "
                            "'Europe/Berlin'?"),
    ("posix/Europe/Berlin", "unknown time zone 'posix/Europe/Berlin'; did you mean "
                            "'Europe/Berlin'?"),
    # The host's own setting: a different zone on the declaring machine and on each timer.
    ("localtime", "tz 'localtime' is whatever zone the host is set to"),
])
def test_a_file_of_the_tz_database_that_is_not_a_zone_is_refused(client, db, tz, message):
    with pytest.raises(InvalidSchedule, match=re.escape(message)):
        client.recurring("x", "report", cron="0 9 * * *", tz=tz, now=T0)
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 0
    client.recurring("x", "report", cron="0 9 * * *", tz="Europe/Berlin", now=T0)
    with pytest.raises(InvalidSchedule, match=re.escape(message)):
        client.update_schedule("x", tz=tz, now=T0)
    assert client.get_schedule("x").tz == "Europe/Berlin"


def test_pause_and_resume_audit_the_slots_that_passed(client):
    client.recurring("p", "report", every=60, now=T0)
    paused = client.pause_schedule("p", now=T0)
    assert paused.paused
    # Re-declaring at start-up does not unpause an operator's pause.
    assert client.recurring("p", "report", every=60, now=T0).paused
    resumed = client.resume_schedule("p", now=T0 + timedelta(minutes=10, seconds=30))
    assert not resumed.paused
    assert resumed.next_slot == datetime(2026, 6, 1, 12, 11, tzinfo=UTC)
    (event,) = client.schedule_history("p")
    assert event.reason == "paused"
    assert (event.first_slot, event.last_slot, event.slot_count) == (
        datetime(2026, 6, 1, 12, 1, tzinfo=UTC), datetime(2026, 6, 1, 12, 10, tzinfo=UTC), 10)


def test_preview_by_name(client):
    client.recurring("nightly", "report", cron="30 2 * * *", tz="Europe/Berlin", spread=0,
                     now=datetime(2026, 3, 27, 12, tzinfo=UTC))
    fires = client.preview_schedule("nightly", 3, after=datetime(2026, 3, 27, 12, tzinfo=UTC))
    assert [f.local.strftime("%d %H:%M%z") for f in fires] == [
        "28 02:30+0100", "29 03:00+0200", "30 02:30+0200"]
    with pytest.raises(InvalidInput, match="n must be"):
        client.preview_schedule("nightly", 0)
    with pytest.raises(InvalidInput, match="after must be timezone-aware"):
        client.preview_schedule("nightly", 3, after=datetime(2026, 3, 27, 12))
    with pytest.raises(InvalidInput, match="after must be a timezone-aware datetime"):
        client.preview_schedule("nightly", 3, after="2026-03-27")  # type: ignore[arg-type]


def test_a_nearest_weekday_cron_fires_in_every_month_and_w_beside_a_weekday_is_refused(
        client, db):
    start = datetime(2026, 12, 31, 12, tzinfo=UTC)
    client.recurring("month-end", "report", cron="0 9 30W * *", now=start)
    fires = client.preview_schedule("month-end", 4, after=start)
    assert [f.local.strftime("%a %m-%d") for f in fires] == [
        "Fri 01-29", "Fri 02-26", "Tue 03-30", "Fri 04-30"]  # Feb 2027: its last weekday
    with pytest.raises(InvalidSchedule, match="the day of the week would be ignored"):
        client.recurring("mixed", "report", cron="0 9 15W * mon")
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 1


def test_slot_of_reads_the_run_key():
    assert slot_of("nightly:2026-03-29T01:00:00Z") == datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert slot_of("welcome:42") is None
    assert slot_of(None) is None


def test_changing_the_timing_records_old_slots_that_never_ran(client):
    client.recurring("r", "report", every=60, now=T0)
    client.pause_schedule("r", now=T0)
    changed = client.recurring("r", "report", cron="0 * * * *",
                        now=T0 + timedelta(minutes=3, seconds=30))
    assert changed.next_slot == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)
    assert changed.paused
    (event,) = client.schedule_history("r")
    assert (event.reason, event.slot_count) == ("redefined", 3)
    assert (event.first_slot, event.last_slot) == (datetime(2026, 6, 1, 12, 1, tzinfo=UTC),
                                                   datetime(2026, 6, 1, 12, 3, tzinfo=UTC))


def test_history_and_runs_check_their_limit(client):
    client.recurring("r", "report", every=60, now=T0)
    with pytest.raises(InvalidInput, match="limit must be"):
        client.schedule_history("r", 0)

    with pytest.raises(InvalidInput, match="limit must be"):
        client.schedule_runs("r", limit="5")
    assert client.schedule_runs("r") == []


def test_concurrent_declarations_of_a_new_schedule_make_one_row(database_url, db):
    """Several replicas of an application declaring the same schedule at start-up."""
    from concurrent.futures import ThreadPoolExecutor

    from shared.client import Client
    from shared.runtime.settings import ClientSettings

    clients = [Client(ClientSettings(database_url=database_url)) for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(
                lambda c: c.recurring("boot", "report", every=30, now=T0), clients))
    finally:
        for c in clients:
            c.close()
    assert sorted(r.changed for r in results) == [False, False, False, True]
    assert {r.next_slot for r in results} == {datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)}
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 1


def test_a_zone_with_an_interval_is_refused_utc_too_and_nothing_is_written(client, db):
    for tz in ("UTC", "Etc/UTC", "Europe/Berlin"):
        with pytest.raises(InvalidSchedule, match="tz= applies to cron schedules only"):
            client.recurring("x2", "a.tick", every=60, tz=tz, now=T0)
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 0


def test_the_stored_zone_is_utc_when_none_is_given_as_before(client, db):
    client.recurring("c", "report", cron="0 2 * * *", now=T0)
    client.recurring("e", "report", every=60, now=T0)
    client.recurring("b", "report", cron="0 2 * * *", tz="Europe/Berlin", now=T0)
    rows = db.execute("SELECT name, tz FROM tock_schedules ORDER BY name").fetchall()
    assert rows == [("b", "Europe/Berlin"), ("c", "UTC"), ("e", "UTC")]
    # Declared again the same way: unchanged, nothing written.
    assert not client.recurring("c", "report", cron="0 2 * * *", tz="UTC", now=T0).changed
    assert not client.recurring("e", "report", every=60, now=T0).changed


def test_updates_keep_the_zone_with_the_cron_it_belongs_to(client):
    client.recurring("e", "report", every=60, now=T0)
    assert client.update_schedule("e", priority=3, now=T0).priority == 3  # no zone carried
    with pytest.raises(InvalidSchedule, match="tz= applies to cron schedules only"):
        client.update_schedule("e", tz="UTC", now=T0)
    client.recurring("b", "report", cron="0 2 * * *", tz="Europe/Berlin", now=T0)
    assert client.update_schedule("b", priority=2, now=T0).tz == "Europe/Berlin"
    # An interval replaces the cron and its zone; a zone given with it is still refused.
    with pytest.raises(InvalidSchedule, match="tz='Europe/Berlin' is given with every="):
        client.update_schedule("b", every=60, tz="Europe/Berlin", now=T0)
    switched = client.update_schedule("b", every=60, now=T0)
    assert (switched.every, switched.cron, switched.tz) == (timedelta(seconds=60), None, "UTC")
    back = client.update_schedule("b", cron="0 2 * * *", now=T0)
    assert (back.cron, back.tz) == ("0 2 * * *", "UTC")


def test_a_naive_now_is_refused_not_read_in_the_sessions_zone(client):
    with pytest.raises(InvalidInput, match="now must be timezone-aware"):
        client.recurring("naive", "report", every=60, now=datetime(2020, 1, 1))
    assert [s.name for s in client.list_schedules()] == []
    client.recurring("naive", "report", every=60, now=datetime(2020, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidInput, match="now must be timezone-aware"):
        client.pause_schedule("naive", now=datetime(2020, 1, 1))


@pytest.mark.parametrize(("options", "says"), [
    ({"every": 60, "dst_gap": "skip"}, "dst_gap is given with every=, but it applies to cron "
                                       "schedules only"),
    ({"every": 60, "dst_fold": "once"}, "dst_fold is given with every="),  # the default too
    ({"cron": "0 2 * * *", "backfill_max": 5}, "backfill_max is given with "
                                               "misfire='latest', but only misfire='all' "
                                               "backfills missed slots"),
    ({"every": 60, "misfire": "skip", "backfill_gap": 5}, "backfill_gap is given with "
                                                          "misfire='skip'"),
])
def test_an_option_that_does_not_apply_is_refused_and_nothing_is_written(
        client, db, options, says):
    with pytest.raises(InvalidSchedule, match=re.escape(says)):
        client.recurring("x", "report", now=T0, **options)
    assert db.execute("SELECT count(*) FROM tock_schedules").fetchone()[0] == 0


def test_updates_refuse_an_option_that_does_not_apply_and_drop_those_that_stop_applying(
        client):
    client.recurring("e", "report", every=60, now=T0)
    with pytest.raises(InvalidSchedule, match="dst_gap is given with every="):
        client.update_schedule("e", dst_gap="skip", now=T0)
    with pytest.raises(InvalidSchedule, match="backfill_max is given with misfire='latest'"):
        client.update_schedule("e", backfill_max=5, now=T0)
    backfills = client.update_schedule("e", misfire="all", backfill_max=5, now=T0)
    assert (backfills.misfire, backfills.backfill_max) == (Misfire.ALL, 5)
    latest = client.update_schedule("e", misfire="latest", now=T0)  # the backfill goes too
    assert (latest.misfire, latest.backfill_max) == (Misfire.LATEST, 100)
    client.recurring("b", "report", cron="30 2 * * *", tz="Europe/Berlin", dst_gap="skip",
                     now=T0)
    switched = client.update_schedule("b", every=60, now=T0)  # its DST policies go too
    assert (switched.every, switched.dst_gap.value) == (timedelta(seconds=60), "shift")


def test_a_stored_schedule_with_options_that_do_not_apply_still_loads_and_updates(client, db):
    """Stored before these were refused: kept as they are, its place too."""
    client.recurring("old", "report", every=60, now=T0)
    db.execute("UPDATE tock_schedules SET dst_gap = 'skip', dst_fold = 'twice', "
               "backfill_max = 7 WHERE name = 'old'")
    old = client.get_schedule("old")
    assert (old.dst_gap.value, old.dst_fold.value, old.backfill_max) == ("skip", "twice", 7)
    assert [s.name for s in client.list_schedules()] == ["old"]
    updated = client.update_schedule("old", priority=3, now=T0 + timedelta(minutes=5))
    assert (updated.priority, updated.dst_gap.value, updated.backfill_max) == (3, "skip", 7)
    assert updated.next_slot == old.next_slot, "not restarted: the timing did not change"
