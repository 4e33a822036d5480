"""`FlowStore`: the timer's claim with fair share and limits, and the tables that set
them (shared.store.flow_sql). Use it on the dispatcher's transaction (`sibling`), so the
limits' locks last until the claim commits after the send."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from shared.core.reports import LimitInfo
from shared.core.states import JobState
from shared.store import flow_sql as sql
from shared.store.base import Row, Store
from shared.store.counts_sql import UNFINISHED_EXACT_UP_TO
from shared.store.rows import DueJob, LimitRoom


class FlowStore(Store):
    # --- the claim ----------------------------------------------------------------------

    def due_levels(self, now: datetime | None = None) -> list[int]:
        """Priority levels with a due job, highest first."""
        return [r[0] for r in self._rows(sql.DUE_LEVELS, {"now": now})]

    def due_pairs(self, level: int, per_kind: int, *, after: str | None = None,
                  skip_kinds: Sequence[str] = (), skip_tenants: Sequence[str] = (),
                  skip_lanes: Collection[tuple[str, str]] = (),
                  now: datetime | None = None) -> list[tuple[str, str, str, int]]:
        """(kind, queue, tenant, weight) with due jobs at `level`: in each (kind, queue)
        lane not skipped (by its kind or as a lane), up to `per_kind` tenants not skipped,
        in key order after `after` (from the first when None). '' is the tenant of
        tenantless jobs."""
        statement = sql.DUE_PAIRS_FROM if after is None else sql.DUE_PAIRS_AFTER
        lanes = list(skip_lanes)
        rows = self._rows(statement, {
            "level": level, "per_kind": per_kind, "after": after or "",
            "skip_kinds": list(skip_kinds), "skip_tenants": list(skip_tenants),
            "skip_lane_kinds": [lane[0] for lane in lanes],
            "skip_lane_queues": [lane[1] for lane in lanes], "now": now})
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def claim_pairs(self, level: int, quotas: Sequence[tuple[str, str, str, int]],
                    now: datetime | None = None, *,
                    unkeyed: Collection[str] = (),
                    floors: Mapping[tuple[str, str, str], tuple[datetime, int]] | None = None
                    ) -> list[DueJob]:
        """Claim up to each (kind, queue, tenant)'s quota of its oldest due jobs at `level`
        (dispatched, fresh tokens, SKIP LOCKED); of the kinds in `unkeyed`, only jobs
        without a concurrency key; of a pair in `floors`, only jobs after its (run_at, id)
        there."""
        starts = [(floors or {}).get((q[0], q[1], q[2])) for q in quotas]
        rows = self._rows(sql.CLAIM_PAIRS, {
            "level": level, "kinds": [q[0] for q in quotas], "queues": [q[1] for q in quotas],
            "tenants": [q[2] for q in quotas], "quotas": [q[3] for q in quotas],
            "unkeyed": [q[0] in unkeyed for q in quotas],
            "floor_ats": [f[0] if f else None for f in starts],
            "floor_ids": [f[1] if f else None for f in starts], "now": now})
        return _due_jobs(rows, level)

    def key_rooms(self, level: int, pair: tuple[str, str, str], *, after: str, walk: int,
                  now: datetime | None = None) -> list[tuple[str, bool, int | None]]:
        """The next `walk` concurrency keys after `after` ('' : from the first) with due
        or future work of `pair` (kind, queue, tenant) at `level`: (key, has due jobs now,
        jobs of the key in flight when it has)."""
        kind, queue, tenant = pair
        rows = self._rows(sql.KEY_ROOMS, {"level": level, "kind": kind, "queue": queue,
                                          "tenant": tenant, "after": after, "walk": walk,
                                          "now": now})
        return [(r[0], r[1], r[2]) for r in rows]

    def claim_keys(self, level: int, pair: tuple[str, str, str],
                   quotas: Sequence[tuple[str, int]],
                   now: datetime | None = None) -> list[DueJob]:
        """Claim up to each concurrency key's quota of the oldest due jobs of `pair` (kind,
        queue, tenant) at `level`."""
        kind, queue, tenant = pair
        rows = self._rows(sql.CLAIM_KEYS, {
            "level": level, "kind": kind, "queue": queue, "tenant": tenant,
            "keys": [q[0] for q in quotas], "quotas": [q[1] for q in quotas], "now": now})
        return _due_jobs(rows, level)

    def limit_rooms(self, now: datetime | None = None) -> list[LimitRoom]:
        """Every limit's room for this claim. Takes each limit's lock for the rest of the
        transaction when it is free; a limit another timer holds has no room."""
        locks = self._rows(sql.LOCK_LIMITS)
        mine = [(r[0], r[1]) for r in locks if r[2]]
        rooms = [LimitRoom(r[0], r[1], None, None, None, None, False) for r in locks
                 if not r[2]]
        if mine:
            rows = self._rows(sql.LIMIT_ROOM, {"scopes": [m[0] for m in mine],
                                               "keys": [m[1] for m in mine], "now": now})
            rooms += [LimitRoom(r[0], r[1], r[2], r[3], r[4], r[5], True) for r in rows]
        return rooms

    def take_tokens(self, spent: Sequence[tuple[str, str, int]],
                    now: datetime | None = None) -> None:
        """Spend rate tokens: (scope, key, jobs claimed) for the rate-limited ones."""
        if spent:
            self._run(sql.TAKE_TOKENS, {"scopes": [s[0] for s in spent],
                                        "keys": [s[1] for s in spent],
                                        "counts": [s[2] for s in spent], "now": now})

    def in_sqs(self, cap: int, waited_seconds: float, now: datetime | None = None
               ) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Per (kind, queue, tenant): (jobs dispatched and not yet claimed, i.e. waiting in
        SQS, counted up to `cap` of each kind; how many of those were sent more than
        `waited_seconds` ago). Those with none are left out."""
        rows = self._rows(sql.IN_SQS, {"cap": cap, "age": waited_seconds, "now": now})
        return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}

    def kind_in_sqs(self, kind: str, cap: int) -> dict[str, int]:
        """Jobs of `kind` waiting in SQS by queue, most first, counted up to `cap` in all."""
        return {r[0]: int(r[1]) for r in self._rows(sql.KIND_IN_SQS, {"kind": kind,
                                                                        "cap": cap})}

    # --- configuration ------------------------------------------------------------------

    def set_limit(self, scope: str, key: str, *, max_running: int | None,
                  rate_per_second: float | None, burst: int | None,
                  now: datetime | None = None) -> None:
        """Create or replace the limit of one kind or tenant. Rate tokens carried over,
        up to the new burst."""
        self._run(sql.SET_LIMIT, {"scope": scope, "key": key, "max_running": max_running,
                                  "rate": rate_per_second, "burst": burst, "now": now})

    def remove_limit(self, scope: str, key: str) -> bool:
        return self._one(sql.DELETE_LIMIT, {"scope": scope, "key": key}) is not None

    def limits(self, scope: str | None = None, key: str | None = None,
               now: datetime | None = None, *,
               waiting_up_to: int = UNFINISHED_EXACT_UP_TO) -> list[LimitInfo]:
        """Every limit (or the one of `scope`/`key`) with its slots in use, tokens and
        due jobs waiting (counted up to `waiting_up_to`)."""
        rows = self._rows(sql.LIMITS, {"scope": scope, "key": key, "now": now,
                                       "bound": waiting_up_to})
        return [LimitInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6],
                          min(r[7], waiting_up_to), r[8], waiting_more=r[7] > waiting_up_to,
                          lingering=r[9] or 0)
                for r in rows]

    def key_limit(self, kind: str, concurrency_key: str, now: datetime | None = None, *,
                  waiting_up_to: int = UNFINISHED_EXACT_UP_TO) -> LimitInfo | None:
        """The kind_key limit of `kind` as one of its keys sees it (None: no such limit)."""
        row = self._one(sql.KEY_LIMIT, {"kind": kind, "ck": concurrency_key, "now": now,
                                        "bound": waiting_up_to})
        if row is None:
            return None
        return LimitInfo("kind_key", kind, row[0], None, None, row[1], None,
                         min(row[2], waiting_up_to), concurrency_key=concurrency_key,
                         waiting_more=row[2] > waiting_up_to, lingering=row[3])

    def set_tenant_weight(self, tenant: str, weight: int) -> None:
        """A tenant's share of each batch relative to the others (default 1)."""
        self._run(sql.SET_TENANT_WEIGHT, {"tenant": tenant, "weight": weight})

    def reset_tenant_weight(self, tenant: str) -> bool:
        """Back to the default weight of 1; False if it had none set."""
        return self._one(sql.DELETE_TENANT_WEIGHT, {"tenant": tenant}) is not None

    def tenant_weights(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self._rows(sql.TENANT_WEIGHTS)}


def _due_jobs(rows: Sequence[Row], level: int) -> list[DueJob]:
    """Claimed rows as DueJobs of priority `level` (the claims take one level at a time)."""
    return [DueJob(r[0], r[1], r[2], r[3], JobState(r[4]), float(r[5]), r[6], r[7], level)
            for r in rows]
