"""Is a change between two sets of step times real? Medians, IQRs and a Mann-Whitney U test.

Why a rank test: a profile records few steps (often 4-10), and step times are
skewed (a garbage collection, a slow batch, a checkpoint make one step several
times longer). A t-test assumes normal data and lets one such step swing the
mean; Mann-Whitney compares ranks only, so it needs no distribution and one
outlier moves it by one rank. With few steps the p-value is exact (counted
over every ordering of the two samples); with ties or many steps it uses the
normal approximation with the tie correction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["min_p_value", "mann_whitney_p", "quantile"]

# Exact counting costs O((n1 + n2) * n1 * n1 * n2); beyond this the normal approximation is within 1e-3.
_EXACT_MAX_PRODUCT = 400


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _u_counts(n1: int, n2: int) -> list[int]:
    """How many orderings of n1 + n2 distinct values give U = 0, 1, ..., n1 * n2.

    The coefficients of the Gaussian binomial [n1 + n2 choose n1]_q, built with
    C(n, k) = C(n - 1, k - 1) + q^k C(n - 1, k).
    """
    rows: list[list[int]] = [[1]] + [[0] for _ in range(n1)]  # rows[k]: polynomial C(n, k) for the current n
    for n in range(1, n1 + n2 + 1):
        for k in range(min(n, n1), 0, -1):
            with_last = rows[k - 1]
            without_last = [0] * k + rows[k] if n - 1 >= k else []
            size = max(len(with_last), len(without_last))
            rows[k] = [
                (with_last[i] if i < len(with_last) else 0) + (without_last[i] if i < len(without_last) else 0)
                for i in range(size)
            ]
    return rows[n1]


def min_p_value(n1: int, n2: int) -> float:
    """The smallest two-sided p-value any two samples of these sizes can reach (both fully apart)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value that ``a`` and ``b`` come from the same distribution."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    tie_term = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        tied = j - i + 1
        tie_term += tied**3 - tied
        i = j + 1
    rank_sum_a = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = rank_sum_a - n1 * (n1 + 1) / 2
    if tie_term == 0 and n1 * n2 <= _EXACT_MAX_PRODUCT:
        counts = _u_counts(n1, n2)
        total = sum(counts)
        u_int = round(u)
        lower = sum(counts[: u_int + 1]) / total
        upper = sum(counts[u_int:]) / total
        return min(1.0, 2 * min(lower, upper))
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
