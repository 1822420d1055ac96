"""Arrival schedules (pairbench.core.schedule): exact seeded values, shared seeds, and the right process."""

import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from pairbench.core.schedule import Schedule, arrivals, derive_seed, gaps_from_uniforms


def test_exact_values_for_a_fixed_seed():
    # literal values, so a change in the uniform stream or the sampling is caught; the first gap is
    # -log(1 - U0)/2 with U0 = 0.6369616873214543, numpy's first double from default_rng(0)
    s = arrivals(2.0, seed=0, n_requests=5, normalize=False)
    assert s.offsets_s == pytest.approx((0.0, 0.506623452858863, 0.6638327601527093, 0.684751058396878,
                                         0.6930839287531578), rel=1e-12)
    assert s.offsets_s[1] == pytest.approx(-math.log(1 - 0.6369616873214543) / 2.0, rel=1e-12)


def test_exact_values_match_an_independent_sampler():
    u = np.random.default_rng(7).random(9)
    for burst in (0.5, 1.0, 3.0):
        expected = np.concatenate([[0.0], np.cumsum(stats.gamma.ppf(u, a=burst, scale=1 / (4.0 * burst)))])
        got = arrivals(4.0, seed=7, n_requests=10, burstiness=burst, normalize=False).offsets_s
        assert got == pytest.approx(tuple(expected), rel=1e-9)


def test_normalized_count_schedule_offers_exactly_the_rate():
    s = arrivals(2.5, seed=3, n_requests=41)
    assert s.offsets_s[0] == 0.0 and s.offsets_s[-1] == pytest.approx(40 / 2.5, rel=1e-12)
    assert s.offered_rate_rps == pytest.approx(2.5, rel=1e-12)
    assert s.normalized and s.process == "poisson"
    raw = arrivals(2.5, seed=3, n_requests=41, normalize=False)
    # rescaling keeps the pattern: every gap shrinks or grows by the same factor
    ratio = np.diff(s.offsets_s) / np.diff(raw.offsets_s)
    assert np.allclose(ratio, ratio[0])


def test_same_seed_same_schedule_other_seed_other_schedule():
    a = arrivals(1.0, seed=11, n_requests=20, burstiness=0.7)
    assert a == arrivals(1.0, seed=11, n_requests=20, burstiness=0.7)
    assert a.offsets_s != arrivals(1.0, seed=12, n_requests=20, burstiness=0.7).offsets_s
    assert Schedule.from_dict(a.to_dict()) == a


def test_levels_share_random_numbers_poisson_scales_with_rate():
    one = arrivals(1.0, seed=5, n_requests=30, normalize=False)
    four = arrivals(4.0, seed=5, n_requests=30, normalize=False)
    assert four.offsets_s == pytest.approx(tuple(x / 4 for x in one.offsets_s), rel=1e-12)


def test_duration_schedule_is_the_count_schedule_cut_at_the_end():
    long = arrivals(3.0, seed=9, n_requests=400, normalize=False).offsets_s
    d = arrivals(3.0, seed=9, duration_s=20.0)
    assert d.offsets_s == long[:d.n_requests]
    assert d.offsets_s[-1] < 20.0 <= long[d.n_requests]
    assert not d.normalized


def test_uniform_arrivals_at_infinite_burstiness():
    s = arrivals(4.0, seed=0, n_requests=5, burstiness=math.inf)
    assert s.offsets_s == pytest.approx((0.0, 0.25, 0.5, 0.75, 1.0))
    assert s.process == "uniform" and Schedule.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("burst", [0.25, 1.0, 4.0])
def test_gaps_have_the_asked_mean_and_burstiness(burst):
    rate = 2.0
    gaps = np.diff(arrivals(rate, seed=2024, n_requests=20001, burstiness=burst, normalize=False).offsets_s)
    se = (1 / rate) / math.sqrt(burst) / math.sqrt(gaps.size)  # the SD of a gap over sqrt(n)
    assert abs(gaps.mean() - 1 / rate) < 4 * se
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burst), rel=0.05)  # CV = 1/sqrt(shape)
    # and the whole distribution is the gamma asked (fixed seed: deterministic)
    assert stats.kstest(gaps, stats.gamma(a=burst, scale=1 / (rate * burst)).cdf).pvalue > 0.01


def test_poisson_counts_per_window_are_poisson():
    # a Poisson process: counts in disjoint unit windows have mean = variance = rate
    s = arrivals(5.0, seed=1, duration_s=4000.0)
    counts = np.bincount(np.floor(s.offsets_s).astype(int), minlength=4000)
    assert counts.mean() == pytest.approx(5.0, rel=0.02)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.06)


def test_gap_quantile_is_monotone_in_the_uniform():
    u = np.linspace(0, 0.999, 50)
    for b in (0.5, 1.0, 2.0):
        assert np.all(np.diff(gaps_from_uniforms(u, 1.0, b)) > 0)


def test_derive_seed_is_stable_across_processes():
    assert derive_seed(42, 3, "in1024-out64-r0.5") == derive_seed(42, 3, "in1024-out64-r0.5")
    assert derive_seed(42, 3, "in1024-out64-r0.5") != derive_seed(42, 4, "in1024-out64-r0.5")
    # the top 63 bits of sha256 of repr((42, 1, 'x')); a literal, so a change of derivation is caught
    assert derive_seed(42, 1, "x") == int.from_bytes(hashlib.sha256(b"(42, 1, 'x')").digest()[:8], "big") >> 1
    assert derive_seed(42, 1, "x") == 1694154894112972403


@pytest.mark.parametrize("kwargs,key", [
    ({"rate_rps": 0, "seed": 0, "n_requests": 3}, "load.rate"),
    ({"rate_rps": 1, "seed": 0, "n_requests": 3, "burstiness": 0}, "load.burstiness"),
    ({"rate_rps": 1, "seed": 0, "n_requests": 0}, "load.requests"),
    ({"rate_rps": 1, "seed": 0}, "load: give exactly one"),
    ({"rate_rps": 1, "seed": 0, "n_requests": 3, "duration_s": 2.0}, "load: give exactly one"),
    ({"rate_rps": 1, "seed": 0, "duration_s": -1.0}, "load.duration_s"),
])
def test_bad_input_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        arrivals(**kwargs)
