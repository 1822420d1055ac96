"""The Wilcoxon signed-rank test and the Hodges–Lehmann interval that inverts it: one procedure.

For paired log differences d₁…dₙ (log candidate − log baseline, one per round), the M = n(n+1)/2
*Walsh averages* (dᵢ + dⱼ)/2, i ≤ j, carry everything:

- the **estimate** is their median (Hodges–Lehmann);
- the **test** of "the location is δ" counts the Walsh averages on each side of δ: with no ties the
  number above δ is exactly the signed-rank statistic T⁺ of the differences dᵢ − δ, whose null
  distribution (each sign ± with probability ½) is exact and computed here;
- the **interval** at level 1 − α is [W₍c+1₎, W₍M−c₎], the sorted Walsh averages with c the largest
  count such that 2·P(T ≤ c) < α. It holds exactly the δ the test does not reject.

So p(δ) < α exactly when δ lies outside the closed interval (:func:`p_value` counts the Walsh
averages ≤ δ and ≥ δ; ties with δ count on both sides, which keeps the two consistent and the test
conservative), and a verdict read from the interval can never disagree with the test. With no ties
:func:`p_value` at δ = 0 is the exact two-sided p of ``scipy.stats.wilcoxon(d, method="exact")``
(tested); scipy has no public signed-rank distribution or inversion, so the null distribution is the
few lines of :func:`null_cdf`. Coverage is exact (≥ 1 − α, by the discreteness) for any continuous
distribution of d symmetric about its centre, which paired differences of exchangeable arms are;
tests/pairbench/test_stats_simulation.py checks it on noise resampled from real runs.

References: Hollander, Wolfe & Chicken, *Nonparametric Statistical Methods* (3rd ed.), §3.1–3.3;
Bauer (1972), "Constructing confidence sets using rank statistics", JASA 67.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

MAX_N = 2000  # the exact distribution costs O(n³); rounds are capped far below this


@lru_cache(maxsize=256)
def _cdf(n: int) -> tuple[float, ...]:
    pmf = np.ones(1)
    for i in range(1, n + 1):  # generating function prod (1 + x^i) / 2
        nxt = np.zeros(pmf.size + i)
        nxt[:pmf.size] += pmf
        nxt[i:] += pmf
        pmf = nxt / 2.0
    return tuple(np.minimum(np.cumsum(pmf), 1.0))


def null_cdf(n: int) -> np.ndarray:
    """P(T ≤ k), k = 0 … n(n+1)/2, of the signed-rank statistic of n non-zero differences."""
    if not 0 <= n <= MAX_N:
        raise ValueError(f"signed-rank distribution: n must lie in [0, {MAX_N}], got {n}")
    return np.asarray(_cdf(n))


def two_sided(n: int, k: int) -> float:
    """min(1, 2·P(T ≤ k)): the two-sided p of a count of k on the smaller side."""
    if k < 0:
        return 0.0
    cdf = null_cdf(n)
    return float(min(1.0, 2.0 * cdf[min(k, cdf.size - 1)]))


def critical_count(n: int, alpha: float) -> int:
    """The largest c with 2·P(T ≤ c) < alpha; −1 when even c = 0 does not qualify (too few pairs:
    the interval is then unbounded and no δ can be rejected)."""
    cdf = null_cdf(n)
    return int(np.searchsorted(2.0 * cdf, alpha, side="left")) - 1


def min_attainable_p(n: int) -> float:
    """Smallest two-sided p with n differences: 2·2⁻ⁿ = 2¹⁻ⁿ (0.0625 at n = 5, 0.03125 at n = 6)."""
    return 1.0 if n <= 0 else min(1.0, 2.0 ** (1 - n))


@lru_cache(maxsize=256)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The index pairs i ≤ j of n values (cached: the adaptive rule's simulation asks for them often)."""
    return np.triu_indices(n)


def walsh(d: np.ndarray) -> np.ndarray:
    """The sorted Walsh averages (dᵢ + dⱼ)/2, i ≤ j."""
    d = np.asarray(d, dtype=float)
    i, j = _pairs(d.size)
    return np.sort((d[i] + d[j]) / 2.0)


def hodges_lehmann(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """One-sample Hodges–Lehmann estimate: the median of the Walsh averages (vectorised along *axis*)."""
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    i, j = np.triu_indices(x.shape[-1])
    return np.median((x[..., i] + x[..., j]) / 2.0, axis=-1)


def interval(w: np.ndarray, n: int, alpha: float) -> tuple[float, float]:
    """[W₍c+1₎, W₍M−c₎] from sorted Walsh averages *w* of n differences; (−inf, inf) when c < 0."""
    c = critical_count(n, alpha)
    if c < 0 or w.size == 0:
        return -math.inf, math.inf
    return float(w[c]), float(w[w.size - 1 - c])


def counts(w: np.ndarray, delta: float) -> tuple[int, int]:
    """(#W ≤ δ, #W ≥ δ) of sorted Walsh averages *w*."""
    return int(np.searchsorted(w, delta, side="right")), int(w.size - np.searchsorted(w, delta, side="left"))


def p_value(w: np.ndarray, n: int, delta: float = 0.0) -> float:
    """Two-sided p of "the location is δ": min(1, 2·P(T ≤ min(#W ≤ δ, #W ≥ δ)))."""
    if w.size == 0:
        return 1.0
    below, above = counts(w, delta)
    return two_sided(n, min(below, above))


def p_above(w: np.ndarray, n: int, bound: float) -> float:
    """The smallest α at which the whole interval lies above *bound* (low end > bound)."""
    return two_sided(n, counts(w, bound)[0]) if w.size else 1.0


def p_below(w: np.ndarray, n: int, bound: float) -> float:
    """The smallest α at which the whole interval lies below *bound* (high end < bound)."""
    return two_sided(n, counts(w, bound)[1]) if w.size else 1.0
