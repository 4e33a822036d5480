"""A scrape of /metrics while another request's statistics refresh waits on a table lock
answers at once with the previous numbers and their age, instead of waiting out the lock
(25 s under a 25 s lock, past a typical scrape timeout). Real Postgres, real lock."""

from __future__ import annotations

import threading

import psycopg
from fastapi.testclient import TestClient

from dashboard.app import create_app
from tests.support.dashboard import METRICS
from tests.support.wait import wait_for

AUTH = {"Authorization": f"Bearer {METRICS}"}


def _gauge(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def test_a_scrape_during_a_held_up_refresh_gets_the_last_numbers_at_once(
        dashboard_settings, database_url, db):
    settings = dashboard_settings.model_copy(update={"dashboard_stats_ttl_seconds": 0.2})
    app = create_app(settings)
    with TestClient(app) as c, psycopg.connect(database_url) as locker:
        first = c.get("/metrics", headers=AUTH)
        assert first.status_code == 200 and _gauge(first.text, "tock_cluster_stats_up") == 1
        stats = app.state.stats
        # A snapshot is kept at least ten times as long as it took (BUSY_SHARE): on a
        # loaded machine one that took a second falls due ten seconds later.
        wait_for(lambda: stats.age_seconds >= stats.refresh_seconds,
                 timeout=stats.refresh_seconds + 10, message="the snapshot to fall due")
        locker.execute("LOCK TABLE tock_jobs IN ACCESS EXCLUSIVE MODE")
        held_up: list[int] = []
        refresh = threading.Thread(
            target=lambda: held_up.append(c.get("/metrics", headers=AUTH).status_code))
        refresh.start()
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()").fetchone()[0] > 0,
            timeout=10, message="the refresh to wait on the lock")
        scrape = c.get("/metrics", headers=AUTH)
        assert scrape.status_code == 200
        assert _gauge(scrape.text, "tock_cluster_stats_up") == 1
        assert _gauge(scrape.text, "tock_cluster_stats_age_seconds") >= stats.refresh_seconds
        assert refresh.is_alive(), "the refresh was still held up when the scrape answered"
        locker.rollback()
        refresh.join(30)
        assert held_up == [200]
