"""SLO capacity (pairbench.analysis.capacity): interpolation, censoring, the paired verdict, and a simulation."""

import math

import numpy as np
import pytest

from pairbench.analysis import verdicts
from pairbench.analysis.capacity import (Capacity, bracketing_levels, capacity, claim_p, compare,
                                         log_ratio_bounds)

ALPHA, NOISE = 0.05, 0.01


# Per arm and round. ---------------------------------------------------------------------------------------------
def test_interpolates_between_the_last_level_that_holds_and_the_first_that_fails():
    c = capacity([1, 2, 4, 8], [1.0, 0.95, 0.80, 0.30], 0.9)
    # holds at 2 (0.95), fails at 4 (0.80): 2 + (0.95 - 0.9) / (0.95 - 0.80) * (4 - 2) = 2.6667
    assert c.value == pytest.approx(2 + 2 / 3)
    assert (c.censored, c.bracket, c.non_monotone) == (None, (2.0, 4.0), False)


def test_a_level_exactly_on_the_target_holds():
    assert capacity([1, 2, 3], [1.0, 0.9, 0.5], 0.9).value == 2.0


def test_holds_everywhere_is_censored_above_at_the_highest_level():
    c = capacity([0.5, 1, 2], [1.0, 0.99, 0.93], 0.9)
    assert (c.value, c.censored, c.bracket) == (2.0, "above", None)
    assert c.log_bounds() == (math.log(2.0), math.inf)


def test_fails_at_the_lowest_level_is_censored_below():
    c = capacity([0.5, 1, 2], [0.85, 0.7, 0.2], 0.9)
    assert (c.value, c.censored) == (0.5, "below")
    assert c.log_bounds() == (-math.inf, math.log(0.5))


def test_a_curve_that_recovers_keeps_its_first_crossing_and_says_so():
    c = capacity([1, 2, 3, 4], [1.0, 0.85, 0.95, 0.5], 0.9)
    assert c.value == pytest.approx(1 + (1.0 - 0.9) / (1.0 - 0.85))
    assert c.non_monotone
    assert capacity([1, 2, 3], [0.8, 0.95, 0.5], 0.9).non_monotone  # fails first, then holds


@pytest.mark.parametrize("loads,att,target,match", [
    ([1, 2], [1.0], 0.9, "2 loads and 1 attainments"),
    ([2, 1], [1.0, 0.5], 0.9, "strictly increasing"),
    ([0, 1], [1.0, 0.5], 0.9, "positive"),
    ([1, 2], [1.2, 0.5], 0.9, r"\[0, 1\]"),
    ([1, 2], [1.0, 0.5], 0.0, "load.slo.attainment"),
])
def test_bad_curves_are_errors(loads, att, target, match):
    with pytest.raises(ValueError, match=match):
        capacity(loads, att, target)


def test_round_trip():
    for c in (capacity([1, 2, 4], [1, 0.95, 0.5], 0.9), Capacity(8.0, "above"), Capacity(1.0, "below", None, True)):
        assert Capacity.from_dict(c.to_dict()) == c


# Paired across rounds. ------------------------------------------------------------------------------------------
def points(values):
    return [Capacity(float(v)) for v in values]


def test_uncensored_comparison_is_the_verdicts_modules_judge():
    base = points([4.0, 4.1, 3.9, 4.3, 4.0, 4.2, 3.8, 4.1])
    cand = points([4.6, 4.5, 4.4, 5.0, 4.7, 4.6, 4.3, 4.8])
    d = np.log([c.value / b.value for b, c in zip(base, cand)])
    expected = verdicts.judge(verdicts.Comparison(("load", "capacity"), d, True, {"better": "more", "worse": "less"}),
                              alpha=ALPHA, noise=NOISE)
    out = compare(base, cand, alpha=ALPHA, noise=NOISE)
    # the module takes log c - log b, the test log(c / b): equal to rounding
    assert {k: out[k] for k in expected} == pytest.approx(expected, rel=1e-12)
    assert out["verdict"] == "more" and out["n_censored"] == 0
    assert out["hl_ratio_low"] == out["hl_ratio_high"] == out["hl_ratio"]
    assert claim_p(base, cand, NOISE) == pytest.approx(verdicts.claim_p(verdicts.Comparison(("x", "y"), d, True,
                                                                               {"better": "more", "worse": "less"}),
                                                                        NOISE))


def test_log_ratio_bounds_of_each_censoring():
    b, above, below = Capacity(4.0), Capacity(8.0, "above"), Capacity(1.0, "below")
    assert log_ratio_bounds(b, Capacity(5.0)) == pytest.approx((math.log(5 / 4), math.log(5 / 4)))
    assert log_ratio_bounds(b, above) == (pytest.approx(math.log(2.0)), math.inf)
    assert log_ratio_bounds(b, below) == (-math.inf, pytest.approx(math.log(0.25)))
    assert log_ratio_bounds(above, Capacity(5.0)) == (-math.inf, pytest.approx(math.log(5 / 8)))
    assert log_ratio_bounds(above, above) == (-math.inf, math.inf)
    assert log_ratio_bounds(below, above) == (pytest.approx(math.log(8.0)), math.inf)


def test_a_candidate_past_the_highest_level_can_still_be_called_more():
    # 6 rounds: at alpha 0.05 the critical count is 0 (2 * 2^-6 = 0.031 < 0.05), so the interval is
    # [smallest Walsh average, largest] = [min d, max d]; round 6's candidate passed every level (>= 8)
    base = points([4.0] * 6)
    cand = points([5.0, 5.2, 4.8, 5.1, 4.9]) + [Capacity(8.0, "above")]
    out = compare(base, cand, alpha=ALPHA, noise=NOISE)
    assert out["ci_low"] == pytest.approx(1.2)     # 4.8 / 4: that round's d is the smallest d-
    assert out["ci_high"] is None                   # the censored round's d+ is +inf
    assert out["verdict"] == "more" and out["n_censored"] == 1 and out["hl_ratio"] is None
    assert out["censoring"] == {"baseline": {"above": 0, "below": 0}, "candidate": {"above": 1, "below": 0}}
    assert "1 of 6 rounds censored" in out["reason"]


def test_identical_arms_both_past_the_top_are_inconclusive():
    # 10 rounds, c = 8 at alpha 0.05; two rounds where both arms pass every level give d in (-inf, inf):
    # 2 * 10 - 1 = 19 of the 55 Walsh averages are infinite on each side, more than c, so both ends are open
    rng = np.random.default_rng(3)
    base = points(4 * np.exp(rng.normal(0, 0.05, 8))) + [Capacity(8.0, "above")] * 2
    cand = points(4 * np.exp(rng.normal(0, 0.05, 8))) + [Capacity(8.0, "above")] * 2
    out = compare(base, cand, alpha=ALPHA, noise=NOISE)
    assert out["ci_low"] == 0.0 and out["ci_high"] is None
    assert out["verdict"] == "inconclusive" and "censored" in out["reason"]


def test_one_censored_round_of_ten_keeps_a_bounded_interval():
    # round 10's candidate passed every level, just below its true capacity: d in [d- , inf) with d- a
    # little below the true d. The 10 Walsh averages with that round are infinite on the high side, more
    # than c = 8, so the high end is open; the low end can only fall, here not past the threshold
    rng = np.random.default_rng(4)
    b = 4 * np.exp(rng.normal(0, 0.05, 10))
    c = b * 1.3 * np.exp(rng.normal(0, 0.02, 10))
    base, cand = points(b), points(c)
    full = compare(base, cand, alpha=ALPHA, noise=NOISE)
    cand_cens = cand[:9] + [Capacity(min(8.0, c[9] * 0.99), "above")]
    out = compare(base, cand_cens, alpha=ALPHA, noise=NOISE)
    assert out["ci_low"] <= full["ci_low"] + 1e-12 and out["ci_high"] is None
    assert out["verdict"] == full["verdict"] == "more"


def test_claim_p_agrees_with_the_verdict_at_every_level():
    """A claim is made at level L exactly when its conservative claim p is below L (what Holm needs)."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(6, 14))
        b = 4 * np.exp(rng.normal(0, 0.1, n))
        c = b * math.exp(rng.choice([-0.2, 0.0, 0.2, 0.004])) * np.exp(rng.normal(0, 0.03, n))
        base, cand = points(b), points(c)
        for i in rng.choice(n, size=int(rng.integers(0, 3)), replace=False):
            cand[i] = Capacity(float(c[i]) * 0.95, "above") if rng.random() < 0.5 else Capacity(float(c[i]) * 1.05,
                                                                                                 "below")
        p, claim = claim_p(base, cand, NOISE)
        for level in (0.001, 0.01, 0.05, 0.2):
            v = compare(base, cand, alpha=level, noise=NOISE)["verdict"]
            assert (v != "inconclusive") == (claim is not None and p < level), (p, claim, level, v)
            if v != "inconclusive":
                assert v == claim


def test_suggested_levels_bracket_the_censored_side():
    above, below = [Capacity(8.0, "above")], [Capacity(1.0, "below")]
    assert bracketing_levels([1, 2, 4, 8], above, integer=True) == {"above": [16, 32], "below": [], "note": None}
    assert bracketing_levels([0.5, 1, 2], above, integer=False)["above"] == [4.0, 8.0]
    assert bracketing_levels([0.5, 1, 2], below, integer=False)["below"] == [0.125, 0.25]
    assert bracketing_levels([2, 4, 8], below, integer=True)["below"] == [1]
    assert bracketing_levels([7, 8], above, integer=True)["above"] == [10, 11]  # 8 * 8/7 = 9.1 -> 10, 10.4 -> 11
    one = bracketing_levels([1, 2, 4], below, integer=True)
    assert one["below"] == [] and "already at one stream" in one["note"]
    assert bracketing_levels([1, 2], points([1.5]), integer=True) == {"above": [], "below": [], "note": None}


# Simulation. -------------------------------------------------------------------------------------------------------
# Each arm's attainment curve in a round is linear in load relative to its capacity C,
#     p(x) = clip(0.9 + 0.5 (1 - x / C), 0, 1)     (the SLO target 0.9 is met exactly at x = C),
# and each level's attainment is measured from 100 requests: Binomial(100, p(x)) / 100. C drifts per
# round (shared by both arms, SD 15%) plus a per-arm-round part (SD 5%). The levels are 1.25^0 ... 1.25^9
# (1 to 7.45). The true ratio rho is the candidate's C over the baseline's.
GRID = 1.25 ** np.arange(10)
TARGET = 0.9


def simulate(seed: int, *, rho: float, base_c: float, n: int = 10, reps: int = 1500) -> tuple[float, dict]:
    rng = np.random.default_rng(seed)
    drift = rng.normal(0, 0.15, (reps, n, 1))
    c = base_c * np.array([1.0, rho])[None, None, :] * np.exp(drift + rng.normal(0, 0.05, (reps, n, 2)))
    p = np.clip(TARGET + 0.5 * (1 - GRID[None, None, None, :] / c[..., None]), 0, 1)
    att = rng.binomial(100, p) / 100  # (reps, n, arm, level)
    covered, claims = 0, {}
    for r in range(reps):
        base = [capacity(GRID, att[r, i, 0], TARGET) for i in range(n)]
        cand = [capacity(GRID, att[r, i, 1], TARGET) for i in range(n)]
        out = compare(base, cand, alpha=ALPHA, noise=NOISE)
        low = out["ci_low"] if out["ci_low"] is not None else 0.0
        high = out["ci_high"] if out["ci_high"] is not None else math.inf
        covered += low <= rho <= high
        claims[out["verdict"]] = claims.get(out["verdict"], 0) + 1
    return covered / reps, claims


@pytest.mark.parametrize("rho,base_c,seed", [(1.1, 4.0, 1), (0.8, 4.0, 2), (1.25, 6.0, 3)])
def test_simulated_coverage_at_least_94_percent(rho, base_c, seed):
    # (1.25, 6.0): the candidate's capacity sits near the highest level, so about half its rounds are
    # censored above; the conservative interval must still cover
    cov, claims = simulate(seed, rho=rho, base_c=base_c)
    assert cov >= 0.94, (cov, claims)
    wrong = "less" if rho > 1 else "more"
    assert claims.get(wrong, 0) == 0, claims


@pytest.mark.parametrize("base_c,seed", [(4.0, 4), (6.5, 5)])
def test_identical_arms_false_claims_at_most_alpha(base_c, seed):
    # (6.5): both arms mostly pass every level, so most rounds are censored
    cov, claims = simulate(seed, rho=1.0, base_c=base_c)
    false = (claims.get("more", 0) + claims.get("less", 0)) / sum(claims.values())
    assert false <= ALPHA, claims
    assert cov >= 0.94, cov
