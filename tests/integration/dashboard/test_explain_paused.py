"""`explain` for a job held by a limit with max_running 0: it says the kind or tenant is
paused (nothing will finish and free a slot) and what to run to resume it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.core.jobs import Job
from shared.core.reports import LimitInfo
from shared.core.states import JobState
from shared.ops import explain
from shared.ops.explain import Context
from shared.store.flow_store import FlowStore

NOW = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)


def due_job(**kw) -> Job:
    base = dict(
        id=7, kind="flaky", queue="default", payload={}, priority=0,
        state=JobState.SCHEDULED, run_at=NOW - timedelta(seconds=30), attempt=0,
        max_attempts=3, timeout_seconds=30.0, unique_key=None, tenant=None,
        lease_owner=None, lease_expires_at=None, dispatch_token=None, dispatched_at=None,
        last_error=None, created_at=NOW - timedelta(hours=1), updated_at=NOW,
        started_at=None, finished_at=None)
    base.update(kw)
    return Job(**base)


def limit(scope: str, key: str, **kw) -> LimitInfo:
    base = dict(max_running=0, rate_per_second=None, burst=None, in_flight=0, tokens=None,
                waiting=1)
    base.update(kw)
    return LimitInfo(scope, key, **base)


@pytest.mark.parametrize(("held", "who", "args"), [
    (limit("kind", "flaky"), "kind flaky is", "kind flaky"),
    (limit("tenant", "acme corp"), "tenant acme corp is", "tenant 'acme corp'"),
    (limit("tenant", ""), "jobs without a tenant are", "tenant --no-tenant"),
    (limit("kind_key", "flaky", concurrency_key="acct-7"),
     "every concurrency key of kind flaky is", "kind_key flaky"),
])
def test_a_paused_limit_says_paused_and_how_to_resume(held, who, args):
    e = explain.explain(due_job(), Context(NOW, held_by=held))
    assert e.summary == (f"Due since 2026-12-02 14:59:30 UTC (30 s ago), but {who} paused "
                         "by its limit (max_running 0): nothing of it is dispatched until "
                         "the limit is raised or removed.")
    assert e.next_step == (f"Resume it with `tock limits set {args} --max-running N` (N > 0) "
                           f"or `tock limits remove {args}` (or the dashboard's Limits "
                           "panel); a timer then dispatches it on its next pass.")
    assert "finishes" not in e.text() and "0/0" not in e.text()


def test_resuming_a_paused_limit_with_a_rate_keeps_the_rate():
    held = limit("kind", "flaky", rate_per_second=0.5, burst=2, tokens=2.0)
    e = explain.explain(due_job(state=JobState.RETRYING, attempt=1), Context(NOW, held_by=held))
    assert "kind flaky is paused" in e.summary
    assert "`tock limits set kind flaky --max-running N --rate 0.5 --burst 2`" in e.next_step


def test_a_full_limit_still_waits_for_a_slot():
    held = limit("kind", "flaky", max_running=2, in_flight=2)
    e = explain.explain(due_job(), Context(NOW, held_by=held))
    assert "waiting for a concurrency slot of kind flaky (2/2 running)" in e.summary
    assert e.next_step.startswith("A timer dispatches it when a job of that limit finishes")


def test_gather_names_the_paused_limit_first(client, operator_store):
    client.set_limit("kind", "flaky", rate=1, per=60, burst=1)
    client.set_limit("tenant", "acme", max_running=0)
    job = client.schedule("flaky", tenant="acme")
    with operator_store.transaction() as tx:  # spend the kind's only token: no room either
        tx.sibling(FlowStore).take_tokens([("kind", "flaky", 1)])
    found = explain.explain(job, explain.gather(operator_store, job))
    assert "tenant acme is paused by its limit (max_running 0)" in found.summary, found.text()
    assert "`tock limits set tenant acme --max-running N`" in found.next_step
    client.remove_limit("tenant", "acme")
    found = explain.explain(job, explain.gather(operator_store, job))
    assert "waiting for a rate token of kind flaky" in found.summary, found.text()


def test_the_api_explains_a_paused_kind(operator, client):
    client.set_limit("kind", "flaky", max_running=0)
    job = client.schedule("flaky")
    res = operator.get(f"/api/jobs/{job.id}/explain")
    assert res.status_code == 200, res.text
    body = res.json()
    assert "kind flaky is paused by its limit (max_running 0)" in body["summary"]
    assert "`tock limits remove kind flaky`" in body["next_step"]
