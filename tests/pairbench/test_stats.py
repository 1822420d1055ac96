"""Tests of pairbench.analysis.stats: known answers, A/A, injected effects, inconclusive and error paths,
disclosures and the summary schema.

Fixtures live in tests/data/stats/: ``known.csv`` + ``known_expected.json`` (hand-derived answers),
``seed_case.csv`` (the seed report's +0.93% median vs +7.49% trimmed-mean case), and two A/A runs of
real recorded timings (``aa_quiet.csv``, ``aa_contended.csv``; see ``record_aa.py``).
"""

import itertools
import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from pairbench.core import artifacts
from pairbench.analysis import stats
from pairbench.analysis.tables import summary_tables
from pairbench.publish.report import statistics_section

DATA = Path(__file__).resolve().parent.parent / "data" / "stats"
FAST = dict(n_resamples=2000)  # enough for stable BCa ends; the default 9999 is for real runs


def load(name: str) -> pd.DataFrame:
    return pd.read_csv(DATA / name)


@pytest.fixture(scope="module")
def known():
    df = load("known.csv")
    return df, stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s", "ttft_ms"], **FAST)


@pytest.fixture(scope="module")
def expected():
    return json.loads((DATA / "known_expected.json").read_text())


def verdicts(summary: dict, metric: str | None = None) -> dict:
    return {(length, m): p["verdict"] for length, by in summary["paired"].items()
            for m, p in by.items() if metric in (None, m)}


def stamped(summary: dict) -> dict:
    return {**summary, "schema": artifacts.schema_id("summary"),
            "inputs": {"measurements": "ab" * 32}}


# --------------------------------------------------------------------------- known answers

def test_estimators_on_hand_derived_values():
    assert stats.trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 20, 100], 1) == pytest.approx(6.875)
    assert stats.trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 20, 100], 0) == pytest.approx(15.6)
    assert np.isnan(stats.trimmed_mean([1, 2], 1))
    assert float(stats.hodges_lehmann(np.array([0.0, 1.0, 2.0, 3.0]))) == pytest.approx(1.5)
    assert stats.min_attainable_wilcoxon_p(5) == pytest.approx(0.0625)
    assert stats.min_attainable_wilcoxon_p(6) == pytest.approx(0.03125)
    assert [stats.default_trim(n) for n in (3, 4, 5, 9, 10, 19, 20)] == [0, 0, 1, 1, 1, 1, 2]


def test_min_attainable_p_matches_scipy_exact_test():
    for n in range(2, 9):
        p = scipy.stats.wilcoxon(np.arange(1.0, n + 1), method="exact").pvalue
        assert p == pytest.approx(stats.min_attainable_wilcoxon_p(n))


def test_hodges_lehmann_matches_brute_force_walsh_averages():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 10, 13):
        x = rng.normal(size=n)
        walsh = [(a + b) / 2 for a, b in itertools.combinations_with_replacement(x, 2)]
        assert float(stats.hodges_lehmann(x)) == pytest.approx(statistics.median(walsh))


def test_per_arm_known_answers(known, expected):
    _, s = known
    for arm, by_len in expected["arms"].items():
        for length, by_metric in by_len.items():
            for metric, want in by_metric.items():
                got = s["arms"][arm][length][metric]
                for key in ("n", "median", "min", "max", "trimmed_mean", "trim_per_end"):
                    assert got[key] == pytest.approx(want[key]), (arm, length, metric, key)


def test_paired_known_answers(known, expected):
    _, s = known
    for length, by_metric in expected["paired"].items():
        for metric, want in by_metric.items():
            got = s["paired"][length][metric]
            for key, value in want.items():
                if key != "why":
                    assert got[key] == pytest.approx(value) if not isinstance(value, str) else got[key] == value, key
    # HL of the 10 pairs at 256 equals an independent brute-force Walsh-average median of the logs
    k = np.log2([p["ratio"] for p in s["paired"]["256"]["decode_tok_s"]["pairs"]])
    walsh = [(a + b) / 2 for a, b in itertools.combinations_with_replacement(k, 2)]
    assert s["paired"]["256"]["decode_tok_s"]["hl_ratio"] == pytest.approx(2 ** statistics.median(walsh))


def test_explicit_trim_is_per_end_and_too_large_a_trim_gives_null():
    df = load("known.csv")
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"], trim=2, **FAST)
    d = s["arms"]["stock"]["256"]["decode_tok_s"]
    assert d["trim_per_end"] == 2 and d["trimmed_mean"] == pytest.approx((3 + 4 + 5 + 6 + 7 + 8) / 6)
    assert s["arms"]["stock"]["512"]["decode_tok_s"]["trimmed_mean"] is None  # 4 samples, 2+2 dropped


def test_only_selected_rows_count_and_the_rest_are_listed_with_reasons(known):
    _, s = known
    assert s["arms"]["stock"]["256"]["decode_tok_s"]["max"] == 100  # the 999 of the failed row is out
    excluded = {(e["arm"], e["round"], e["reason"]) for e in s["disclosures"]["excluded"]}
    assert excluded == {("stock", 11, "prompt_tokens: got 257, planned 256"),
                        ("patched", 3, "superseded: visit retried after connection reset")}
    assert s["counts"] == {"rows": 30, "selected": 28, "excluded": 2, "retries": 1, "unpaired": 0}
    assert s["disclosures"]["retries"] == [{"arm": "patched", "length": 256, "round": 3, "attempt": 2, "retry": 0,
                                            "selected": False}]


def test_missing_reason_column_is_tolerated():
    df = load("known.csv").drop(columns=["reason"])
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"], **FAST)
    reasons = {e["round"]: e["reason"] for e in s["disclosures"]["excluded"]}
    assert reasons == {11: "failed a gate (no reason recorded)", 3: "not selected (no reason recorded)"}


# --------------------------------------------------------------------------- A/A and injected effects

@pytest.mark.parametrize("name", ["aa_quiet.csv", "aa_contended.csv"])
def test_aa_recorded_timings_show_no_detectable_difference(name):
    s = stats.summarize(load(name), baseline="A", candidate="B", **FAST)
    got = verdicts(s)
    assert len(got) == 3 * 4
    assert set(got.values()) == {"no detectable difference"}, got


def test_injected_effect_on_recorded_aa_shifts_estimate_and_ci_by_exactly_that_factor():
    # Multiplying every candidate sample by k multiplies every paired ratio, their median and
    # Hodges-Lehmann estimate by k; the bootstrap (same seed, same resamples) scales by k too.
    df = load("aa_quiet.csv")
    base = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    k = 2.0
    inj = df.copy()
    inj.loc[inj["arm"] == "B", "decode_tok_s"] *= k
    s = stats.summarize(inj, baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    for length in ("128", "512", "2048"):
        a, b = base["paired"][length]["decode_tok_s"], s["paired"][length]["decode_tok_s"]
        for key in ("hl_ratio", "median_ratio", "ci_low", "ci_high"):
            assert b[key] == pytest.approx(k * a[key], rel=1e-9), (length, key)
        assert b["verdict"] == "faster", (length, b["reason"])


def test_ten_percent_effect_with_two_percent_noise_is_found_and_estimated():
    # The candidate is the recorded baseline arm times 1.10, with 2% lognormal per-round noise.
    df = load("aa_quiet.csv")
    base = df[df["arm"] == "A"]
    rng = np.random.default_rng(11)
    cand = base.copy()
    cand["arm"] = "B"
    cand["decode_tok_s"] = base["decode_tok_s"].to_numpy() * 1.10 * np.exp(rng.normal(0, 0.02, len(base)))
    cand["ttft_ms"] = base["ttft_ms"].to_numpy() / 1.10 * np.exp(rng.normal(0, 0.02, len(base)))
    s = stats.summarize(pd.concat([base, cand]), baseline="A", candidate="B",
                        metrics=["decode_tok_s", "ttft_ms"], **FAST)
    for length, by in s["paired"].items():
        assert by["decode_tok_s"]["verdict"] == "faster", by["decode_tok_s"]["reason"]
        assert by["decode_tok_s"]["hl_ratio"] == pytest.approx(1.10, abs=0.02)
        assert by["decode_tok_s"]["ci_low"] < 1.10 < by["decode_tok_s"]["ci_high"]
        # lower time is better: a ratio of 1/1.10 on ttft_ms is also "faster"
        assert by["ttft_ms"]["verdict"] == "faster", by["ttft_ms"]["reason"]
        assert by["ttft_ms"]["hl_ratio"] == pytest.approx(1 / 1.10, abs=0.02)
    # and the same effect reversed reads "slower"
    swapped = stats.summarize(pd.concat([base, cand]), baseline="B", candidate="A",
                              metrics=["decode_tok_s"], **FAST)
    assert set(verdicts(swapped).values()) == {"slower"}


def test_ten_percent_effect_inside_contended_noise_is_not_claimed():
    df = load("aa_contended.csv")
    df.loc[df["arm"] == "B", "decode_tok_s"] *= 1.10
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    assert set(verdicts(s).values()) == {"no detectable difference"}


def test_significant_but_smaller_than_noise_threshold_is_no_detectable_difference():
    df = load("aa_quiet.csv")
    base = df[df["arm"] == "A"]
    cand = base.copy()
    cand["arm"] = "B"
    rng = np.random.default_rng(5)
    cand["decode_tok_s"] = base["decode_tok_s"].to_numpy() * 1.004 * np.exp(rng.normal(0, 0.0005, len(base)))
    s = stats.summarize(pd.concat([base, cand]), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    for by in s["paired"].values():
        p = by["decode_tok_s"]
        assert p["p_value"] < 0.05  # the test does see it ...
        assert p["verdict"] == "no detectable difference"  # ... but the CI sits inside 1 ± 1%
        assert "reaches into 1 ± 0.01" in p["reason"]
    loose = stats.summarize(pd.concat([base, cand]), baseline="A", candidate="B",
                            metrics=["decode_tok_s"], noise=0.0, **FAST)
    assert set(verdicts(loose).values()) == {"faster"}


# --------------------------------------------------------------------------- inconclusive and errors

def strong_effect(rounds: int) -> pd.DataFrame:
    df = load("aa_quiet.csv")
    df = df[df["round"] <= rounds].copy()
    df.loc[df["arm"] == "B", "decode_tok_s"] = df.loc[df["arm"] == "A", "decode_tok_s"].to_numpy() * 2.0 \
        * np.exp(np.random.default_rng(1).normal(0, 0.01, rounds * 3))
    return df


def test_too_few_pairs_is_inconclusive_even_for_a_huge_effect():
    s = stats.summarize(strong_effect(5), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    for by in s["paired"].values():
        p = by["decode_tok_s"]
        assert p["verdict"] == "inconclusive"
        assert p["min_attainable_p"] == pytest.approx(0.0625)
        assert "too few valid pairs" in p["reason"]
        assert p["hl_ratio"] == pytest.approx(2.0, abs=0.05)  # the estimate is still reported
    six = stats.summarize(strong_effect(6), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    assert set(verdicts(six).values()) == {"faster"}


def test_invalid_pairs_do_not_count_towards_n():
    df = strong_effect(7)
    df.loc[(df["arm"] == "B") & (df["round"] == 1), "decode_tok_s"] = 0.0
    df.loc[(df["arm"] == "B") & (df["round"] == 2), "decode_tok_s"] = np.nan
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    for by in s["paired"].values():
        p = by["decode_tok_s"]
        assert (p["n_pairs"], p["n_invalid_pairs"], p["verdict"]) == (5, 2, "inconclusive")


def test_bootstrap_failure_is_inconclusive_never_a_difference(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("bootstrap exploded")
    monkeypatch.setattr(scipy.stats, "bootstrap", boom)
    s = stats.summarize(strong_effect(10), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    for by in s["paired"].values():
        assert by["decode_tok_s"]["verdict"] == "inconclusive"
        assert "bootstrap exploded" in by["decode_tok_s"]["reason"]


def test_nan_p_value_is_inconclusive(monkeypatch):
    monkeypatch.setattr(scipy.stats, "wilcoxon",
                        lambda *a, **k: scipy.stats._morestats.WilcoxonResult(np.nan, np.nan))
    s = stats.summarize(strong_effect(10), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    assert set(verdicts(s).values()) == {"inconclusive"}


def test_identical_ratios_degenerate_bootstrap_is_inconclusive():
    # Every pair has exactly the same log ratio: BCa cannot be computed (NaN), so no verdict.
    rows = [{"round": r, "arm": arm, "length": 64, "selected": True, "decode_tok_s": value}
            for r in range(1, 11) for arm, value in (("A", 10.0), ("B", 15.0))]
    s = stats.summarize(pd.DataFrame(rows), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    p = s["paired"]["64"]["decode_tok_s"]
    assert p["verdict"] == "inconclusive" and "NaN" in p["reason"]
    assert p["hl_ratio"] == pytest.approx(1.5)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.drop(columns=["round"]), "round"),
    (lambda d: d.drop(columns=["ttft_ms"]), "ttft_ms"),
    (lambda d: d.assign(selected="maybe"), "selected"),
    (lambda d: d.assign(decode_tok_s="fast"), "decode_tok_s"),
    (lambda d: pd.concat([d, d.iloc[[0]]]), "more than one selected row for arm 'stock', length 256, round 1"),
    (lambda d: d.assign(ok=d["round"] != 4), "selected but failed a gate .* round 4"),
])
def test_bad_input_names_the_culprit(mutate, match):
    with pytest.raises(stats.StatsInputError, match=match):
        stats.summarize(mutate(load("known.csv")), baseline="stock", candidate="patched",
                        metrics=["decode_tok_s", "ttft_ms"], **FAST)


def test_bad_arm_and_metric_names_are_errors():
    df = load("known.csv")
    with pytest.raises(stats.StatsInputError, match="candidate arm 'patchd'.*patched, stock"):
        stats.summarize(df, baseline="stock", candidate="patchd", metrics=["decode_tok_s"], **FAST)
    with pytest.raises(stats.StatsInputError, match="metric 'kv_bytes'"):
        stats.summarize(df, baseline="stock", candidate="patched", metrics=["kv_bytes"], **FAST)


# --------------------------------------------------------------------------- disclosures

def test_slow_samples_are_flagged_and_retained(known, expected):
    _, s = known
    got = {(f["arm"], f["length"], f["metric"], f["round"]): f for f in s["disclosures"]["slow_samples"]
           if f["arm"] == "stock"}
    want = {(w["arm"], w["length"], w["metric"], w["round"]): w for w in expected["slow_samples"]}
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert got[key]["side"] == w["side"]
        assert got[key]["robust_z"] == pytest.approx(w["robust_z"], abs=1e-3)
    # retained: the 200 ms sample is still the max and still in n
    assert s["arms"]["stock"]["256"]["ttft_ms"]["max"] == 200
    assert s["arms"]["stock"]["256"]["ttft_ms"]["n"] == 10
    assert "retained" in statistics_section(s)


def test_median_trimmed_disagreement_of_the_seed_report_is_disclosed():
    s = stats.summarize(load("seed_case.csv"), baseline="base", candidate="cand",
                        metrics=["decode_tok_s"], **FAST)
    [d] = s["disclosures"]["median_trimmed_disagreements"]
    assert d["median_change"] == pytest.approx(0.0093, abs=1e-6)
    assert d["trimmed_mean_change"] == pytest.approx(0.0749, abs=1e-6)
    assert d["sign_differs"] is False
    md = statistics_section(s)
    assert "+0.93%" in md and "+7.49%" in md


def test_agreeing_median_and_trimmed_mean_are_not_flagged():
    df = load("aa_quiet.csv")
    base = df[df["arm"] == "A"]
    cand = base.assign(arm="B", decode_tok_s=base["decode_tok_s"] * 1.05
                       * np.exp(np.random.default_rng(2).normal(0, 0.001, len(base))))
    s = stats.summarize(pd.concat([base, cand]), baseline="A", candidate="B", metrics=["decode_tok_s"], **FAST)
    assert s["disclosures"]["median_trimmed_disagreements"] == []
    assert "agree everywhere" in statistics_section(s)


def test_unpaired_rounds_are_disclosed_and_left_out_of_pairs():
    df = load("known.csv")
    df = df[~((df["arm"] == "patched") & (df["round"] == 2) & (df["length"] == 256))]
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"], **FAST)
    assert s["disclosures"]["unpaired"] == [{"arm": "stock", "length": 256, "round": 2}]
    assert s["paired"]["256"]["decode_tok_s"]["n_pairs"] == 9
    assert "unpaired (partial visit): `stock` round 2" in statistics_section(s)


# --------------------------------------------------------------------------- outputs

def test_summary_validates_against_schema_and_round_trips(tmp_path, known):
    _, s = known
    artifacts.validate("summary", stamped(s))
    path = tmp_path / "summary.json"
    artifacts.write_artifact(path, "summary", {**s, "inputs": {"measurements": "cd" * 32}})
    assert artifacts.read_artifact(path, "summary")["paired"] == json.loads(json.dumps(s["paired"]))


def test_schema_rejects_a_verdict_outside_the_four(known):
    _, s = known
    bad = json.loads(json.dumps(stamped(s)))
    bad["paired"]["256"]["decode_tok_s"]["verdict"] = "significant"
    with pytest.raises(artifacts.ArtifactError, match="paired/256/decode_tok_s/verdict"):
        artifacts.validate("summary", bad)


def test_summary_is_deterministic_for_a_seed():
    df = load("aa_quiet.csv")
    a = stats.summarize(df, baseline="A", candidate="B", seed=7, **FAST)
    b = stats.summarize(df, baseline="A", candidate="B", seed=7, **FAST)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_tables_hold_only_numbers_and_allowlisted_categories(known):
    _, s = known
    tables = summary_tables(s)
    assert len(tables["summary"]) == 2 * 2 * 2 and len(tables["paired"]) == 2 * 2
    assert len(tables["ratios"]) == 10 * 2 + 4 * 2
    allowed = {"arm", "metric", "verdict"}
    for name, t in tables.items():
        for col in t.columns:
            if col not in allowed:
                assert pd.api.types.is_numeric_dtype(t[col]) or pd.api.types.is_bool_dtype(t[col]), (name, col)
    row = tables["paired"].set_index(["length", "metric"]).loc[(512, "decode_tok_s")]
    assert row["hl_ratio"] == pytest.approx(2 ** 1.5) and row["verdict"] == "inconclusive"


def test_report_speaks_plain_language():
    df = load("aa_quiet.csv")
    base = df[df["arm"] == "A"]
    cand = base.assign(arm="B", decode_tok_s=base["decode_tok_s"] * 1.041
                       * np.exp(np.random.default_rng(4).normal(0, 0.004, len(base))))
    s = stats.summarize(pd.concat([base, cand]), baseline="A", candidate="B",
                        metrics=["decode_tok_s"], **FAST)
    md = statistics_section(s)
    assert md.startswith("## Statistics")
    line = next(l for l in md.splitlines() if "at 2048 tokens" in l and "decode" in l)
    assert "**faster**" in line and "% higher" in line and "95% CI" in line and "p=" in line
    aa = statistics_section(stats.summarize(df, baseline="A", candidate="B", **FAST))
    assert "**no detectable difference**" in aa and "**faster**" not in aa and "**slower**" not in aa
