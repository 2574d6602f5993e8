"""When speculation stops paying: its expected speed-up, and the acceptance that breaks even."""

from __future__ import annotations


def speedup(acceptance: float, n_max: int, cost: float) -> float:
    """Expected speed-up of speculation over plain decoding (Leviathan et al., 2023, eq. 1).

    acceptance: chance a drafted token is accepted; n_max: tokens drafted per step; cost: one
    draft step's time relative to one target step (0 for n-gram lookup).
    """
    a = min(acceptance, 0.999)
    return (1 - a ** (n_max + 1)) / ((1 - a) * (n_max * cost + 1))


def break_even_acceptance(acceptance: float, speed_ratio: float, n_max: int) -> float | None:
    """Acceptance below which a speculative backend is slower than plain decoding.

    The draft cost is fitted so the model reproduces the measured speed ratio at the measured
    long-run acceptance; None when even perfect acceptance could not break even.
    """
    if speed_ratio <= 0:
        return None
    cost = max(0.0, (speedup(acceptance, n_max, 0.0) / speed_ratio - 1) / n_max)
    if speedup(0.999, n_max, cost) < 1:
        return None
    lo, hi = 0.0, 0.999
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid, n_max, cost) < 1 else (lo, mid)
    return hi
