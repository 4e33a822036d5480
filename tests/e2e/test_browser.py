"""The dashboard in a real headless Chromium (Debian's package) against a real uvicorn
server, Postgres and, where jobs must run, a real Timer and Consumer on the LocalStack SQS
fixture. The page is never reloaded after login: what changes shows up by itself."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from consumer.service import Consumer
from consumer.tasks import Registry
from devstack.ports import free_port
from shared.client import Client
from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO
from tests.support.dashboard import OPERATOR, VIEWER, LiveServer, make_dead
from tests.support.wait import wait_for
from timer_service.service import Timer

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


def login(page: Page, server: LiveServer, token: str) -> None:
    page.goto(server.url + "/")
    expect(page).to_have_url(server.url + "/login")  # login is required
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.get_by_test_id("role")).to_have_text("operator" if token == OPERATOR
                                                     else "viewer")


@pytest.fixture
def system(transport: Any, timer_settings: Any, consumer_settings: Any) -> Iterator[None]:
    """A timer and a consumer running for real, in this process, on threads."""
    registry = Registry()
    registry.add("email", lambda payload, ctx: None)

    def flaky(payload: Any, ctx: Any) -> None:
        raise RuntimeError(f"upstream said no (attempt {ctx.attempt})")

    registry.add("flaky", flaky, max_attempts=2)
    timer = Timer(timer_settings.model_copy(update={"max_idle_seconds": 0.2}), transport)
    consumer = Consumer(consumer_settings, registry, transport)
    thread = threading.Thread(target=timer.run_forever, daemon=True)
    thread.start()
    consumer.start()
    yield
    consumer.shutdown()
    timer.stop_flag.set()
    thread.join(timeout=15)


def test_job_enqueued_through_the_page_reaches_succeeded(
        page: Page, live_server: LiveServer, system: None, client: Client, db: Any) -> None:
    page.set_viewport_size({"width": 1400, "height": 1000})
    login(page, live_server, OPERATOR)
    page.click("text=Enqueue")
    page.fill("[name=kind]", "email")
    page.fill("[name=payload]", '{"to": "ops@example.com"}')
    page.click("[data-testid=enqueue-form] button[type=submit]")
    expect(page).to_have_url(f"{live_server.url}/#/jobs/1")
    expect(page.get_by_test_id("job-state")).to_have_text("succeeded", timeout=30_000)
    expect(page.get_by_test_id("explanation")).to_contain_text("Succeeded at")
    expect(page.get_by_test_id("attempts")).to_contain_text("Attempt 1")
    row = db.execute("SELECT state::text, payload FROM tock_jobs_all WHERE id = 1").fetchone()
    assert row == ("succeeded", {"to": "ops@example.com"})

    page.click("text=Jobs")
    expect(page.get_by_test_id("job-state-1")).to_have_text("succeeded")

    # The overview fills in live as more work runs: the README's screenshot.
    page.click("text=Overview")
    client.schedule_many([{"kind": "email", "payload": {"n": n}} for n in range(12)]
                         + [{"kind": "flaky"} for _ in range(3)]
                         + [{"kind": "email", "delay": 3600} for _ in range(2)])
    expect(page.get_by_test_id("count-succeeded")).to_contain_text("13", timeout=30_000)
    expect(page.get_by_test_id("count-dead")).to_contain_text("3", timeout=30_000)
    expect(page.get_by_test_id("count-scheduled")).to_contain_text("2")
    expect(page.get_by_test_id("worker-row")).to_contain_text("alive")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def submit_enqueue(page: Page, **fields: str) -> None:
    """Fill these fields of the enqueue form (the others keep what they hold) and submit."""
    for name, value in fields.items():
        page.fill(f"[name={name}]", value)
    page.click("[data-testid=enqueue-form] button[type=submit]")


def test_the_enqueue_form_takes_a_tenant_and_shows_the_api_s_refusal(
        page: Page, live_server: LiveServer, db: Any) -> None:
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/enqueue")
    submit_enqueue(page, kind="email", delay="3600", tenant=" acme")
    expect(page.locator("#toast")).to_contain_text("begins or ends with blank space")
    submit_enqueue(page, tenant="acme")
    expect(page).to_have_url(f"{live_server.url}/#/jobs/1")
    expect(page.locator("dl.fields")).to_contain_text("acme")
    assert db.execute("SELECT tenant FROM tock_jobs_all WHERE id = 1").fetchone() == ("acme",)


@pytest.mark.browser_context_args(timezone_id="America/New_York")
def test_the_enqueue_form_runs_a_job_at_a_time_of_the_browser_s_zone(
        page: Page, live_server: LiveServer, db: Any) -> None:
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/enqueue")
    expect(page.locator("[data-testid=enqueue-form]")).to_contain_text(
        "or run at (America/New_York time)")
    # A delay beside a time is the API's to refuse, not the form's to drop.
    submit_enqueue(page, kind="email", delay="5", at="2031-07-04T09:30:15")
    expect(page.locator("#toast")).to_contain_text("give either at= or delay=, not both")
    submit_enqueue(page, delay="0", concurrency_key="customer-7", timeout="45")
    expect(page).to_have_url(f"{live_server.url}/#/jobs/1")
    expect(page.get_by_test_id("job-state")).to_have_text("scheduled")
    row = db.execute("SELECT run_at AT TIME ZONE 'UTC', concurrency_key, timeout_seconds "
                     "FROM tock_jobs_all WHERE id = 1").fetchone()
    # 09:30:15 in New York in July is EDT (UTC-4).
    assert (str(row[0]), row[1], row[2]) == ("2031-07-04 13:30:15", "customer-7", 45)


def test_dead_jobs_retry_button_sends_it_back_to_scheduled(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    job = client.schedule("flaky", {"n": 1})
    make_dead(db, job.id, "upstream said no")
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.get_by_test_id("job-state")).to_have_text("dead")
    expect(page.get_by_test_id("explanation")).to_contain_text("upstream said no")
    expect(page.locator("dl.fields")).to_contain_text("attempt3 of 3")
    expect(page.locator("main")).not_to_contain_text("[object")
    page.get_by_test_id("retry-button").click()
    expect(page.get_by_test_id("job-state")).to_have_text("scheduled")
    assert client.get(job.id).state.value == "scheduled"


def test_the_attempt_timeline_marks_where_a_retry_began(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    job = client.schedule("flaky")
    for n in (1, 2, 1):  # two attempts, an operator's retry, its first attempt again
        db.execute("INSERT INTO tock_attempts (job_id, attempt, worker, started_at, "
                   "finished_at, outcome, error) VALUES (%s, %s, 'w1', now(), now(), "
                   "'failed', 'boom')", (job.id, n))
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.get_by_test_id("attempts").locator("li")).to_have_count(4)
    expect(page.get_by_test_id("retried")).to_have_count(1)
    expect(page.get_by_test_id("attempts").locator("li").nth(2)).to_have_text(
        "Retried: attempts count from 1 again")


def test_bulk_retry_shows_its_dry_run_count_first(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    dead = [client.schedule("flaky").id for _ in range(3)]
    other = client.schedule("email").id
    for job_id in [*dead, other]:
        make_dead(db, job_id)
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs?state=dead&kind=flaky")
    expect(page.get_by_test_id(f"job-row-{dead[0]}")).to_be_visible()
    page.get_by_test_id("bulk-retry").click()
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-title")).to_have_text("Retry 3 job(s)?")
    expect(page.locator("#confirm-text")).to_contain_text("state dead, kind flaky")
    # Counting changed nothing: the operator has not confirmed yet.
    states = db.execute("SELECT count(*) FROM tock_jobs_all WHERE state = 'dead'").fetchone()[0]
    assert states == 4
    page.locator("#confirm-yes").click()
    expect(page.locator("#toast")).to_have_text("Retried 3 job(s).")
    wait_for(lambda: db.execute(
        "SELECT array_agg(id ORDER BY id) FROM tock_jobs_all WHERE state = 'scheduled'"
    ).fetchone()[0] == dead, message="the three flaky jobs to be scheduled")
    assert client.get(other).state.value == "dead"
    # The filtered list (state dead) refreshes by itself: the retried jobs leave it.
    expect(page.get_by_test_id(f"job-row-{dead[0]}")).to_have_count(0)


def test_a_bulk_action_acts_on_the_filter_typed_not_yet_applied(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    # The list shows every dead job; the operator types a kind and, without pressing
    # Filter, asks to cancel: only that kind's jobs may be counted and cancelled.
    flaky = client.schedule("flaky").id
    others = [client.schedule("email").id for _ in range(2)]
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs?state=scheduled")
    expect(page.get_by_test_id(f"job-row-{others[0]}")).to_be_visible()
    page.locator("form.filters input[name=kind]").fill("flaky")
    page.get_by_test_id("bulk-cancel").click()
    expect(page.locator("#confirm-title")).to_have_text("Cancel 1 job(s)?")
    expect(page.locator("#confirm-text")).to_contain_text("kind flaky")
    page.locator("#confirm-yes").click()
    expect(page.locator("#toast")).to_have_text("Cancelled 1 job(s).")
    assert client.get(flaky).state.value == "cancelled"
    assert [client.get(j).state.value for j in others] == ["scheduled", "scheduled"]
    # The list follows the filter acted on.
    expect(page.get_by_test_id(f"job-row-{others[0]}")).to_have_count(0)
    assert "kind=flaky" in page.url


def test_a_bulk_action_without_a_filter_asks_for_one(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    job = client.schedule("flaky").id
    make_dead(db, job)
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs")
    expect(page.get_by_test_id(f"job-row-{job}")).to_be_visible()
    page.get_by_test_id("bulk-retry").click()
    expect(page.locator("#toast")).to_contain_text("Choose at least one filter")
    expect(page.locator("#confirm")).not_to_be_visible()
    assert client.get(job).state.value == "dead"


def test_viewer_sees_but_cannot_retry(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    job = client.schedule("flaky")
    make_dead(db, job.id)
    login(page, live_server, VIEWER)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.get_by_test_id("job-state")).to_have_text("dead")
    expect(page.get_by_test_id("retry-button")).to_be_disabled()
    # Even a hand-made request from the viewer's session is refused by the server.
    status = page.evaluate(
        """async (id) => {
             const me = await (await fetch('/api/me')).json();
             const res = await fetch(`/api/jobs/${id}/retry`,
               {method: 'POST', headers: {'X-CSRF-Token': me.csrf_token || ''}});
             return res.status;
           }""", job.id)
    assert status == 403
    assert client.get(job.id).state.value == "dead"
    page.click("text=Jobs")
    expect(page.get_by_test_id("bulk-retry")).to_be_disabled()


@pytest.mark.parametrize("evil_host", ["127.0.0.1", "localhost"],
                         ids=["same-site-other-port", "cross-site"])
def test_cross_site_form_post_is_rejected(
        page: Page, live_server: LiveServer, client: Client, db: Any, evil_host: str) -> None:
    """A logged-in operator visits another site whose page posts a form to the dashboard.
    Same site on another port: the browser sends the cookie, and the API refuses a body
    that is not JSON (415) before any route runs; a form cannot send JSON, and a script
    that does needs a CORS preflight the dashboard never grants. Another site: the
    SameSite=Strict cookie is not even sent. (A bodiless cross-site POST meets the CSRF
    check: the test above.)"""
    job = client.schedule("flaky")
    make_dead(db, job.id)
    login(page, live_server, OPERATOR)
    evil = f"http://{evil_host}:{free_port()}/win-a-prize"
    target = f"{live_server.url}/api/jobs/{job.id}/retry"
    page.route(evil, lambda route: route.fulfill(content_type="text/html", body=(
        f'<form id="f" method="post" action="{target}">'
        '<input type="hidden" name="state" value="scheduled"></form>'
        '<script>document.getElementById("f").submit()</script>')))
    with page.expect_response(target) as response:
        page.goto(evil)
    assert response.value.status in (401, 403, 415)
    if evil_host == "127.0.0.1":
        assert response.value.status == 415
        assert "Content-Type: application/json" in response.value.text()
    assert client.get(job.id).state.value == "dead"


def test_schedules_show_next_fires_and_pause_from_the_page(
        page: Page, live_server: LiveServer, client: Client) -> None:

    client.recurring("nightly", "report", cron="0 2 * * *")
    login(page, live_server, OPERATOR)
    page.click("text=Schedules")
    row = page.get_by_test_id("schedule-nightly")
    expect(row).to_contain_text("cron '0 2 * * *' in UTC")
    expect(row).to_contain_text("active")
    page.click("text=nightly")
    expect(page.get_by_test_id("next-fires").locator("li")).to_have_count(5)
    expect(page.get_by_test_id("next-fires")).to_contain_text("02:00:00")
    page.get_by_test_id("toggle-nightly").click()
    expect(page.locator("h1")).to_contain_text("paused")
    assert client.get_schedule("nightly").paused


def test_tenants_panel_shows_the_share_and_operators_change_weights(
        page: Page, live_server: LiveServer, client: Client) -> None:
    client.schedule_many([{"kind": "email", "tenant": "acme"} for _ in range(3)]
                         + [{"kind": "email"}])
    login(page, live_server, OPERATOR)
    acme = page.get_by_test_id("tenant-acme")
    expect(acme).to_contain_text("acme")
    expect(page.get_by_test_id("tenant-")).to_contain_text("(no tenant)")
    expect(acme.get_by_test_id("tenant-weight")).to_have_text("1")
    form = page.get_by_test_id("weight-form")
    form.locator("[name=tenant]").fill("acme")
    form.locator("[name=weight]").fill("5")
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_have_text("acme: weight 5.")
    expect(acme.get_by_test_id("tenant-weight")).to_have_text("5", timeout=15_000)
    assert client.tenant_weights() == {"acme": 5}
    form.locator("[name=weight]").fill("0")  # the browser holds it back: min is 1
    form.locator("button[type=submit]").click()
    expect(form.locator("[name=weight]:invalid")).to_have_count(1)
    assert client.tenant_weights() == {"acme": 5}
    form.locator("[name=weight]").fill("")  # empty: said so, not sent as 0
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_have_text("Give a weight from 1 to 1000 (or Reset to 1).")
    assert client.tenant_weights() == {"acme": 5}
    form.locator("[name=tenant]").fill("   ")  # sent as typed, not trimmed to "no tenant"
    form.locator("[name=weight]").fill("7")
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_contain_text("tenant '   ' is only blank space")
    assert client.tenant_weights() == {"acme": 5}
    form.locator("[name=tenant]").fill("acme")
    page.get_by_test_id("weight-reset").click()
    expect(page.locator("#toast")).to_have_text("acme: weight 1.")
    assert client.tenant_weights() == {}


def test_a_backlog_past_the_count_bound_shows_as_estimated_and_a_rare_queue_exactly(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    db.execute("INSERT INTO tock_jobs (kind, queue, run_at, payload, tenant) "
               "SELECT 'email', 'mail', now() - interval '1 minute', '{}', 'acme' "
               "FROM generate_series(1, %s)", [UNFINISHED_EXACT_UP_TO + 500])
    db.execute("ANALYZE tock_jobs")
    client.schedule("sms", queue="rare")
    login(page, live_server, VIEWER)
    mail = page.get_by_test_id("queue-mail-email")
    expect(mail).to_contain_text("≈")
    expect(mail).to_have_attribute("title", "≈: estimated from statistics (past 10,000 jobs)")
    expect(mail.locator("td.num").nth(1)).to_have_text("0")  # exact: not marked
    expect(page.get_by_test_id("count-scheduled")).to_contain_text("≈")
    rare = page.get_by_test_id("queue-rare-sms")
    expect(rare).to_contain_text("rare")
    expect(rare).not_to_contain_text("≈")
    expect(page.get_by_test_id("tenant-acme")).to_contain_text("≈")


def test_viewer_sees_tenants_but_no_weight_form(
        page: Page, live_server: LiveServer, client: Client) -> None:
    client.schedule("email", tenant="acme")
    login(page, live_server, VIEWER)
    expect(page.get_by_test_id("tenant-acme")).to_contain_text("acme")
    expect(page.get_by_test_id("tenants-panel")).to_contain_text("Log in as operator")
    expect(page.get_by_test_id("weight-form")).to_have_count(0)


def test_limits_panel_shows_use_and_operators_set_and_remove_limits(
        page: Page, live_server: LiveServer, client: Client) -> None:
    client.schedule_many([{"kind": "report"} for _ in range(3)])
    client.set_limit("kind", "report", max_running=0)
    with client.database.connection() as conn:  # a consumer has announced the kind
        conn.execute("INSERT INTO tock_workers (id, host, pid, queues, concurrency, kinds) "
                     "VALUES ('w1', 'h', 1, '{default}', 1, '{report}')")
    login(page, live_server, OPERATOR)
    row = page.get_by_test_id("limit-kind-report")
    expect(row.get_by_test_id("limit-running")).to_have_text("0 / 0")
    expect(row.get_by_test_id("limit-waiting")).to_have_text("3")
    form = page.get_by_test_id("limit-form")
    form.locator("[name=key]").fill("report")
    form.locator("[name=max_running]").fill("2")
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_have_text("Limit set on kind report.")
    expect(row.get_by_test_id("limit-running")).to_have_text("0 / 2", timeout=15_000)
    for name, value in (("rate", "30"), ("per", "60"), ("burst", "7")):
        form.locator(f"[name={name}]").fill(value)
    form.locator("button[type=submit]").click()
    # The toast reads as the first submit's did: wait for the second's write itself.
    wait_for(lambda: client.limits()[0].rate_per_second is not None,
             message="the rate limit written")
    expect(page.locator("#toast")).to_have_text("Limit set on kind report.")
    (limit,) = client.limits()
    assert (limit.max_running, limit.rate_per_second, limit.burst) == (2, 0.5, 7)
    form.locator("[name=max_running]").fill("")  # the rate alone: max running goes
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_have_text(
        "Limit set on kind report; it no longer has max running 2 (give every part of a "
        "limit in one set).")
    (limit,) = client.limits()
    assert (limit.max_running, limit.rate_per_second) == (None, 0.5)
    for name in ("rate", "per", "burst"):
        form.locator(f"[name={name}]").fill("")
    form.locator("[name=max_running]").fill("")
    form.locator("button[type=submit]").click()
    expect(page.locator("#toast")).to_contain_text("give max_running, a rate, or both")
    page.get_by_test_id("limit-remove").click()
    expect(page.locator("#toast")).to_have_text("Limit removed from kind report.")
    assert client.limits() == []
    expect(page.get_by_test_id("limits-panel")).to_contain_text("No limits", timeout=15_000)
    page.get_by_test_id("limit-remove").click()
    expect(page.locator("#toast")).to_have_text("kind report has no limit; nothing removed")


def test_an_operator_sets_a_per_key_limit_and_a_job_shows_its_key(
        page: Page, live_server: LiveServer, client: Client) -> None:
    job = client.schedule("sync", concurrency_key="acct-7")
    login(page, live_server, OPERATOR)
    form = page.get_by_test_id("limit-form")
    form.locator("[name=scope]").select_option("kind_key")
    form.locator("[name=key]").fill("sync")
    form.locator("[name=max_running]").fill("1")
    form.locator("button[type=submit]").click()
    # No consumer has announced sync: set all the same, with the CLI's note.
    expect(page.locator("#toast")).to_have_text(
        "Limit set on kind_key sync; no consumer has announced a handler for kind sync in "
        "the last 24 hours (a typo?).")
    row = page.get_by_test_id("limit-kind_key-sync")
    expect(row.get_by_test_id("limit-running")).to_have_text("0 (0 keys full) / 1 per key",
                                                             timeout=15_000)
    expect(row.get_by_test_id("limit-waiting")).to_have_text("1")
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.locator("dl.fields")).to_contain_text("concurrency keyacct-7")


DEMO_TASKS = Path(__file__).resolve().parents[2] / "demo" / "tasks.py"
STAMP = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} (UTC|[+-]\d{2}:\d{2})"


def demo_kinds() -> set[str]:
    """The kinds demo/tasks.py registers with @task("kind", ...), read without importing
    it (importing would fill the process-wide registry)."""
    import ast
    kinds = set()
    for node in ast.walk(ast.parse(DEMO_TASKS.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "task" and node.args
                and isinstance(node.args[0], ast.Constant)):
            kinds.add(node.args[0].value)
    return kinds


def test_enqueue_help_describes_every_kind_in_the_kind_list(
        page: Page, live_server: LiveServer) -> None:
    login(page, live_server, OPERATOR)
    page.click("text=Enqueue")
    help_text = page.get_by_test_id("enqueue-help")
    expect(help_text).to_contain_text("Demo kinds")
    listed = page.eval_on_selector_all("#kinds option", "os => os.map(o => o.value)")
    assert set(listed) == demo_kinds()  # the list follows demo/tasks.py
    text = help_text.inner_text()
    missing = [kind for kind in listed if f"{kind} (" not in text]
    assert not missing, f"the help does not describe {missing}: {text!r}"


def test_schedule_times_share_one_format_in_the_schedules_zone(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    import re
    client.recurring("berlin", "report", cron="0 2 * * *", tz="Europe/Berlin")
    # A run the schedule made for 02:00 Berlin time on a winter night (01:00 UTC).
    job_id = db.execute(
        "INSERT INTO tock_jobs (kind, queue, run_at, payload, unique_key, schedule_name) "
        "VALUES ('report', 'default', '2026-01-15T01:00:00Z', '{}', "
        "'berlin:2026-01-15T01:00:00Z', 'berlin') RETURNING id").fetchone()[0]
    login(page, live_server, VIEWER)
    page.goto(f"{live_server.url}/#/schedules/berlin")
    fires = page.get_by_test_id("fire-time")
    expect(fires).to_have_count(5)
    slot = page.get_by_test_id("run-slot")
    expect(slot).to_have_text("2026-01-15 02:00:00 +01:00")
    for text in fires.all_inner_texts():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2} 02:00:00 \+0[12]:00", text), text
        assert re.fullmatch(STAMP, text)
    assert re.fullmatch(STAMP, slot.inner_text())
    # Both columns name the zone they are in.
    expect(page.locator("h2", has_text="Next fire times")).to_contain_text("Europe/Berlin")
    expect(page.get_by_test_id("runs").locator("thead")).to_contain_text("slot (Europe/Berlin)")
    # Elsewhere the same format, in UTC: the job page shows that run's time.
    page.goto(f"{live_server.url}/#/jobs/{job_id}")
    expect(page.locator("dl.fields")).to_contain_text("run at2026-01-15 01:00:00 UTC")
    expect(page.locator("dl.fields")).to_contain_text(re.compile(f"created{STAMP}"))
    page.goto(f"{live_server.url}/#/jobs")
    expect(page.get_by_test_id(f"job-row-{job_id}").locator("td").nth(5)).to_have_attribute(
        "title", "2026-01-15 01:00:00 UTC")


def test_pages_load_without_console_errors_and_serve_a_favicon(
        page: Page, live_server: LiveServer, client: Client) -> None:
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}")
            if r.status >= 400 else None)
    page.on("requestfailed", lambda r: problems.append(f"failed {r.url}: {r.failure}"))
    job = client.schedule("email")
    client.recurring("nightly", "report", cron="0 2 * * *")

    icons: set[str] = set()

    def collect_icons() -> None:
        icons.update(page.eval_on_selector_all(
            "link[rel~=icon]", "ls => ls.map(l => l.href)"))

    # Without a session: /favicon.ico is public, like the login page.
    response = page.goto(live_server.url + "/favicon.ico")
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("image/svg+xml")
    login(page, live_server, OPERATOR)  # passes through /login
    collect_icons()
    for hash_, ready in [("#/", page.get_by_test_id("count-scheduled")),
                         ("#/jobs", page.get_by_test_id(f"job-row-{job.id}")),
                         (f"#/jobs/{job.id}", page.get_by_test_id("explanation")),
                         ("#/schedules", page.get_by_test_id("schedule-nightly")),
                         ("#/schedules/nightly", page.get_by_test_id("next-fires")),
                         ("#/enqueue", page.get_by_test_id("enqueue-form"))]:
        page.goto(f"{live_server.url}/{hash_}")
        expect(ready).to_be_visible()
        collect_icons()
    page.goto(live_server.url + "/login")
    collect_icons()
    expect(page.locator("#token")).to_be_visible()
    # Every icon a page names is served (headless Chromium may not fetch them itself).
    assert icons and all(i.startswith(live_server.url) for i in icons), icons
    for icon in sorted(icons):
        served = page.request.get(icon)
        assert served.status == 200, icon
        assert served.headers["content-type"].startswith("image/svg+xml"), icon
    page.wait_for_load_state("networkidle")  # the last page's requests have settled
    assert problems == []


def test_a_job_that_is_not_there_says_so_instead_of_reconnecting(
        page: Page, live_server: LiveServer) -> None:
    # A link to a job whose history day was dropped (or a mistyped id): the server answers
    # 404, which is not an outage.
    page.clock.install()  # the page's timers, moved on below rather than waited for
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/987654")
    expect(page.get_by_test_id("problem")).to_have_text("no job with id 987654")
    page.clock.run_for(11_000)  # past the 10 s after which a silent page reads stale
    expect(page.locator("#live")).to_contain_text("live ·")
    expect(page.get_by_test_id("problem")).to_have_text("no job with id 987654")
    # Going elsewhere clears the note.
    page.click("text=Jobs")
    expect(page.get_by_test_id("problem")).to_be_hidden()


def test_an_outage_is_named_on_the_page_and_clears_by_itself(
        page: Page, live_server: LiveServer) -> None:
    page.clock.install()  # the page's timers, moved on below rather than waited for
    login(page, live_server, OPERATOR)
    expect(page.get_by_test_id("count-scheduled")).to_be_visible()
    # Every outcome the throughput chart draws has its colour in the legend.
    expect(page.locator(".legend").first).to_contain_text("lease_expired")
    detail = "database unavailable: couldn't get a connection after 3.00 sec"
    page.route("**/api/stats/overview",
               lambda route: route.fulfill(status=503, json={"detail": detail}))
    expect(page.get_by_test_id("problem")).to_contain_text(f"Cannot refresh: {detail}")
    expect(page.locator("#live")).to_have_text("reconnecting…")
    # It stays so while the calls fail: the page's 5 s freshness check (whose last success
    # is still less than 10 s old) does not turn it back to "live".
    page.clock.run_for(6000)
    expect(page.get_by_test_id("problem")).to_contain_text(f"Cannot refresh: {detail}")
    assert page.locator("#live").inner_text() == "reconnecting…"
    page.unroute("**/api/stats/overview")
    expect(page.get_by_test_id("problem")).to_be_hidden(timeout=10_000)
    expect(page.locator("#live")).to_contain_text("live ·")


def test_a_long_unbroken_error_wraps_instead_of_widening_the_page(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    job = client.schedule("flaky")
    make_dead(db, job.id, "ValueError: " + "x" * 3000)
    page.set_viewport_size({"width": 1200, "height": 900})
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.get_by_test_id("attempts")).to_contain_text("ValueError")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1200


def test_a_kind_of_the_longest_allowed_name_wraps_instead_of_widening_the_overview(
        page: Page, live_server: LiveServer, client: Client) -> None:
    """A 128-character kind (allowed) pushed the queue table's counts out of view."""
    kind = "k" * 128
    client.schedule(kind, queue="mine", delay=3600)
    page.set_viewport_size({"width": 1200, "height": 900})
    login(page, live_server, VIEWER)
    row = page.get_by_test_id(f"queue-mine-{kind}")
    expect(row).to_contain_text(kind[:20])
    assert page.evaluate("document.documentElement.scrollWidth") <= 1200
    last = row.locator("td").last.bounding_box()
    assert last is not None and last["x"] + last["width"] <= 1200


def test_cancelling_one_job_asks_first(
        page: Page, live_server: LiveServer, client: Client) -> None:
    job = client.schedule("email", delay=3600)
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.get_by_test_id("job-state")).to_have_text("scheduled")
    page.get_by_test_id("cancel-button").click()
    expect(page.locator("#confirm-title")).to_have_text(f"Cancel job #{job.id}?")
    page.locator("#confirm-no").click()
    expect(page.locator("#confirm")).not_to_be_visible()
    expect(page.get_by_test_id("job-state")).to_have_text("scheduled")
    assert client.get(job.id).state.value == "scheduled"
    page.get_by_test_id("cancel-button").click()
    page.locator("#confirm-yes").click()
    expect(page.get_by_test_id("job-state")).to_have_text("cancelled")


def test_a_link_to_no_page_says_so(page: Page, live_server: LiveServer) -> None:
    login(page, live_server, VIEWER)
    page.goto(f"{live_server.url}/#/jobs/abc")
    expect(page.locator("#toast")).to_have_text("No page at #/jobs/abc: showing the overview.")


def test_a_payload_typed_in_the_enqueue_form_is_stored_and_shown_exactly(
        page: Page, live_server: LiveServer, db: Any) -> None:
    # A browser's JSON.parse rounds integers past 2**53, reads 1e400 as Infinity (written
    # back as null) and keeps the last of a repeated key: the form must send the text.
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/enqueue")
    submit_enqueue(page, kind="email", delay="3600", payload='{"a": 1, "a": 2}')
    expect(page.locator("#toast")).to_contain_text("has the key 'a' twice")
    submit_enqueue(page, payload='{"x": 1e400}')
    expect(page.locator("#toast")).to_contain_text(
        "'payload.x': the number 1e400 is out of a float's range")
    assert db.execute("SELECT count(*) FROM tock_jobs_all").fetchone() == (0,)
    submit_enqueue(page, payload='{"n": 9007199254740993, "m": 12345678901234567890}')
    expect(page).to_have_url(f"{live_server.url}/#/jobs/1")
    assert db.execute("SELECT payload::text FROM tock_jobs_all").fetchone() == (
        '{"m": 12345678901234567890, "n": 9007199254740993}',)
    expect(page.get_by_test_id("payload")).to_have_text(
        '{\n  "m": 12345678901234567890,\n  "n": 9007199254740993\n}')


def test_bidirectional_text_controls_are_shown_not_obeyed(
        page: Page, live_server: LiveServer, client: Client, db: Any) -> None:
    # U+202E reverses what follows it: "pay <U+202E>0001 EUR" would read "pay RUE 1000".
    # A zero-width space would make "acme" and "ac<U+200B>me" look the same.
    job = client.schedule("email", {"note": "pay \u202e0001 EUR", "to": "ac\u200bme"},
                          delay=3600, tenant="acme")
    # A tenant stored before new tenants were refused such characters.
    db.execute("UPDATE tock_jobs SET tenant = %s WHERE id = %s", ("acme\u2066x", job.id))
    login(page, live_server, OPERATOR)
    page.goto(f"{live_server.url}/#/jobs/{job.id}")
    expect(page.locator("pre")).to_contain_text("pay \\u202E0001 EUR")
    expect(page.locator("pre")).to_contain_text("ac\\u200Bme")
    expect(page.locator("dl.fields")).to_contain_text("acme\\u2066x")
    assert "\u202e" not in page.locator("main").inner_text()


def test_a_poll_in_flight_when_the_page_changes_leaves_the_new_page_alone(
        page: Page, live_server: LiveServer) -> None:
    # The overview's refresh is still waiting for its answer when the operator opens a job
    # that is not there: the late answer must neither clear the job page's note nor start
    # the overview's refreshes again.
    login(page, live_server, OPERATOR)
    expect(page.get_by_test_id("count-scheduled")).to_be_visible()
    held: list[Any] = []
    # A lambda, not held.append: Playwright would pass a builtin (route, request).
    page.route("**/api/stats/overview", lambda route: held.append(route))  # noqa: PLW0108
    with page.expect_request("**/api/stats/overview"):
        pass  # the next refresh is asked for, and held
    page.goto(f"{live_server.url}/#/jobs/987654")
    expect(page.get_by_test_id("problem")).to_have_text("no job with id 987654")
    assert len(held) == 1, held
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/stats/overview" in r.url else None)
    with page.expect_response("**/api/stats/overview"):
        held[0].continue_()
    expect(page.get_by_test_id("problem")).to_have_text("no job with id 987654")
    page.wait_for_load_state("networkidle")  # an old loop would have asked again by now
    assert asked == [], asked
