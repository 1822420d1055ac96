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

The rule itself is :func:`read_interval`: every verdict pairbench publishes is read by it, from an
interval of log(candidate / baseline) against the band 1 ± noise: a speed metric's and a load
level's (:func:`judge`), the SLO capacity's with censored rounds
(:func:`pairbench.analysis.capacity.compare`), a memory metric's exact ratio (a point, where the
band's edges count as inside: :func:`read_ratio`) and the engine tool's ratio beside it
(:mod:`pairbench.analysis.crosscheck`). Which claim an interval could make, for the multiplicity
family, is :func:`claim_of`, the same rule read from the estimate.

*alpha*, throughout: the error rate an interval is computed at (a 1 − alpha interval), which the
multiplicity procedure assigns per comparison; never a load level.
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


@dataclass(frozen=True)
class Judgement:
    """What one interval says: ``verdict`` (a claim word of *words*, ``equivalent`` or
    ``inconclusive``) and ``reason``, the sentence that says why."""

    verdict: str
    reason: str

    @property
    def claim(self) -> bool:
        return self.verdict != "inconclusive"


def read_interval(low: float, high: float, *, noise: float, higher_is_better: bool = True,
                  words: dict = SPEED_WORDS, point: bool = False) -> Judgement:
    """The verdict of the interval [*low*, *high*] of log(candidate / baseline) (an end may be
    infinite: unbounded) against the band 1 ± *noise*:

    - wholly above 1 + noise: the better word of *words* when higher is better, else the worse;
    - wholly below 1 − noise: the other;
    - wholly inside: ``equivalent``;
    - anything else: ``inconclusive``.

    "Wholly" is strict: an interval that touches the band's edge is inconclusive. A *point* (low ==
    high, a ratio known exactly: no sampling error) is beyond the band only when strictly beyond,
    and inside it up to and including its edges.
    """
    lo_t, hi_t = thresholds(noise)
    if low > hi_t:
        return Judgement(_word(higher_is_better, words, up=True), f"the interval lies wholly above 1 + {noise:g}")
    if high < lo_t:
        return Judgement(_word(higher_is_better, words, up=False), f"the interval lies wholly below 1 - {noise:g}")
    if (lo_t <= low and high <= hi_t) if point else (lo_t < low and high < hi_t):
        return Judgement("equivalent", f"the interval lies wholly inside 1 ± {noise:g}")
    if not (math.isfinite(low) and math.isfinite(high)):
        return Judgement("inconclusive", "the interval is unbounded")
    if low > 0 or high < 0:
        return Judgement("inconclusive", f"a change is detected, but the interval reaches into 1 ± {noise:g}")
    return Judgement("inconclusive", f"the interval straddles the threshold 1 ± {noise:g}")


def read_ratio(ratio: float, *, noise: float, higher_is_better: bool = True, words: dict = SPEED_WORDS) -> Judgement:
    """:func:`read_interval` of a ratio known exactly (a point; a ratio of 0 lies below every band).
    A ratio equal to 1 ± noise as floats is that edge (log(0.99) is not log1p(-0.01) in floating point)."""
    lo_t, hi_t = thresholds(noise)
    d = lo_t if ratio == 1 - noise else hi_t if ratio == 1 + noise else math.log(ratio) if ratio > 0 else -math.inf
    return read_interval(d, d, noise=noise, higher_is_better=higher_is_better, words=words, point=True)


def claim_of(est_low: float, est_high: float, noise: float) -> str | None:
    """Which claim an interval centred on the estimate could make: ``above`` (the estimate, at its
    lowest, lies above 1 + noise), ``below``, ``inside`` (wholly inside 1 ± noise) or None (on an
    edge). *est_low* and *est_high* are one estimate, or the range censored rounds leave it."""
    lo_t, hi_t = thresholds(noise)
    if est_low > hi_t:
        return "above"
    if est_high < lo_t:
        return "below"
    if lo_t < est_low and est_high < hi_t:
        return "inside"
    return None


def claim_p_between(w_low: np.ndarray, w_high: np.ndarray, n: int, noise: float, *, higher_is_better: bool,
                    words: dict) -> tuple[float, str | None]:
    """(p, claim) of :func:`claim_p` for an interval whose low end is read from the sorted Walsh
    averages *w_low* and whose high end from *w_high* (the same array when every difference is known)."""
    if n == 0:
        return 1.0, None
    lo_t, hi_t = thresholds(noise)
    side = claim_of(float(np.median(w_low)), float(np.median(w_high)), noise)
    if side == "above":
        return signrank.p_above(w_low, n, hi_t), _word(higher_is_better, words, up=True)
    if side == "below":
        return signrank.p_below(w_high, n, lo_t), _word(higher_is_better, words, up=False)
    if side == "inside":
        return max(signrank.p_above(w_low, n, lo_t), signrank.p_below(w_high, n, hi_t)), "equivalent"
    return 1.0, None


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

    The estimate's side decides the candidate claim (:func:`claim_of`): above 1 + noise → the
    interval must lie above it; below 1 − noise → below it; inside → both ends inside (equivalence).
    ``(1.0, None)`` when there is nothing to claim (no pairs, or the estimate sits exactly on a
    threshold).
    """
    return claim_p_between(c.w, c.w, c.n, noise, higher_is_better=c.higher_is_better, words=c.words)


def _word(higher_is_better: bool, words: dict, up: bool) -> str:
    better = up if higher_is_better else not up
    return words["better" if better else "worse"]


def assign(comparisons: list[Comparison], alpha: float, noise: float, method: str) -> dict:
    """Per comparison key: ``{"alpha", "rank", "claim_p"}``, the α its interval is computed at."""
    return assign_from_p({c.key: claim_p(c, noise)[0] for c in comparisons}, alpha, method)


def assign_from_p(ps: dict, alpha: float, method: str) -> dict:
    """:func:`assign` from each comparison's claim p (a family whose claims are not read from one
    :class:`Comparison`, as the SLO capacity's censored intervals): ``{key: {"alpha", "rank", "claim_p"}}``."""
    if method not in MULTIPLICITY:
        raise ValueError(f"stats.multiplicity: unknown method {method!r} ({', '.join(MULTIPLICITY)})")
    m = len(ps)
    out, stopped = {}, None
    for i, key in enumerate(sorted(ps, key=lambda k: (ps[k], k))):
        if method == "none":
            at = alpha
        elif method == "bonferroni":
            at = alpha / m
        else:
            if stopped is None and not ps[key] < alpha / (m - i):
                stopped = alpha / (m - i)
            at = alpha / (m - i) if stopped is None else stopped
        out[key] = {"alpha": at, "rank": i + 1, "claim_p": ps[key]}
    return out


def width_level(m: int, alpha: float, method: str) -> float:
    """The level whose interval width the adaptive stopping rule reads: it must not depend on where
    any interval lies, so it is the widest level the method can assign (α / m for Holm)."""
    return alpha if method == "none" or m <= 1 else alpha / m


def judge(c: Comparison, *, alpha: float, noise: float) -> dict:
    """The 1 − *alpha* interval, the verdict :func:`read_interval` reads from it, and the
    inconclusive extras (the smallest change this run would detect, the rounds that would resolve it)."""
    lo_t, hi_t = thresholds(noise)
    out = {"n_pairs": c.n, "ci_level": 1.0 - alpha, "hl_ratio": None, "ci_low": None, "ci_high": None,
           "half_width": None, "log_half_width": None, "detectable_change": None, "rounds_needed": None,
           "p_value": None, "min_attainable_p": signrank.min_attainable_p(c.n), "verdict": "inconclusive",
           "reason": ""}
    if c.n == 0:
        out["reason"] = "no valid pairs"
        return out
    est = float(np.median(c.w))
    low, high = signrank.interval(c.w, c.n, alpha)
    out["hl_ratio"] = math.exp(est)
    out["p_value"] = signrank.p_value(c.w, c.n, 0.0)
    z = float(norm.ppf(1 - alpha / 2))
    if math.isfinite(low):
        out["ci_low"], out["ci_high"] = math.exp(low), math.exp(high)
        out["half_width"] = (out["ci_high"] - out["ci_low"]) / 2
        out["log_half_width"] = h = (high - low) / 2
        spread = h * math.sqrt(c.n)  # the half-width shrinks as 1/sqrt(n)
    else:
        sd = float(np.std(c.d, ddof=1)) if c.n >= 2 else math.nan
        spread = z * sd if math.isfinite(sd) and sd > 0 else math.nan
    if math.isfinite(spread):
        out["detectable_change"] = math.expm1(hi_t + spread / math.sqrt(c.n) * (1 + POWER_Z / z))
    reading = read_interval(low, high, noise=noise, higher_is_better=c.higher_is_better, words=c.words)
    out["verdict"], out["reason"] = reading.verdict, reading.reason
    if not reading.claim:
        # how narrow the interval must get to resolve, from where the estimate lies now
        need = est - hi_t if est > hi_t else (lo_t - est if est < lo_t else min(hi_t - est, est - lo_t))
        if need > 0 and math.isfinite(spread):
            out["rounds_needed"] = max(c.n + 1, math.ceil((spread / need) ** 2))
        if not math.isfinite(low):
            out["reason"] = (f"no {1 - alpha:.2%} interval is bounded with {c.n} pairs (the best two-sided p is "
                             f"{signrank.min_attainable_p(c.n):.3g}, not below {alpha:.3g})")
    return out
