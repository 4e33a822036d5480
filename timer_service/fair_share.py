"""How one dispatch pass shares its batch out, within one priority level.

Tenants share the batch in proportion to their weights (largest remainder), never less
than one slot each. With the dispatch window on, the jobs each tenant already has waiting
in SQS count as slots it holds: the batch tops the tenants up towards equal (weighted)
shares of what is in SQS, so a newcomer's jobs go out before more of a busy tenant's,
which they would otherwise wait behind. A tenant's share is spread over the (kind, queue)
lanes it has due, in turn. No kind, no tenant and no lane gets more than its limit (a
lane's: its dispatch window) leaves room for. When there are more tenants than slots, a
cursor carries the round on from the last tenant served, so every tenant is reached
within ceil(tenants / batch) passes whatever its backlog.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

Lane = tuple[str, str]
"""(kind, queue): what the dispatch window holds back."""
Pair = tuple[str, str, str, int]
"""(kind, queue, tenant, weight) with due work; '' is the tenant of tenantless jobs."""
Quota = tuple[str, str, str, int]
"""(kind, queue, tenant, jobs to claim)."""

UNBOUNDED = 1 << 62


def quotas(tenants: Sequence[tuple[str, int]], capacity: int,
           waiting: Mapping[str, int] | None = None,
           held: AbstractSet[str] = frozenset()) -> list[tuple[str, int]]:
    """Split `capacity` slots between (tenant, weight) pairs in proportion to the weights
    (largest remainder), with at least one slot each. Tenants past `capacity` get nothing
    (the caller walks at most that many).

    `waiting` (jobs of each tenant already in SQS) fills the shares like water: the slots
    go to the tenants with the fewest waiting per weight, until (waiting + slots) / weight
    is level, so with nothing waiting the split is the plain proportional one.

    `held` tenants (the dispatch window holds them: consumers are behind on their jobs in
    SQS) get no slot, but their jobs in SQS still set the level, and their shares go to no
    one: a tenant sends while it is under their level (per weight), not the whole batch
    because the others are held, so what SQS hands out in order stays in the weights'
    proportion. Nor does a tenant levelled to nothing beside them keep a slot."""
    tenants = list(tenants)[:capacity]
    if not tenants:
        return []
    shares = _levelled(tenants, capacity, waiting or {})
    open_ = [tenant not in held for tenant, _ in tenants]
    shares = [share if open_[i] else 0.0 for i, share in enumerate(shares)]
    split = [int(share) for share in shares]
    # The slots lost to rounding down go to the biggest fractions (ties: heavier first).
    order = sorted(range(len(tenants)), key=lambda i: (split[i] - shares[i], -tenants[i][1]))
    given = capacity if all(open_) else min(capacity, int(sum(shares) + 1e-9))
    for i in [i for i in order if open_[i]][:given - sum(split)]:
        split[i] += 1
    # Everyone gets a slot: a light tenant's comes from the largest share (beside held
    # tenants, only one under their level, and only while a share has one to spare).
    everyone_open = all(open_)
    for i in range(len(split)):
        if split[i] != 0 or not open_[i] or not (everyone_open or shares[i] > 0):
            continue
        donor = max(range(len(split)), key=split.__getitem__)
        if everyone_open or split[donor] > 1:
            split[donor] -= 1
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
    seen: set[tuple[str, str, str]] = set()
    tenants: list[str] = []
    for kind, queue, tenant, weight in [*after, *(p for p in wrapped
                                                   if cursor is None or p[2] <= cursor)]:
        if (kind, queue, tenant) in seen:
            continue
        if tenant not in tenants:
            if len(tenants) >= limit:
                continue
            tenants.append(tenant)
        seen.add((kind, queue, tenant))
        walk.append((kind, queue, tenant, weight))
    # In tenant order of the round (the walk comes lane by lane).
    rank = {tenant: i for i, tenant in enumerate(_round_order(tenants, cursor))}
    return sorted(walk, key=lambda p: rank[p[2]])


def _round_order(tenants: list[str], cursor: str | None) -> list[str]:
    later = sorted(t for t in tenants if cursor is None or t > cursor)
    return later + sorted(t for t in tenants if cursor is not None and t <= cursor)


def plan(pairs: Sequence[Pair], capacity: int, *, kind_room: Mapping[str, int],
         tenant_room: Mapping[str, int], lane_room: Mapping[Lane, int] | None = None,
         pair_room: Mapping[tuple[str, str, str], int] | None = None, turn: int = 0,
         in_sqs: Mapping[tuple[str, str, str], int] | None = None,
         held: AbstractSet[tuple[str, str, str]] = frozenset()) -> list[Quota]:
    """Slots per (kind, queue, tenant) for one claim: tenants' weighted shares of
    `capacity` (levelled over the jobs of these lanes each has in SQS, `in_sqs`), each
    spread over its lanes, one slot at a time round the tenants (starting at `turn`, which
    the caller advances each pass, so a limit with room for one job does not always go to
    the same tenant), never past a kind's, a tenant's, a lane's or a (kind, queue,
    tenant)'s room (`pair_room`: the dispatch window's pace; absent: no bound). The
    (kind, queue, tenant) in `held` get nothing, but level the others (see `quotas`)."""
    lanes_of: dict[str, list[Lane]] = {}
    weights: dict[str, int] = {}
    for kind, queue, tenant, weight in pairs:
        lanes = lanes_of.setdefault(tenant, [])
        if (kind, queue, tenant) not in held:
            lanes.append((kind, queue))
        weights[tenant] = weight
    tenants = list(lanes_of)
    if not any(lanes_of.values()) or capacity <= 0:
        return []
    waiting: Counter[str] = Counter()
    if in_sqs:
        for kind, queue, tenant, _ in pairs:
            waiting[tenant] += in_sqs.get((kind, queue, tenant), 0)
    shut = {tenant for tenant, lanes in lanes_of.items() if not lanes}
    left = {tenant: min(n, tenant_room.get(tenant, UNBOUNDED))
            for tenant, n in quotas([(t, weights[t]) for t in tenants], capacity, waiting,
                                    shut)}
    kinds_left = {kind: kind_room.get(kind, UNBOUNDED) for kind, _, _, _ in pairs}
    lanes_left = {(kind, queue): (lane_room or {}).get((kind, queue), UNBOUNDED)
                  for kind, queue, _, _ in pairs}
    triples_left = {(kind, queue, tenant): (pair_room or {}).get((kind, queue, tenant),
                                                                 UNBOUNDED)
                    for kind, queue, tenant, _ in pairs}
    nexts = dict.fromkeys(tenants, 0)
    order = [tenants[(turn + i) % len(tenants)] for i in range(len(tenants))
             if tenants[(turn + i) % len(tenants)] in left]
    assigned: Counter[tuple[str, str, str]] = Counter()
    active = [t for t in order if left[t] > 0]
    while active:
        still = []
        for tenant in active:
            lanes = lanes_of[tenant]
            for step in range(len(lanes)):  # this tenant's next lane with room
                lane = lanes[(nexts[tenant] + step) % len(lanes)]
                triple = (lane[0], lane[1], tenant)
                if kinds_left[lane[0]] > 0 and lanes_left[lane] > 0 and triples_left[triple] > 0:
                    assigned[triple] += 1
                    kinds_left[lane[0]] -= 1
                    lanes_left[lane] -= 1
                    triples_left[triple] -= 1
                    left[tenant] -= 1
                    nexts[tenant] = (nexts[tenant] + step + 1) % len(lanes)
                    if left[tenant] > 0:
                        still.append(tenant)
                    break
        active = still
    return [(kind, queue, tenant, n) for (kind, queue, tenant), n in assigned.items()]


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
