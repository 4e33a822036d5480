"""Where a kind's handler runs: `@task(..., isolation=)` wins over the consumer's setting,
a kind that does not say follows it, and anything but "thread" or "process" is refused
when the handler is decorated."""

from __future__ import annotations

from typing import get_args

import pytest

from consumer.tasks import Isolation, Registry
from shared.core.errors import ConfigError, InvalidInput
from shared.runtime.settings import ConsumerSettings


def plain_handler(payload, ctx):
    return None


@pytest.mark.parametrize("bad", ["fork", "Process", "", 1, True, ["process"]])
def test_an_unknown_isolation_is_refused_at_decoration(bad):
    registry = Registry()
    with pytest.raises(InvalidInput, match=r"isolation of kind 'risky' must be 'thread' or "
                                           r"'process'.*got "):
        @registry.task("risky", isolation=bad)
        def risky(payload, ctx):
            return None
    assert registry.kinds() == [], "nothing registered"


def test_a_kinds_own_isolation_wins_and_the_others_follow_the_consumer():
    registry = Registry()
    registry.add("risky", plain_handler, isolation="process")
    registry.add("local", plain_handler, isolation="thread")
    registry.add("plain", plain_handler)
    assert [t.isolation for t in registry.tasks()] == ["thread", None, "process"]
    assert [t.kind for t in registry.process_isolated("thread")] == ["risky"]
    assert [t.kind for t in registry.process_isolated("process")] == ["plain", "risky"]
    plain, local = registry.get("plain"), registry.get("local")
    assert plain is not None and plain.runs_in("process") == "process"
    assert local is not None and local.runs_in("process") == "thread"


def test_the_kind_and_the_consumer_setting_take_the_same_values():
    field = ConsumerSettings.model_fields["isolation"]
    assert get_args(field.annotation) == get_args(Isolation)


def test_a_kill_grace_as_long_as_the_lease_is_refused_for_process_isolated_kinds_too():
    settings = ConsumerSettings.load(kill_grace_seconds=5, lease_seconds=3, heartbeat_seconds=1)
    problem = settings.kill_grace_problem("process-isolated kind(s) ['risky']")
    assert problem is not None
    error = ConsumerSettings.refused(problem)
    assert isinstance(error, ConfigError)
    assert str(error) == (
        "invalid settings:\n  TOCK_LEASE_SECONDS, TOCK_KILL_GRACE_SECONDS: kill_grace_seconds "
        "(5.0) must be under lease_seconds (3.0) with process-isolated kind(s) ['risky'], so "
        "a handler past its deadline is killed before its job is left to expire")
    assert settings.model_copy(update={"kill_grace_seconds": 2.9}).kill_grace_problem("x") \
        is None
