"""Simulation study of the verdict procedure on noise resampled from real A/A runs of the engine.

The pools are the per-round paired log differences (visit medians, as the statistics pair them) of
each A/A recording in tests/data/stats/aa_*.csv, one pool per file × primary metric × condition. A
replicate draws n of them with replacement and flips each sign at random: the arms of an A/A run are
exchangeable, so swapping which visit is called "baseline" is as likely as not, and the resampled
differences are exactly symmetric about 0, as paired differences of identical arms are. Adding a
known effect δ then gives paired data whose true effect is δ and whose noise is real.

Checked (seeded, so deterministic):

- the Hodges–Lehmann interval covers δ in ≥ 94% of replicates at n = 6, 10 and 20;
- on identical arms (δ = 0) the rate of faster/slower claims is ≤ alpha, for one comparison and,
  with Holm, for the family of primary metrics × conditions of a run, and for two candidates sharing
  the baseline's visits (candidates × conditions, correlated comparisons);
- with precision-based adaptive stopping (width only, :mod:`pairbench.analysis.adaptive`'s rule),
  coverage stays ≥ 94% and the identical-arms false-claim rate stays ≤ alpha.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pairbench.analysis import signrank, verdicts
from pairbench.analysis.pairing import paired_differences

DATA = Path(__file__).resolve().parent.parent / "data" / "stats"
ALPHA, NOISE = 0.05, 0.01
SLOWDOWN = math.log(0.95)


def pools() -> list[np.ndarray]:
    out = []
    for path in sorted(DATA.glob("aa_*.csv")):
        df = pd.read_csv(path)
        d = paired_differences(df, baseline="A", candidate="B", metrics=["decode_tok_s", "prefill_tok_s"])
        out += [v for v in d.values() if v.size >= 6 and np.std(v) > 0]
    return out


POOLS = pools()


def draw(rng, pool: np.ndarray, reps: int, n: int) -> np.ndarray:
    """(reps, n) differences resampled from *pool* with random signs."""
    x = pool[rng.integers(0, pool.size, size=(reps, n))]
    return x * rng.choice([-1.0, 1.0], size=(reps, n))


def intervals(d: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised signrank.interval over the rows of *d*."""
    n = d.shape[1]
    i, j = np.triu_indices(n)
    w = np.sort((d[:, i] + d[:, j]) / 2.0, axis=1)
    c = signrank.critical_count(n, alpha)
    if c < 0:
        return np.full(len(d), -np.inf), np.full(len(d), np.inf)
    return w[:, c], w[:, w.shape[1] - 1 - c]


def test_there_are_real_pools():
    assert len(POOLS) >= 4


def test_vectorised_interval_is_the_library_interval():
    rng = np.random.default_rng(0)
    d = draw(rng, POOLS[0], 20, 10)
    low, high = intervals(d, ALPHA)
    for row, lo, hi in zip(d, low, high):
        assert signrank.interval(signrank.walsh(row), 10, ALPHA) == (pytest.approx(lo), pytest.approx(hi))


@pytest.mark.parametrize("n", [6, 10, 20])
def test_coverage_at_least_94_percent(n):
    rng = np.random.default_rng(n)
    covered = total = 0
    for pool in POOLS:
        d = draw(rng, pool, 4000, n) + SLOWDOWN
        low, high = intervals(d, ALPHA)
        covered += int(((low <= SLOWDOWN) & (SLOWDOWN <= high)).sum())
        total += len(d)
    assert covered / total >= 0.94, covered / total


@pytest.mark.parametrize("n", [6, 10, 20])
def test_identical_arms_claim_no_difference_beyond_alpha(n):
    rng = np.random.default_rng(100 + n)
    claims = total = 0
    lo_t, hi_t = verdicts.thresholds(NOISE)
    for pool in POOLS:
        low, high = intervals(draw(rng, pool, 4000, n), ALPHA)
        claims += int(((low > hi_t) | (high < lo_t)).sum())
        total += len(low)
    assert claims / total <= ALPHA, claims / total


def family_claims(comps: list) -> bool:
    """Whether any comparison of one Holm family reads faster or slower."""
    lv = verdicts.levels(comps, ALPHA, NOISE, "holm")
    return any(verdicts.judge(c, level=lv[c.key]["level"], noise=NOISE)["verdict"] in ("faster", "slower")
               for c in comps)


def test_identical_arms_family_wise_with_holm():
    # a run's family: 2 primary metrics x 2 conditions, each its own pool, judged together with Holm
    rng = np.random.default_rng(7)
    reps, n, family = 1500, 10, 4
    any_claim = 0
    for r in range(reps):
        chosen = [POOLS[k] for k in rng.choice(len(POOLS), size=family, replace=len(POOLS) < family)]
        comps = [verdicts.Comparison((str(i), "decode_tok_s"), draw(rng, p, 1, n)[0], True, verdicts.SPEED_WORDS)
                 for i, p in enumerate(chosen)]
        any_claim += family_claims(comps)
    assert any_claim / reps <= ALPHA, any_claim / reps


def test_identical_arms_family_wise_across_candidates_sharing_the_baseline():
    # three identical arms: two candidates x 2 conditions, one Holm family. Each arm's visit gets its own
    # noise (a pool's differences over sqrt 2, random signs), so both candidates' differences share
    # the baseline's noise: correlated comparisons (r = 0.5), which Holm's bound does not need to exclude
    rng = np.random.default_rng(11)
    reps, n, conditions = 1500, 10, 2
    any_claim = 0
    for r in range(reps):
        chosen = [POOLS[k] for k in rng.choice(len(POOLS), size=conditions, replace=len(POOLS) < conditions)]
        comps = []
        for i, pool in enumerate(chosen):
            base, *cands = draw(rng, pool, 3, n) / math.sqrt(2)
            comps += [verdicts.Comparison((cand, str(i), "decode_tok_s"), c - base, True, verdicts.SPEED_WORDS)
                      for cand, c in zip(("B", "C"), cands)]
        any_claim += family_claims(comps)
    assert any_claim / reps <= ALPHA, any_claim / reps


def adaptive_run(rng, pool: np.ndarray, delta: float, lo: int, hi: int, block: int, target: float):
    """One adaptive run: stop when the half-width (as a ratio, at level alpha) is at most *target*."""
    d = draw(rng, pool, 1, hi)[0] + delta
    n = lo
    while True:
        low, high = signrank.interval(signrank.walsh(d[:n]), n, ALPHA)
        if (math.isfinite(low) and (math.exp(high) - math.exp(low)) / 2 <= target) or n + block > hi:
            return n, low, high
        n += block


def test_adaptive_stopping_keeps_coverage_and_false_claims_in_check():
    rng = np.random.default_rng(11)
    lo_t, hi_t = verdicts.thresholds(NOISE)
    runs, covered, claims, stops = 0, 0, 0, []
    for pool in POOLS:
        # a target the run reaches at about 14 rounds, so that stopping really varies
        target = float(np.median(np.sinh((lambda l, h: (h - l) / 2)(*intervals(draw(rng, pool, 400, 14), ALPHA)))))
        for _ in range(600):
            n, low, high = adaptive_run(rng, pool, 0.0, 6, 30, 2, target)
            runs += 1
            stops.append(n)
            claims += (low > hi_t) or (high < lo_t)
            n, low, high = adaptive_run(rng, pool, SLOWDOWN, 6, 30, 2, target)
            covered += low <= SLOWDOWN <= high
    assert len(set(stops)) >= 4  # the stopping point genuinely varies
    assert claims / runs <= ALPHA, claims / runs
    assert covered / runs >= 0.94, covered / runs
