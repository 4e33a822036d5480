"""Which jobs an operator means: the filter behind the dashboard's job list, `tock jobs`
and the bulk actions, validated from loose input. Pure; the store turns it into SQL."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.core import validation
from shared.core.errors import InvalidInput
from shared.core.states import ACTIVE_STATES, FINAL_STATES, JobState
from shared.core.text import shown

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50

RETRYABLE_STATES = (JobState.DEAD, JobState.CANCELLED)
UNFINISHED_STATES = ACTIVE_STATES
FINISHED_STATES = FINAL_STATES
CANCELLABLE_STATES = ACTIVE_STATES


@dataclass(frozen=True)
class JobFilter:
    """Which jobs an operator means. Empty fields do not filter. Build with `JobFilter.of`
    to validate loose input."""

    states: tuple[JobState, ...] = ()
    kind: str | None = None
    queue: str | None = None
    tenant: str | None = None
    key: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    @classmethod
    def of(cls, *, states: object = None, kind: object = None, queue: object = None,
           tenant: object = None, key: object = None, created_after: object = None,
           created_before: object = None) -> JobFilter:
        """Validate every field; raise `InvalidInput` naming the one that is wrong."""
        where = cls(
            states=parse_states(states),
            kind=validation.kind(kind) if kind not in (None, "") else None,
            queue=validation.queue(queue) if queue not in (None, "") else None,
            tenant=validation.tenant(tenant or None),
            key=validation.optional_text("key", key or None, validation.MAX_KEY_LENGTH),
            created_after=(validation.aware("created_after", created_after)
                           if created_after is not None else None),
            created_before=(validation.aware("created_before", created_before)
                            if created_before is not None else None),
        )
        after, before = where.created_after, where.created_before
        if after is not None and before is not None and after >= before:
            raise InvalidInput(f"created_after ({after.isoformat()}) is not earlier than "
                               f"created_before ({before.isoformat()}): no job could match")
        return where

    def is_empty(self) -> bool:
        return self == JobFilter()

    def describe(self) -> str:
        """The filter in words, for confirmations and logs."""
        parts = []
        if self.states:
            parts.append("state " + "/".join(s.value for s in self.states))
        for name in ("kind", "queue", "tenant", "key"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value}")
        if self.created_after:
            parts.append(f"created after {self.created_after.isoformat()}")
        if self.created_before:
            parts.append(f"created before {self.created_before.isoformat()}")
        return ", ".join(parts) or "all jobs"


def parse_states(value: object) -> tuple[JobState, ...]:
    """States from a list or a comma-separated string; unknown names are refused."""
    if value is None or value in ("", []):
        return ()
    items: list[object]
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise InvalidInput(f"state must be a state name or a list of them, got {shown(value)}")
    out: list[JobState] = []
    for item in items:
        try:
            state = JobState(item) if isinstance(item, str) else None
        except ValueError:
            state = None
        if state is None:
            raise InvalidInput(
                f"unknown state {item!r}; states are {', '.join(s.value for s in JobState)}"
            ) from None
        if state not in out:
            out.append(state)
    return tuple(out)


def page_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"limit must be an integer, got {shown(value)}")
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE_SIZE}, got {value}")
    return value


def action_states(action: str) -> tuple[JobState, ...]:
    """The states a bulk action applies to, whatever else a filter says."""
    if action == "retry":
        return RETRYABLE_STATES
    if action == "cancel":
        return CANCELLABLE_STATES
    raise InvalidInput(f"unknown bulk action {action!r}; use retry or cancel")
