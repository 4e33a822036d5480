"""How one dispatch pass shares its batch between tenants.

Each tenant with due work at a priority level gets a share of the batch in proportion to
its weight (largest remainder), and never less than one slot. When there are more tenants than
slots, a cursor carries the round on from the last tenant served, so every tenant is
reached within ceil(tenants / batch) passes whatever its backlog.
"""

from __future__ import annotations

from collections.abc import Sequence


def quotas(tenants: Sequence[tuple[str, int]], capacity: int) -> list[tuple[str, int]]:
    """Split `capacity` slots between (tenant, weight) pairs in proportion to the weights
    (largest remainder), with at least one slot each. Tenants past `capacity` get nothing
    (the caller walks at most that many)."""
    tenants = list(tenants)[:capacity]
    if not tenants:
        return []
    total_weight = sum(weight for _, weight in tenants)
    shares = [capacity * weight / total_weight for _, weight in tenants]
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


def round_from(after: Sequence[tuple[str, int]], wrapped: Sequence[tuple[str, int]],
               cursor: str | None, limit: int) -> list[tuple[str, int]]:
    """The tenants of one pass: those after `cursor`, then from the first key up to the
    cursor, at most `limit` of them, each once."""
    walk = list(after)
    seen = {tenant for tenant, _ in walk}
    for tenant, weight in wrapped:
        if len(walk) >= limit:
            break
        if tenant in seen or (cursor is not None and tenant > cursor):
            continue
        walk.append((tenant, weight))
        seen.add(tenant)
    return walk[:limit]
