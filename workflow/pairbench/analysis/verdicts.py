"""Verdicts: what one interval says, how many rounds would resolve it, and Holm across the family.

One rule per verdict, read from the Hodges–Lehmann interval of log(candidate / baseline) at the level
the multiplicity procedure assigns (:mod:`pairbench.analysis.signrank`), with ``noise`` the
practical threshold (0.01 = 1%):

- **faster** / **slower** (speed) or **smaller** / **larger** (memory): the interval lies wholly
  beyond 1 ± noise on one side, so the change is real *and* larger than the threshold;
- **equivalent**: it lies wholly inside 1 ± noise: no change larger than the threshold;
- **inconclusive**: anything else. It states the half-width reached, the smallest change this run
  would detect about 80% of the time, and about how many rounds would resolve it.

Holm (step-down) across every tested comparison (primary metrics × lengths, plus memory metrics that
vary): each comparison's *claim p* is the smallest α at which its interval would make its claim
(:func:`claim_p`); sorted ascending, the i-th (0-based) of m is judged at α / (m − i) while every
earlier one made its claim, and every later one at the level where the procedure stopped. Its
interval is then computed at that level and the verdict read from it, so interval, test and
multiplicity correction are one procedure. Family-wise error of the claims ≤ α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from pairbench.analysis import signrank

SPEED_WORDS = {"better": "faster", "worse": "slower"}
MEMORY_WORDS = {"better": "smaller", "worse": "larger"}
CLAIMS = ("faster", "slower", "smaller", "larger", "equivalent")
POWER_Z = float(norm.ppf(0.80))  # "detected about 80% of the time"
MULTIPLICITY = ("holm", "bonferroni", "none")


@dataclass
class Comparison:
    """One tested comparison: its log differences (sorted Walsh averages) and orientation."""

    key: tuple[str, str]          # (length, metric)
    d: np.ndarray                 # log(candidate / baseline), one per valid pair
    higher_is_better: bool
    words: dict

    def __post_init__(self):
        self.n = int(self.d.size)
        self.w = signrank.walsh(self.d)


def thresholds(noise: float) -> tuple[float, float]:
    """(log(1 − noise), log(1 + noise)): the threshold band in log-ratio units."""
    return math.log1p(-noise), math.log1p(noise)


def claim_p(c: Comparison, noise: float) -> tuple[float, str | None]:
    """(p, claim): the smallest α at which the interval would make its one possible claim, and which.

    The estimate's side decides the candidate claim: above 1 + noise → the interval must lie above
    it; below 1 − noise → below it; inside → both ends inside (equivalence). ``(1.0, None)`` when
    there is nothing to claim (no pairs, or the estimate sits exactly on a threshold).
    """
    if c.n == 0:
        return 1.0, None
    lo, hi = thresholds(noise)
    est = float(np.median(c.w))
    if est > hi:
        return signrank.p_above(c.w, c.n, hi), _word(c, up=True)
    if est < lo:
        return signrank.p_below(c.w, c.n, lo), _word(c, up=False)
    if lo < est < hi:
        return max(signrank.p_above(c.w, c.n, lo), signrank.p_below(c.w, c.n, hi)), "equivalent"
    return 1.0, None


def _word(c: Comparison, up: bool) -> str:
    better = up if c.higher_is_better else not up
    return c.words["better" if better else "worse"]


def levels(comparisons: list[Comparison], alpha: float, noise: float, method: str) -> dict:
    """Per comparison key: ``{"level", "rank", "claim_p"}``, the α its interval is computed at."""
    return levels_from_p({c.key: claim_p(c, noise)[0] for c in comparisons}, alpha, method)


def levels_from_p(ps: dict, alpha: float, method: str) -> dict:
    """:func:`levels` from each comparison's claim p (a family whose claims are not read from one
    :class:`Comparison`, as the SLO capacity's censored intervals): ``{key: {"level", "rank", "claim_p"}}``."""
    if method not in MULTIPLICITY:
        raise ValueError(f"stats.multiplicity: unknown method {method!r} ({', '.join(MULTIPLICITY)})")
    m = len(ps)
    out, stopped = {}, None
    for i, key in enumerate(sorted(ps, key=lambda k: (ps[k], k))):
        if method == "none":
            level = alpha
        elif method == "bonferroni":
            level = alpha / m
        else:
            if stopped is None and not ps[key] < alpha / (m - i):
                stopped = alpha / (m - i)
            level = alpha / (m - i) if stopped is None else stopped
        out[key] = {"level": level, "rank": i + 1, "claim_p": ps[key]}
    return out


def width_level(m: int, alpha: float, method: str) -> float:
    """The level whose interval width the adaptive stopping rule reads: it must not depend on where
    any interval lies, so it is the widest level the method can assign (α / m for Holm)."""
    return alpha if method == "none" or m <= 1 else alpha / m


def judge(c: Comparison, *, level: float, noise: float) -> dict:
    """The interval at *level* and the verdict read from it, with the inconclusive extras."""
    lo_t, hi_t = thresholds(noise)
    out = {"n_pairs": c.n, "ci_level": 1.0 - level, "hl_ratio": None, "ci_low": None, "ci_high": None,
           "half_width": None, "log_half_width": None, "detectable_change": None, "rounds_needed": None,
           "p_value": None, "min_attainable_p": signrank.min_attainable_p(c.n), "verdict": "inconclusive",
           "reason": ""}
    if c.n == 0:
        out["reason"] = "no valid pairs"
        return out
    est = float(np.median(c.w))
    low, high = signrank.interval(c.w, c.n, level)
    out["hl_ratio"] = math.exp(est)
    out["p_value"] = signrank.p_value(c.w, c.n, 0.0)
    z = float(norm.ppf(1 - level / 2))
    if math.isfinite(low):
        out["ci_low"], out["ci_high"] = math.exp(low), math.exp(high)
        out["half_width"] = (out["ci_high"] - out["ci_low"]) / 2
        out["log_half_width"] = h = (high - low) / 2
        spread = h * math.sqrt(c.n)  # the half-width shrinks as 1/sqrt(n)
    else:
        h = math.inf
        sd = float(np.std(c.d, ddof=1)) if c.n >= 2 else math.nan
        spread = z * sd if math.isfinite(sd) and sd > 0 else math.nan
    if math.isfinite(spread):
        out["detectable_change"] = math.expm1(hi_t + spread / math.sqrt(c.n) * (1 + POWER_Z / z))
    if not math.isfinite(low):
        bounded = (f"no {1 - level:.2%} interval is bounded with {c.n} pairs (the best two-sided p is "
                   f"{signrank.min_attainable_p(c.n):.3g}, not below {level:.3g})")
    if low > hi_t:
        out["verdict"] = _word(c, up=True)
        out["reason"] = f"the interval lies wholly above 1 + {noise:g}"
    elif high < lo_t:
        out["verdict"] = _word(c, up=False)
        out["reason"] = f"the interval lies wholly below 1 - {noise:g}"
    elif lo_t < low and high < hi_t:
        out["verdict"] = "equivalent"
        out["reason"] = f"the interval lies wholly inside 1 ± {noise:g}"
    else:
        # how narrow the interval must get to resolve, from where the estimate lies now
        need = est - hi_t if est > hi_t else (lo_t - est if est < lo_t else min(hi_t - est, est - lo_t))
        if need > 0 and math.isfinite(spread):
            out["rounds_needed"] = max(c.n + 1, math.ceil((spread / need) ** 2))
        if not math.isfinite(low):
            out["reason"] = bounded
        elif low > 0 or high < 0:
            out["reason"] = f"a change is detected, but the interval reaches into 1 ± {noise:g}"
        else:
            out["reason"] = f"the interval straddles the threshold 1 ± {noise:g}"
    return out


