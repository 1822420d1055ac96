"""SLO capacity: the highest load at which an SLO holds, per arm and round, and its paired ratio.

**Per arm and round** (:func:`capacity`): the levels' loads x₁ < … < xₖ (streams or requests/s) and
their SLO attainments y₁ … yₖ (:mod:`pairbench.analysis.loadlevel`), against the SLO's attainment
target a. The SLO *holds* at a level when y ≥ a. The capacity is the load at which the curve first
falls below the target as the load rises, linearly interpolated between the last level that holds,
xᵢ, and the first that fails, xᵢ₊₁:

    capacity = xᵢ + (yᵢ − a) / (yᵢ − yᵢ₊₁) · (xᵢ₊₁ − xᵢ)

That is "the highest load up to which the SLO holds throughout". A curve that fails at some level and
holds again above it (noise, or a scheduler that recovers) is marked ``non_monotone``; its capacity
stays at the first crossing, the conservative reading, and the report discloses it.

It is **never extrapolated**:

- the SLO holds at every level: the capacity is at least the highest level, *censored above*
  (``censored="above"``, ``value`` = xₖ, a lower bound);
- it already fails at the lowest level: the capacity is below it, *censored below*
  (``censored="below"``, ``value`` = x₁, an upper bound; the capacity is only known to be in (0, x₁)).

Pass only each round's own levels that passed their validity checks, and those where the engine
failed measured requests (there the SLO failed; :func:`pairbench.analysis.loadstats.capacity_rows`):
a level where the client was the limit says nothing about the engine.

**Paired across rounds** (:func:`compare`): per round, d = log(candidate / baseline capacity). With
both sides bounded d is a number, and the comparison is exactly :func:`pairbench.analysis.verdicts.judge`
on those d (the Hodges–Lehmann interval that inverts the exact Wilcoxon signed-rank test,
:mod:`pairbench.analysis.signrank`), with the verdicts ``more`` / ``less`` (capacity) /
``equivalent`` / ``inconclusive``.

**Censored rounds** give d only as an interval [d⁻, d⁺] (e.g. candidate ≥ x₁₀ = 8 and baseline 5.2:
d ∈ [log(8/5.2), +∞)). The rule chosen here: each end of the interval is computed with every
censored d at its own worst case, the low end with each d at d⁻ and the high end with each at d⁺.
Every Walsh average (dᵢ + dⱼ)/2 is non-decreasing in each dᵢ, so both order statistics
W₍c+1₎ and W₍M−c₎ are too: the conservative interval contains the interval the unknown true d would
give, and its coverage is at least theirs (≥ 1 − α). An end is unbounded when more than c Walsh
averages are infinite. The verdict is read from this interval by the same rules, so a claim is made
only when every value the censored rounds could take would make it. A candidate that always passes
the highest level while the baseline crosses inside can thus be called ``more`` ("at least Z%
more"); two arms that both pass every level are inconclusive, with the levels that would bracket
their capacity suggested (:func:`bracketing_levels`). ``claim_p`` is the matching conservative
p-value, for the Holm family.

tests/pairbench/test_capacity.py checks the interpolation and censoring by hand-computed values and,
by simulation, coverage ≥ 94% and false claims on identical arms ≤ alpha, censored rounds included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pairbench.analysis import signrank, verdicts

CAPACITY_WORDS = {"better": "more", "worse": "less"}
CENSORED = (None, "above", "below")


@dataclass(frozen=True)
class Capacity:
    """One arm's capacity in one round: a point, or a bound when censored (see the module doc)."""

    value: float
    censored: str | None = None            # None | "above" (capacity ≥ value) | "below" (capacity < value)
    bracket: tuple[float, float] | None = None  # the two levels the crossing lies between
    non_monotone: bool = False

    def __post_init__(self):
        if self.censored not in CENSORED:
            raise ValueError(f"capacity: censored must be one of {CENSORED}, got {self.censored!r}")

    def log_bounds(self) -> tuple[float, float]:
        """(low, high) of log(capacity): a point, [log x, +inf) above, (-inf, log x) below."""
        v = math.log(self.value)
        return {None: (v, v), "above": (v, math.inf), "below": (-math.inf, v)}[self.censored]

    def to_dict(self) -> dict:
        return {"capacity": self.value, "censored": self.censored,
                "bracket": list(self.bracket) if self.bracket else None, "non_monotone": self.non_monotone}

    @classmethod
    def from_dict(cls, d: dict) -> "Capacity":
        return cls(value=float(d["capacity"]), censored=d.get("censored"),
                   bracket=tuple(d["bracket"]) if d.get("bracket") else None, non_monotone=bool(d.get("non_monotone")))


def capacity(loads, attainment, target: float) -> Capacity:
    """The capacity of one arm in one round from its levels' *loads* and *attainment* (see module doc)."""
    x = [float(v) for v in loads]
    y = [float(v) for v in attainment]
    if not x or len(x) != len(y):
        raise ValueError(f"capacity: {len(x)} loads and {len(y)} attainments (need the same, at least one)")
    if any(not (math.isfinite(v) and v > 0) for v in x) or any(b <= a for a, b in zip(x, x[1:])):
        raise ValueError(f"capacity: loads must be positive and strictly increasing, got {x}")
    if any(not (0 <= v <= 1) for v in y):
        raise ValueError(f"capacity: attainments must lie in [0, 1], got {y}")
    if not 0 < target <= 1:
        raise ValueError(f"load.slo.attainment: must lie in (0, 1], got {target!r}")
    holds = [v >= target for v in y]
    if not holds[0]:
        return Capacity(x[0], "below", non_monotone=any(holds))
    i = holds.index(False) if False in holds else None
    if i is None:
        return Capacity(x[-1], "above")
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    value = x0 + (y0 - target) / (y0 - y1) * (x1 - x0)  # y0 >= target > y1, so y0 > y1
    return Capacity(value, None, bracket=(x0, x1), non_monotone=any(holds[i:]))


def log_ratio_bounds(base: Capacity, cand: Capacity) -> tuple[float, float]:
    """[d⁻, d⁺] of d = log(candidate / baseline) given each side's bounds (equal when both are points)."""
    blo, bhi = base.log_bounds()
    clo, chi = cand.log_bounds()
    return clo - bhi, chi - blo  # never nan: a low end is never +inf, a high end never -inf


@dataclass(frozen=True)
class _Bounds:
    lo: np.ndarray   # d⁻ per round
    hi: np.ndarray   # d⁺ per round

    @property
    def n(self) -> int:
        return int(self.lo.size)

    @property
    def censored(self) -> int:
        return int(np.count_nonzero(self.lo != self.hi))


def _bounds(base: list[Capacity], cand: list[Capacity]) -> _Bounds:
    if len(base) != len(cand):
        raise ValueError(f"capacity comparison: {len(base)} baseline rounds but {len(cand)} candidate rounds")
    pairs = [log_ratio_bounds(b, c) for b, c in zip(base, cand)]
    return _Bounds(np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float))


def claim_p(base: list[Capacity], cand: list[Capacity], noise: float) -> tuple[float, str | None]:
    """(p, claim): the smallest α at which the conservative interval would make its one possible claim
    (:func:`pairbench.analysis.verdicts.claim_p_between`, which is
    :func:`pairbench.analysis.verdicts.claim_p` when no round is censored)."""
    b = _bounds(base, cand)
    return verdicts.claim_p_between(signrank.walsh(b.lo), signrank.walsh(b.hi), b.n, noise, higher_is_better=True,
                                    words=CAPACITY_WORDS)


def _comparison(d: np.ndarray) -> verdicts.Comparison:
    return verdicts.Comparison(key=("load", "capacity"), d=d, higher_is_better=True, words=CAPACITY_WORDS)


def compare(base: list[Capacity], cand: list[Capacity], *, alpha: float, noise: float) -> dict:
    """The paired capacity ratio over rounds at interval level 1 − *alpha*, and its verdict
    (:func:`pairbench.analysis.verdicts.read_interval`, as every verdict).

    The keys of :func:`pairbench.analysis.verdicts.judge` (``ci_low``/``ci_high`` None where that end
    is unbounded; ``hl_ratio`` None when censoring leaves the estimate a range), plus
    ``n_censored``, ``hl_ratio_low``/``hl_ratio_high`` (the estimate's range) and ``censoring``
    (how many rounds each arm was censored above or below).
    """
    b = _bounds(base, cand)
    extra = {"n_censored": b.censored, "censoring": _censoring(base, cand)}
    if b.censored == 0:
        out = verdicts.judge(_comparison(b.lo), alpha=alpha, noise=noise)
        return {**out, **extra, "hl_ratio_low": out["hl_ratio"], "hl_ratio_high": out["hl_ratio"]}
    w_lo, w_hi = signrank.walsh(b.lo), signrank.walsh(b.hi)
    low, _ = signrank.interval(w_lo, b.n, alpha)
    _, high = signrank.interval(w_hi, b.n, alpha)
    est_lo, est_hi = float(np.median(w_lo)), float(np.median(w_hi))
    p = min(signrank.p_above(w_lo, b.n, 0.0), signrank.p_below(w_hi, b.n, 0.0))
    out = {"n_pairs": b.n, "ci_level": 1.0 - alpha, "hl_ratio": None, "hl_ratio_low": _exp(est_lo),
           "hl_ratio_high": _exp(est_hi), "ci_low": _exp(low), "ci_high": _exp(high), "half_width": None,
           "log_half_width": None, "detectable_change": None, "rounds_needed": None, "p_value": p,
           "min_attainable_p": signrank.min_attainable_p(b.n), **extra}
    where = f"{b.censored} of {b.n} rounds censored, each end taken at their worst case"
    reading = verdicts.read_interval(low, high, noise=noise, higher_is_better=True, words=CAPACITY_WORDS)
    if reading.claim:
        reason = f"{reading.reason} ({where})"
    else:
        reason = (f"the interval reaches past 1 ± {noise:g} once the censored rounds take their worst case "
                  f"({where}); measure levels that bracket the capacity")
    return {**out, "verdict": reading.verdict, "reason": reason}


def _exp(v: float) -> float | None:
    """exp of a log ratio; None for +inf (an unbounded high end); 0.0 for -inf (a ratio ≥ 0)."""
    return None if v == math.inf else math.exp(v)


def _censoring(base: list[Capacity], cand: list[Capacity]) -> dict:
    return {arm: {"above": sum(c.censored == "above" for c in caps), "below": sum(c.censored == "below" for c in caps)}
            for arm, caps in (("baseline", base), ("candidate", cand))}


def bracketing_levels(loads, caps: list[Capacity], *, integer: bool) -> dict:
    """The levels to add so every censored capacity in *caps* would be bracketed.

    Continues the grid geometrically (the ratio of the two outermost levels on that side, or 2 with
    one level): two levels above the highest when some capacity is censored above, two below the
    lowest when some is censored below. *integer* (concurrency) rounds outward to whole streams, and
    no level goes below 1 stream. Returns ``{"above": [...], "below": [...], "note": str | None}``.
    """
    x = sorted(float(v) for v in loads)
    up = x[-1] / x[-2] if len(x) >= 2 else 2.0
    down = x[1] / x[0] if len(x) >= 2 else 2.0
    out: dict = {"above": [], "below": [], "note": None}
    if any(c.censored == "above" for c in caps):
        vals = [x[-1] * up, x[-1] * up * up]
        out["above"] = sorted({max(math.ceil(v), int(x[-1]) + 1 + k) for k, v in enumerate(vals)}) if integer \
            else [_round(v) for v in vals]
    if any(c.censored == "below" for c in caps):
        vals = [x[0] / down, x[0] / down / down]
        if integer:
            out["below"] = sorted({v for v in (max(1, math.floor(w)) for w in vals) if v < x[0]})
            if not out["below"]:
                out["note"] = ("the SLO fails already at one stream: it is tighter than the engine's single-stream "
                               "latency, so no concurrency level can bracket the capacity; loosen the SLO")
        else:
            out["below"] = sorted(_round(v) for v in vals)
    return out


def _round(v: float) -> float:
    """Three significant figures, so a suggested rate reads as a config value."""
    return float(f"{v:.3g}")
