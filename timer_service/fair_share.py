"""How one dispatch pass shares its batch out, within one priority level.

Tenants share the batch in proportion to their weights (largest remainder), never less
than one slot each. With the dispatch window on, the jobs each tenant already has waiting
in SQS count as slots it holds: the batch tops the tenants up towards equal (weighted)
shares of what is in SQS, so a newcomer's jobs go out before more of a busy tenant's,
which they would otherwise wait behind. A tenant's share is spread over the kinds it has
due, in turn. No kind and no tenant gets more than its limit leaves room for. When there
are more tenants than slots, a cursor carries the round on from the last tenant served,
so every tenant is reached within ceil(tenants / batch) passes whatever its backlog.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

Pair = tuple[str, str, int]
"""(kind, tenant, weight) with due work; '' is the tenant of tenantless jobs."""
Quota = tuple[str, str, int]
"""(kind, tenant, jobs to claim)."""

UNBOUNDED = 1 << 62


def quotas(tenants: Sequence[tuple[str, int]], capacity: int,
           waiting: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """Split `capacity` slots between (tenant, weight) pairs in proportion to the weights
    (largest remainder), with at least one slot each. Tenants past `capacity` get nothing
    (the caller walks at most that many).

    `waiting` (jobs of each tenant already in SQS) fills the shares like water: the slots
    go to the tenants with the fewest waiting per weight, until (waiting + slots) / weight
    is level, so with nothing waiting the split is the plain proportional one."""
    tenants = list(tenants)[:capacity]
    if not tenants:
        return []
    shares = _levelled(tenants, capacity, waiting or {})
    split = [int(share) for share in shares]
    # The slots lost to rounding down go to the biggest fractions (ties: heavier first).
    order = sorted(range(len(tenants)), key=lambda i: (split[i] - shares[i], -tenants[i][1]))
    for i in order[:capacity - sum(split)]:
        split[i] += 1
    # Everyone gets a slot: a light tenant's comes from the largest share.
    for i in range(len(split)):
        if split[i] == 0:
            split[max(range(len(split)), key=split.__getitem__)] -= 1
            split[i] = 1
    return [(tenant, split[i]) for i, (tenant, _) in enumerate(tenants)]


def _levelled(tenants: list[tuple[str, int]], capacity: int,
              waiting: Mapping[str, int]) -> list[float]:
    """Real-valued shares s_i = max(0, level * w_i - waiting_i) that add up to `capacity`
    (water filling: the level rises over the least-loaded tenants first)."""
    load = [max(waiting.get(tenant, 0), 0) for tenant, _ in tenants]
    if not any(load):
        total_weight = sum(weight for _, weight in tenants)
        return [capacity * weight / total_weight for _, weight in tenants]
    by_level = sorted(range(len(tenants)), key=lambda i: load[i] / tenants[i][1])
    weight_sum = load_sum = 0.0
    level = 0.0
    for n, i in enumerate(by_level):
        weight_sum += tenants[i][1]
        load_sum += load[i]
        level = (capacity + load_sum) / weight_sum
        after = by_level[n + 1] if n + 1 < len(by_level) else None
        if after is None or level <= load[after] / tenants[after][1]:
            break
    return [max(level * weight - load[i], 0.0) for i, (_, weight) in enumerate(tenants)]


def round_from(after: Sequence[Pair], wrapped: Sequence[Pair], cursor: str | None,
               limit: int) -> list[Pair]:
    """The pairs of one pass: those of tenants after `cursor`, then of tenants from the
    first key up to the cursor, each pair once, at most `limit` distinct tenants."""
    walk: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    tenants: list[str] = []
    for kind, tenant, weight in [*after, *(p for p in wrapped
                                            if cursor is None or p[1] <= cursor)]:
        if (kind, tenant) in seen:
            continue
        if tenant not in tenants:
            if len(tenants) >= limit:
                continue
            tenants.append(tenant)
        seen.add((kind, tenant))
        walk.append((kind, tenant, weight))
    # In tenant order of the round (the walk comes kind by kind).
    rank = {tenant: i for i, tenant in enumerate(_round_order(tenants, cursor))}
    return sorted(walk, key=lambda p: rank[p[1]])


def _round_order(tenants: list[str], cursor: str | None) -> list[str]:
    later = sorted(t for t in tenants if cursor is None or t > cursor)
    return later + sorted(t for t in tenants if cursor is not None and t <= cursor)


def plan(pairs: Sequence[Pair], capacity: int, *, kind_room: Mapping[str, int],
         tenant_room: Mapping[str, int], turn: int = 0,
         in_sqs: Mapping[tuple[str, str], int] | None = None) -> list[Quota]:
    """Slots per (kind, tenant) for one claim: tenants' weighted shares of `capacity`
    (levelled over the jobs of these kinds each has in SQS, `in_sqs`), each spread over
    its kinds, one slot at a time round the tenants (starting at `turn`, which
    the caller advances each pass, so a limit with room for one job does not always go to
    the same tenant), never past a kind's or a tenant's room (absent: no bound)."""
    kinds_of: dict[str, list[str]] = {}
    weights: dict[str, int] = {}
    for kind, tenant, weight in pairs:
        kinds_of.setdefault(tenant, []).append(kind)
        weights[tenant] = weight
    tenants = list(kinds_of)
    if not tenants or capacity <= 0:
        return []
    waiting: Counter[str] = Counter()
    if in_sqs:
        for kind, tenant, _ in pairs:
            waiting[tenant] += in_sqs.get((kind, tenant), 0)
    left = {tenant: min(n, tenant_room.get(tenant, UNBOUNDED))
            for tenant, n in quotas([(t, weights[t]) for t in tenants], capacity, waiting)}
    kinds_left = {kind: kind_room.get(kind, UNBOUNDED) for kind, _, _ in pairs}
    nexts = dict.fromkeys(tenants, 0)
    order = [tenants[(turn + i) % len(tenants)] for i in range(len(tenants))
             if tenants[(turn + i) % len(tenants)] in left]
    assigned: Counter[tuple[str, str]] = Counter()
    active = [t for t in order if left[t] > 0]
    while active:
        still = []
        for tenant in active:
            kinds = kinds_of[tenant]
            for step in range(len(kinds)):  # this tenant's next kind with room
                kind = kinds[(nexts[tenant] + step) % len(kinds)]
                if kinds_left[kind] > 0:
                    assigned[(kind, tenant)] += 1
                    kinds_left[kind] -= 1
                    left[tenant] -= 1
                    nexts[tenant] = (nexts[tenant] + step + 1) % len(kinds)
                    if left[tenant] > 0:
                        still.append(tenant)
                    break
        active = still
    return [(kind, tenant, n) for (kind, tenant), n in assigned.items()]


def per_key(rooms: Sequence[tuple[str, int]], capacity: int) -> list[tuple[str, int]]:
    """Jobs to claim per concurrency key: one per key in turn (in the walk's order), never
    past a key's room, at most `capacity` in all."""
    left = {key: room for key, room in rooms if room > 0}
    given: Counter[str] = Counter()
    total = 0
    while left and total < capacity:
        for key in list(left):
            if total >= capacity:
                break
            given[key] += 1
            total += 1
            left[key] -= 1
            if not left[key]:
                del left[key]
    return list(given.items())
