"""Fairness measures for the simulator: weighted max-min fair shares and Jain's index."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def fair_shares(
    demands: Mapping[str, float], capacity: float, weights: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Weighted max-min fair shares (water-filling) of `capacity` among tenants that
    demand something: nobody gets more than it asks for, the rest is split by weight.

    Example:
        >>> fair_shares({"a": 2, "b": 10, "c": 10}, 12)
        {'a': 2, 'b': 5.0, 'c': 5.0}
    """
    weights = weights or {}
    active = {t: d for t, d in demands.items() if d > 0}
    shares: dict[str, float] = {}
    remaining = float(capacity)
    while active:
        wsum = sum(weights.get(t, 1.0) for t in active)
        level = remaining / wsum
        satisfied = [t for t, d in active.items() if d <= level * weights.get(t, 1.0)]
        if not satisfied:
            for t in active:
                shares[t] = level * weights.get(t, 1.0)
            break
        for t in satisfied:
            shares[t] = active.pop(t)
            remaining -= shares[t]
    return {t: shares[t] for t in demands if t in shares}


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one
    value holds everything.

    Example:
        >>> jain_index([1, 1, 1]), round(jain_index([1, 0, 0]), 3)
        (1.0, 0.333)
    """
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def normalized_shares(
    allocations: Mapping[str, float],
    demands: Mapping[str, float],
    capacity: float,
    weights: Mapping[str, float] | None = None,
) -> list[float]:
    """Each active tenant's allocation over its max-min fair share (1.0 = exactly fair)."""
    shares = fair_shares(demands, capacity, weights)
    return [allocations.get(t, 0.0) / s for t, s in shares.items() if s > 0]
