"""Tests of pairbench.analysis.stats (and signrank, verdicts): known answers, every verdict path,
Holm, memory, repeats, dropped pairs, error paths, disclosures and the summary schema.

Fixtures live in tests/data/stats/: ``known.csv`` + ``known_expected.json`` (hand-derived answers),
``seed_case.csv`` (the seed report's +0.93% median vs +7.49% trimmed-mean case), and A/A runs of the
real engine (``aa_*.csv``; see docs/statistics.md). Verdict paths use hand-built log differences
whose intervals can be derived by hand (the Walsh averages of an arithmetic sequence).
"""

import itertools
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from pairbench.core import artifacts
from pairbench.analysis import signrank, stats, verdicts as pb_verdicts
from pairbench.analysis.describe import default_trim, trimmed_mean
from pairbench.analysis.tables import summary_tables
from pairbench.publish.stats_section import statistics_section

DATA = Path(__file__).resolve().parent.parent / "data" / "stats"
LOG101 = math.log(1.01)


def load(name: str) -> pd.DataFrame:
    return pd.read_csv(DATA / name)


@pytest.fixture(scope="module")
def known():
    df = load("known.csv")
    return df, stats.summarize(df, **KNOWN)


@pytest.fixture(scope="module")
def expected():
    return json.loads((DATA / "known_expected.json").read_text())


def verdicts(summary: dict, role: str = "primary") -> dict:
    return {(cid, m): p["verdict"] for cid, by in summary["paired"].items()
            for m, p in by.items() if p["role"] == role}


def whole(df: pd.DataFrame, *, candidate: str, **kw) -> dict:
    """The run summary (stats/summary.json's body) of a one-candidate run."""
    return stats.summarize_all(df, candidates=[candidate], **kw)


def report(df: pd.DataFrame, **kw) -> str:
    return statistics_section(whole(df, **kw))


def stamped(summary: dict) -> dict:
    return {**summary, "schema": artifacts.schema_id("summary"), "inputs": {"measurements": "ab" * 32}}


KNOWN = {"baseline": "stock", "candidate": "patched", "metrics": ["decode_tok_s"], "secondary": ["ttft_ms"]}


def cond(input_tokens: int) -> dict:
    """The table's condition columns at one input length (64 output tokens): the id, one per factor."""
    return {"condition": f"in{input_tokens}-out64", "input_tokens": input_tokens, "output_tokens": 64}


def frame(d_by_input: dict, metric: str = "decode_tok_s", base: float = 100.0) -> pd.DataFrame:
    """Baseline *base* in every round, candidate base * exp(d): the log differences are exactly d."""
    rows = []
    for n, d in d_by_input.items():
        for r, di in enumerate(d, start=1):
            rows.append({"round": r, "arm": "A", **cond(n), "selected": True, metric: base})
            rows.append({"round": r, "arm": "B", **cond(n), "selected": True, metric: base * math.exp(di)})
    return pd.DataFrame(rows)


def one(d, metric="decode_tok_s", **kw) -> dict:
    s = stats.summarize(frame({64: d}, metric), baseline="A", candidate="B", metrics=[metric], secondary=[],
                        memory=[], **kw)
    return s["paired"]["in64-out64"][metric]


def ramp(center: float, step: float, n: int = 10) -> list[float]:
    """center + step * (i - (n + 1) / 2), i = 1..n: Walsh averages center + step/2 * (i + j - n - 1)."""
    return [center + step * (i - (n + 1) / 2) for i in range(1, n + 1)]


# --------------------------------------------------------------------------- the exact procedure

def test_p_value_is_scipys_exact_wilcoxon():
    rng = np.random.default_rng(0)
    for n in range(1, 21):
        for _ in range(4):
            d = rng.normal(0.2, 1, n)
            want = scipy.stats.wilcoxon(d, method="exact").pvalue
            assert signrank.p_value(signrank.walsh(d), n) == pytest.approx(want, abs=1e-12), n


def test_critical_counts_match_the_published_table():
    # two-sided 0.05 critical values of the signed-rank statistic (Hollander & Wolfe, table A.4)
    assert [signrank.critical_count(n, 0.05) for n in (5, 6, 7, 8, 10, 15, 20)] == [-1, 0, 2, 3, 8, 25, 52]


def test_interval_is_exactly_the_deltas_the_test_does_not_reject():
    rng = np.random.default_rng(1)
    for n in (6, 9, 14):
        d = rng.normal(0, 1, n)
        w = signrank.walsh(d)
        for alpha in (0.05, 0.1, 0.0125):
            low, high = signrank.interval(w, n, alpha)
            for delta in np.concatenate([w, w + 1e-9, w - 1e-9, rng.normal(0, 1.5, 50)]):
                inside = low <= delta <= high
                assert (signrank.p_value(w, n, delta) < alpha) == (not inside), (n, alpha, delta)


def test_hodges_lehmann_interval_known_answer():
    # n = 6 at 0.05: c = 0, the interval is [smallest, largest] Walsh average = [min d, max d];
    # the estimate is the median of the 21 Walsh averages of 1..6 (scaled), 3.5
    p = one([0.01 * k for k in range(1, 7)])
    assert p["hl_ratio"] == pytest.approx(math.exp(0.035))
    assert (p["ci_low"], p["ci_high"]) == (pytest.approx(math.exp(0.01)), pytest.approx(math.exp(0.06)))
    assert p["ci_level"] == pytest.approx(0.95)


def test_hodges_lehmann_matches_brute_force_walsh_averages():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 10, 13):
        x = rng.normal(size=n)
        walsh = [(a + b) / 2 for a, b in itertools.combinations_with_replacement(x, 2)]
        assert float(signrank.hodges_lehmann(x)) == pytest.approx(statistics.median(walsh))


# --------------------------------------------------------------------------- every verdict path

def test_faster_higher_is_better():
    p = one(ramp(math.log(1.05), 0.002))
    assert p["verdict"] == "faster" and "wholly above 1 + 0.01" in p["reason"]
    assert p["rounds_needed"] is None


def test_slower_higher_is_better():
    assert one(ramp(-math.log(1.05), 0.002))["verdict"] == "slower"


def test_faster_lower_is_better():
    # a time 5% lower: the ratio is below 1, and for ms lower is faster
    assert one(ramp(-math.log(1.05), 0.002), metric="ttft_ms")["verdict"] == "faster"


def test_slower_lower_is_better():
    p = one(ramp(math.log(1.05), 0.002), metric="e2e_ms")
    assert p["verdict"] == "slower" and p["higher_is_better"] is False
    assert p["ci_low"] > 1.01


def test_equivalent():
    p = one(ramp(0.0, 0.001))
    assert p["verdict"] == "equivalent" and "wholly inside 1 ± 0.01" in p["reason"]
    assert 0.99 < p["ci_low"] < p["ci_high"] < 1.01


def test_inconclusive_straddling_states_half_width_detectable_effect_and_rounds():
    # d = 0.02 (i - 5.5): Walsh averages 0.01 (i + j - 11); with c = 8 the interval is the 9th
    # smallest and largest, i + j = 6 and 16: [-0.05, 0.05]. The estimate 0 must get within
    # log(1.01) of both ends to resolve: 10 * 0.05^2 / log(1.01)^2 = 252.5 -> 253 pairs.
    p = one(ramp(0.0, 0.02))
    assert p["verdict"] == "inconclusive" and "straddles" in p["reason"]
    assert p["log_half_width"] == pytest.approx(0.05)
    assert p["half_width"] == pytest.approx(math.sinh(0.05))
    assert p["rounds_needed"] == 253
    z, z80 = scipy.stats.norm.ppf(0.975), scipy.stats.norm.ppf(0.8)
    assert p["detectable_change"] == pytest.approx(math.expm1(LOG101 + 0.05 * (1 + z80 / z)))


def test_inconclusive_when_a_change_is_detected_but_not_beyond_the_threshold():
    p = one(ramp(LOG101, 0.0004))
    assert p["verdict"] == "inconclusive" and p["ci_low"] > 1.0 and p["p_value"] < 0.05
    assert "a change is detected" in p["reason"]


def test_inconclusive_with_too_few_pairs_for_any_interval():
    p = one(ramp(math.log(2.0), 0.01, n=5))
    assert p["verdict"] == "inconclusive" and p["ci_low"] is None and p["half_width"] is None
    assert p["min_attainable_p"] == pytest.approx(0.0625) and "no 95.00% interval is bounded" in p["reason"]
    assert p["hl_ratio"] == pytest.approx(2.0)  # the estimate is still reported
    assert p["rounds_needed"] is not None and p["rounds_needed"] > 5


def test_custom_alpha_changes_what_can_be_claimed():
    five = ramp(math.log(2.0), 0.01, n=5)
    assert one(five)["verdict"] == "inconclusive"          # 2^(1-5) = 0.0625 is not below 0.05
    loose = one(five, alpha=0.1)                            # ... but is below 0.1: c = 0
    assert loose["verdict"] == "faster" and loose["ci_level"] == pytest.approx(0.9)
    assert loose["ci_low"] == pytest.approx(math.exp(min(five)))
    ten = ramp(math.log(1.05), 0.003)
    assert one(ten)["verdict"] == "faster"
    assert one(ten, alpha=0.001)["verdict"] == "inconclusive"  # 2^(1-10) = 0.00195 is not below 0.001


def test_identical_ratios_give_a_zero_width_interval():
    p = one([math.log(1.5)] * 10)
    assert p["verdict"] == "faster" and p["ci_low"] == pytest.approx(1.5) == p["ci_high"]


@pytest.mark.parametrize("low, high, higher_is_better, words, want", [
    (1.05, 1.10, True, pb_verdicts.SPEED_WORDS, ("faster", "the interval lies wholly above 1 + 0.01")),
    (1.05, 1.10, False, pb_verdicts.SPEED_WORDS, ("slower", "the interval lies wholly above 1 + 0.01")),
    (0.90, 0.95, False, pb_verdicts.MEMORY_WORDS, ("smaller", "the interval lies wholly below 1 - 0.01")),
    (0.90, 0.95, True, {"better": "more", "worse": "less"}, ("less", "the interval lies wholly below 1 - 0.01")),
    (0.995, 1.005, True, pb_verdicts.SPEED_WORDS, ("equivalent", "the interval lies wholly inside 1 ± 0.01")),
    (1.005, 1.05, True, pb_verdicts.SPEED_WORDS,
     ("inconclusive", "a change is detected, but the interval reaches into 1 ± 0.01")),
    (0.98, 1.05, True, pb_verdicts.SPEED_WORDS, ("inconclusive", "the interval straddles the threshold 1 ± 0.01")),
    (0.0, math.inf, True, pb_verdicts.SPEED_WORDS, ("inconclusive", "the interval is unbounded")),
])
def test_one_rule_reads_every_interval(low, high, higher_is_better, words, want):
    j = pb_verdicts.read_interval(math.log(low) if low else -math.inf, math.log(high), noise=0.01,
                                  higher_is_better=higher_is_better, words=words)
    assert (j.verdict, j.reason) == want and j.claim == (want[0] != "inconclusive")
    with pytest.raises(AttributeError):  # a Judgement is frozen: what an interval said stays said
        j.verdict = "faster"


def test_an_interval_touching_the_band_is_inconclusive_but_an_exact_ratio_there_is_inside():
    edge = math.log1p(0.25)
    assert pb_verdicts.read_interval(edge, math.log(2), noise=0.25).verdict == "inconclusive"
    assert pb_verdicts.read_interval(0.0, edge, noise=0.25).verdict == "inconclusive"
    # an exact ratio (a memory metric constant in every record; the engine tool's ratio): the band's
    # edges count as inside, at 1 ± noise as the user writes them (0.99 for noise 0.01)
    for ratio, noise in ((1.25, 0.25), (0.75, 0.25), (0.99, 0.01), (1.01, 0.01)):
        assert pb_verdicts.read_ratio(ratio, noise=noise).verdict == "equivalent", (ratio, noise)
    assert pb_verdicts.read_ratio(0.9899, noise=0.01).verdict == "slower"
    assert pb_verdicts.read_ratio(0.5625, noise=0.01, higher_is_better=False,
                                  words=pb_verdicts.MEMORY_WORDS).verdict == "smaller"
    assert pb_verdicts.read_ratio(0.0, noise=0.01).verdict == "slower"


def test_no_path_from_missing_values_to_a_claim():
    df = frame({64: ramp(math.log(2.0), 0.01, n=7)})
    df.loc[(df["arm"] == "B") & (df["round"] == 1), "decode_tok_s"] = 0.0
    df.loc[(df["arm"] == "B") & (df["round"] == 2), "decode_tok_s"] = np.nan
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"])
    p = s["paired"]["in64-out64"]["decode_tok_s"]
    assert (p["n_pairs"], p["n_invalid_pairs"], p["verdict"]) == (5, 2, "inconclusive")


def test_secondary_metrics_are_shown_not_tested():
    df = frame({64: ramp(math.log(1.05), 0.002)})
    df["ttft_ms"] = 1000.0 / df["decode_tok_s"]
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"], secondary=["ttft_ms"])
    p = s["paired"]["in64-out64"]["ttft_ms"]
    assert p["role"] == "secondary" and p["verdict"] is None and p["ci_low"] is not None
    assert s["params"]["family_size"] == 1


# --------------------------------------------------------------------------- Holm

def holm_frame(strong_a: bool) -> pd.DataFrame:
    # 256: ten pairs; 512: six pairs all beyond the threshold, claim p = 2 * 2^-6 = 0.03125
    a = ramp(math.log(1.2), 0.01) if strong_a else ramp(0.0, 0.05)
    return frame({256: a, 512: ramp(math.log(1.2), 0.01, n=6)})


def test_holm_judges_the_second_claim_at_alpha_over_one():
    s = stats.summarize(holm_frame(True), baseline="A", candidate="B", metrics=["decode_tok_s"])
    a, b = s["paired"]["in256-out64"]["decode_tok_s"], s["paired"]["in512-out64"]["decode_tok_s"]
    assert a["claim_p"] == pytest.approx(2 / 1024) and b["claim_p"] == pytest.approx(2 / 64)
    assert (a["family_rank"], a["ci_level"]) == (1, pytest.approx(1 - 0.05 / 2))
    assert (b["family_rank"], b["ci_level"]) == (2, pytest.approx(1 - 0.05))
    assert a["verdict"] == b["verdict"] == "faster"
    bonf = stats.summarize(holm_frame(True), baseline="A", candidate="B", metrics=["decode_tok_s"],
                           multiplicity="bonferroni")["paired"]["in512-out64"]["decode_tok_s"]
    assert bonf["verdict"] == "inconclusive"  # 0.03125 is not below 0.05 / 2


def test_holm_stops_at_the_first_comparison_it_cannot_claim():
    s = stats.summarize(holm_frame(False), baseline="A", candidate="B", metrics=["decode_tok_s"])
    b = s["paired"]["in512-out64"]["decode_tok_s"]
    assert b["family_rank"] == 1 and b["ci_level"] == pytest.approx(0.975) and b["verdict"] == "inconclusive"
    assert s["paired"]["in256-out64"]["decode_tok_s"]["ci_level"] == pytest.approx(0.975)  # stopped: same level
    none = stats.summarize(holm_frame(False), baseline="A", candidate="B", metrics=["decode_tok_s"],
                           multiplicity="none")["paired"]["in512-out64"]["decode_tok_s"]
    assert none["verdict"] == "faster"


def arms_frame(d_by_arm: dict, input_tokens: int = 64, base: float = 100.0) -> pd.DataFrame:
    """Baseline A at *base* in rounds 1..10; each candidate base * exp(d) in rounds 1..len(d)."""
    rows = [{"round": r, "arm": "A", **cond(input_tokens), "selected": True, "decode_tok_s": base}
            for r in range(1, 11)]
    rows += [{"round": r, "arm": arm, **cond(input_tokens), "selected": True, "decode_tok_s": base * math.exp(di)}
             for arm, d in d_by_arm.items() for r, di in enumerate(d, start=1)]
    return pd.DataFrame(rows)


STRONG, SIX = ramp(math.log(1.2), 0.01), ramp(math.log(1.2), 0.01, n=6)  # claim p 2/1024 and 2/64


def test_one_candidate_run_holds_its_pair_with_the_pairs_own_family():
    # holm_frame(True): both conditions' differences are ramps centred on log 1.2, so each estimate is
    # exactly 1.2. 256 (10 pairs, rank 1) is judged at 0.05 / 2: the signed-rank critical count
    # for n = 10 at 0.025 two-sided is 5 (P(T <= 5) = 10/1024, P(T <= 6) = 14/1024 > 0.0125), so
    # the interval runs from the 6th smallest to the 6th largest Walsh average, i + j = 5 and 17,
    # log 1.2 -+ 0.005 * 6. 512 (6 pairs, rank 2) at 0.05: count 0, [min d, max d] = log 1.2 -+ 0.025.
    run = stats.summarize_all(holm_frame(True), baseline="A", candidates=["B"], metrics=["decode_tok_s"])
    assert (run["baseline"], run["candidates"], sorted(run["comparisons"])) == ("A", ["B"], ["B"])
    assert run["params"]["family_size"] == run["comparisons"]["B"]["params"]["family_size"] == 2
    got = {c: by["decode_tok_s"] for c, by in run["comparisons"]["B"]["paired"].items()}
    want = {"in256-out64": (1, 0.975, 0.03), "in512-out64": (2, 0.95, 0.025)}
    assert sorted(got) == sorted(want)
    for c, (rank, level, half) in want.items():
        p = got[c]
        assert (p["family_rank"], p["ci_level"], p["verdict"]) == (rank, pytest.approx(level), "faster"), c
        assert p["hl_ratio"] == pytest.approx(1.2)
        assert (p["ci_low"], p["ci_high"]) == (pytest.approx(1.2 * math.exp(-half)),
                                               pytest.approx(1.2 * math.exp(half))), c


def test_holm_family_spans_every_candidate():
    run = stats.summarize_all(arms_frame({"B": STRONG, "C": SIX}), baseline="A", candidates=["B", "C"],
                              metrics=["decode_tok_s"], secondary=[], memory=[])
    b, c = (run["comparisons"][k]["paired"]["in64-out64"]["decode_tok_s"] for k in ("B", "C"))
    assert (b["family_rank"], b["ci_level"], b["verdict"]) == (1, pytest.approx(1 - 0.05 / 2), "faster")
    assert (c["family_rank"], c["ci_level"], c["verdict"]) == (2, pytest.approx(1 - 0.05), "faster")
    assert run["params"]["family_size"] == 2 and run["params"]["width_level"] == pytest.approx(0.025)
    assert run["comparisons"]["C"]["params"]["family_size"] == 2  # each pair body records the whole family


def test_a_third_candidate_that_claims_nothing_raises_the_bar_for_the_others():
    # alone with B, C's 0.03125 is judged at 0.05 (above); with a null D, Holm stops at C: 0.05 / 2
    run = stats.summarize_all(arms_frame({"B": STRONG, "C": SIX, "D": ramp(0.0, 0.05)}), baseline="A",
                              candidates=["B", "C", "D"], metrics=["decode_tok_s"], secondary=[], memory=[])
    got = {k: run["comparisons"][k]["paired"]["in64-out64"]["decode_tok_s"] for k in ("B", "C", "D")}
    assert {k: (p["family_rank"], round(1 - p["ci_level"], 6), p["verdict"]) for k, p in got.items()} == {
        "B": (1, round(0.05 / 3, 6), "faster"), "C": (2, 0.025, "inconclusive"), "D": (3, 0.025, "inconclusive")}
    alone = stats.summarize(arms_frame({"C": SIX}), baseline="A", candidate="C", metrics=["decode_tok_s"],
                            secondary=[], memory=[])
    assert alone["paired"]["in64-out64"]["decode_tok_s"]["verdict"] == "faster"


def test_bonferroni_across_candidates_splits_alpha_by_the_whole_family():
    run = stats.summarize_all(arms_frame({"B": STRONG, "C": SIX}), baseline="A", candidates=["B", "C"],
                              metrics=["decode_tok_s"], secondary=[], memory=[], multiplicity="bonferroni")
    c = run["comparisons"]["C"]["paired"]["in64-out64"]["decode_tok_s"]
    assert (c["ci_level"], c["verdict"]) == (pytest.approx(1 - 0.025), "inconclusive")


def test_the_report_has_one_verdict_table_over_every_candidate():
    md = statistics_section(stats.summarize_all(arms_frame({"B": STRONG, "C": SIX}), baseline="A",
                                                candidates=["B", "C"], metrics=["decode_tok_s"], secondary=[],
                                                memory=[]))
    assert "Candidates `B`, `C`, each against baseline `A`" in md
    assert ("Holm's step-down procedure across the 2 primary comparisons (2 candidates × primary metrics × "
            "conditions, one family)") in md
    # B, n = 10 at 2.5%: c = 5 (P(T <= 5) = 10/1024), so [W(6), W(50)] = 1.2 exp(∓0.03);
    # C, n = 6 at 5%: c = 0, so the extreme Walsh averages, 1.2 exp(∓0.025)
    table = [line for line in md.splitlines() if line.startswith("| `")]
    assert table == ["| `B` | `in64-out64` | `decode_tok_s` | **faster** | 1.2000 | 1.1645–1.2365 (97.50%) | 10 |",
                     "| `C` | `in64-out64` | `decode_tok_s` | **faster** | 1.2000 | 1.1704–1.2304 (95.00%) | 6 |"]
    assert "- unpaired (partial visit): `A` round 7, `in64-out64` has no partner in `C` against `A`" in md
    assert "no partner in `B`" not in md


def test_candidates_must_be_distinct_and_present():
    df = arms_frame({"B": STRONG})
    with pytest.raises(stats.StatsInputError, match="^candidates: arm 'B' is listed twice"):
        stats.summarize_all(df, baseline="A", candidates=["B", "B"], metrics=["decode_tok_s"])
    with pytest.raises(stats.StatsInputError, match="^candidate arm 'Z' has no rows"):
        stats.summarize_all(df, baseline="A", candidates=["B", "Z"], metrics=["decode_tok_s"])
    with pytest.raises(stats.StatsInputError, match="^candidates: no candidate arm"):
        stats.summarize_all(df, baseline="A", candidates=[], metrics=["decode_tok_s"])


def test_holm_is_disclosed_in_the_report():
    md = report(holm_frame(True), baseline="A", candidate="B", metrics=["decode_tok_s"])
    assert "Holm's step-down procedure across the 2 primary comparisons" in md
    assert "97.50%" in md and "95.00%" in md


def test_claim_p_orders_like_the_interval_decides():
    # for any data and alpha, "claim_p < alpha" and "the interval at alpha makes that claim" agree
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(4, 16))
        c = pb_verdicts.Comparison(("1", "decode_tok_s"), rng.normal(rng.normal(0, 0.03), 0.02, n), True,
                                   pb_verdicts.SPEED_WORDS)
        p, claim = pb_verdicts.claim_p(c, 0.01)
        for alpha in (0.05, 0.025, 0.0125, 0.1):
            v = pb_verdicts.judge(c, alpha=alpha, noise=0.01)["verdict"]
            assert (v == claim) == (p < alpha), (n, alpha, p, claim, v)


# --------------------------------------------------------------------------- one question, one test

@pytest.mark.parametrize("kw, match", [
    (dict(metrics=["decode_tok_s", "decode_tok_s"]), r"stats.metrics: decode_tok_s listed more than once"),
    (dict(metrics=["prefill_tok_s", "ttft_ms"]), r"stats.metrics: prefill_tok_s and ttft_ms answer the same question"),
    (dict(metrics=["decode_tok_s", "engine_decode_tok_s"]), r"same question \(decode\)"),
    (dict(metrics=["decode_tok_s"], secondary=["decode_tok_s"]), r"stats.secondary: decode_tok_s is already a primary"),
    (dict(metrics=["kv_bytes"]), r"stats.metrics: 'kv_bytes' is not one of"),
    (dict(metrics=["decode_tok_s"], memory=["ttft_ms"]), r"stats.memory: 'ttft_ms' is not one of"),
    (dict(metrics=[]), r"stats.metrics: no primary metric"),
    (dict(metrics=["decode_tok_s"], multiplicity="sidak"), r"stats.multiplicity: 'sidak'"),
    (dict(metrics=["decode_tok_s"], alpha=1.5), r"stats.alpha"),
    (dict(metrics=["decode_tok_s"], noise=-0.1), r"stats.noise"),
    (dict(metrics=["decode_tok_s"], trim=-1), r"stats.trim"),
])
def test_bad_metric_lists_and_params_name_the_key(kw, match):
    df = load("aa_contended.csv")
    with pytest.raises(stats.StatsInputError, match=match):
        stats.summarize(df, baseline="A", candidate="B", **kw)


# --------------------------------------------------------------------------- memory

def memory_frame(rss_varies: bool) -> pd.DataFrame:
    df = frame({256: ramp(-math.log(1.3), 0.01)})
    df["kv_bytes"] = np.where(df["arm"] == "A", 50_900_000, 13_100_000)
    rng = np.random.default_rng(2)
    df["peak_rss_bytes"] = np.where(df["arm"] == "A", 400e6, 380e6) * (
        np.exp(rng.normal(0, 0.001, len(df))) if rss_varies else 1.0)
    return df


def test_constant_memory_gets_the_exact_ratio_and_no_test():
    s = stats.summarize(memory_frame(False), baseline="A", candidate="B", metrics=["decode_tok_s"])
    kv = s["memory"]["in256-out64"]["kv_bytes"]
    assert kv["exact"] is True and kv["ratio"] == pytest.approx(13.1 / 50.9) and kv["verdict"] == "smaller"
    assert kv["test"] is None and s["params"]["memory_family_size"] == 0
    md = report(memory_frame(False), baseline="A", candidate="B", metrics=["decode_tok_s"])
    assert "`B` 13.1 MB against `A` 50.9 MB, exactly 0.2574×" in md
    assert "**slower**: decode throughput" in md  # what it costs, beside what it buys


def test_varying_memory_is_tested_in_its_own_family():
    s = stats.summarize(memory_frame(True), baseline="A", candidate="B", metrics=["decode_tok_s"])
    rss = s["memory"]["in256-out64"]["peak_rss_bytes"]
    assert rss["exact"] is False and rss["verdict"] == "smaller" and rss["test"]["ci_high"] < 0.99
    assert s["params"]["memory_family_size"] == 1 and s["params"]["family_size"] == 1
    assert s["paired"]["in256-out64"]["decode_tok_s"]["ci_level"] == pytest.approx(0.95)  # speed family untouched


def test_memory_not_recorded_is_said_so():
    df = memory_frame(False)
    df["peak_rss_bytes"] = 0
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"])
    m = s["memory"]["in256-out64"]["peak_rss_bytes"]
    assert m["ratio"] is None and m["verdict"] == "inconclusive" and m["reason"] == "not recorded for A and B"


# --------------------------------------------------------------------------- repeats and dropped pairs

def test_the_paired_unit_is_the_visit_median_of_its_repeats():
    rows = []
    for r in range(1, 11):
        for rep, (a, b) in enumerate([(100, 110), (100, 111), (100, 300)], start=1):  # one wild repeat
            rows += [{"round": r, "arm": "A", **cond(8), "repeat": rep, "selected": True, "decode_tok_s": a},
                     {"round": r, "arm": "B", **cond(8), "repeat": rep, "selected": True, "decode_tok_s": b}]
    s = stats.summarize(pd.DataFrame(rows), baseline="A", candidate="B", metrics=["decode_tok_s"])
    p = s["paired"]["in8-out64"]["decode_tok_s"]
    assert [q["ratio"] for q in p["pairs"]] == [pytest.approx(1.11)] * 10
    assert p["pairs"][0]["n_candidate"] == 3 and s["counts"]["max_repeats"] == 3
    b = s["arms"]["B"]["in8-out64"]["decode_tok_s"]
    assert b["n"] == 30 and b["n_visits"] == 10
    dup = pd.concat([pd.DataFrame(rows), pd.DataFrame(rows[:1])])
    with pytest.raises(stats.StatsInputError, match="condition in8-out64, round 1, repeat 1"):
        stats.summarize(dup, baseline="A", candidate="B", metrics=["decode_tok_s"])


def test_a_pair_whose_side_a_validation_retry_measured_is_dropped_and_disclosed():
    df = frame({64: ramp(math.log(1.05), 0.002)})
    df["retry"] = 0
    df.loc[(df["arm"] == "B") & (df["round"] == 3), "retry"] = 1
    s = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"])
    p = s["paired"]["in64-out64"]["decode_tok_s"]
    assert (p["n_pairs"], p["n_dropped_pairs"], p["n_invalid_pairs"]) == (9, 1, 0)
    assert s["disclosures"]["dropped_pairs"] == [{"condition": "in64-out64", "round": 3, "arm": "B"}]
    assert s["arms"]["B"]["in64-out64"]["decode_tok_s"]["n"] == 10  # the cell still counts per arm
    assert ("pair dropped: round 3, `in64-out64`: the `B` cell was re-measured"
            in report(df, baseline="A", candidate="B", metrics=["decode_tok_s"]))


# --------------------------------------------------------------------------- known answers

def test_estimators_on_hand_derived_values():
    assert trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 20, 100], 1) == pytest.approx(6.875)
    assert trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 20, 100], 0) == pytest.approx(15.6)
    assert np.isnan(trimmed_mean([1, 2], 1))
    assert float(signrank.hodges_lehmann(np.array([0.0, 1.0, 2.0, 3.0]))) == pytest.approx(1.5)
    assert signrank.min_attainable_p(5) == pytest.approx(0.0625)
    assert signrank.min_attainable_p(6) == pytest.approx(0.03125)
    assert [default_trim(n) for n in (3, 4, 5, 9, 10, 19, 20)] == [0, 0, 1, 1, 1, 1, 2]


def test_per_arm_known_answers(known, expected):
    _, s = known
    for arm, by_cond in expected["arms"].items():
        for cid, by_metric in by_cond.items():
            for metric, want in by_metric.items():
                got = s["arms"][arm][cid][metric]
                for key in ("n", "median", "min", "max", "trimmed_mean", "trim_per_end"):
                    assert got[key] == pytest.approx(want[key]), (arm, cid, metric, key)


def test_paired_known_answers(known, expected):
    _, s = known
    for cid, by_metric in expected["paired"].items():
        for metric, want in by_metric.items():
            got = s["paired"][cid][metric]
            for key, value in want.items():
                if key != "why":
                    assert (got[key] == pytest.approx(value)) if not isinstance(value, str) else got[key] == value, key
    k = np.log2([p["ratio"] for p in s["paired"]["in256-out64"]["decode_tok_s"]["pairs"]])
    walsh = [(a + b) / 2 for a, b in itertools.combinations_with_replacement(k, 2)]
    assert s["paired"]["in256-out64"]["decode_tok_s"]["hl_ratio"] == pytest.approx(2 ** statistics.median(walsh))


def test_explicit_trim_is_per_end_and_too_large_a_trim_gives_null():
    df = load("known.csv")
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"], trim=2)
    d = s["arms"]["stock"]["in256-out64"]["decode_tok_s"]
    assert d["trim_per_end"] == 2 and d["trimmed_mean"] == pytest.approx((3 + 4 + 5 + 6 + 7 + 8) / 6)
    assert s["arms"]["stock"]["in512-out64"]["decode_tok_s"]["trimmed_mean"] is None  # 4 samples, 2+2 dropped


def test_only_selected_rows_count_and_the_rest_are_listed_with_reasons(known):
    _, s = known
    assert s["arms"]["stock"]["in256-out64"]["decode_tok_s"]["max"] == 100  # the 999 of the failed row is out
    excluded = {(e["arm"], e["round"], e["reason"]) for e in s["disclosures"]["excluded"]}
    assert excluded == {("stock", 11, "prompt_tokens: got 257, planned 256"),
                        ("patched", 3, "superseded: visit retried after connection reset")}
    assert s["counts"] == {"rows": 30, "selected": 28, "excluded": 2, "retries": 1, "unpaired": 0,
                           "dropped_pairs": 0, "max_repeats": 1}
    assert s["disclosures"]["retries"] == [{"arm": "patched", "condition": "in256-out64", "round": 3, "attempt": 2, "retry": 0,
                                            "selected": False}]


def test_missing_reason_column_is_tolerated():
    df = load("known.csv").drop(columns=["reason"])
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"])
    reasons = {e["round"]: e["reason"] for e in s["disclosures"]["excluded"]}
    assert reasons == {11: "failed a gate (no reason recorded)", 3: "not selected (no reason recorded)"}


# --------------------------------------------------------------------------- A/A of the real engine

@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("aa_*.csv")))
def test_aa_recorded_runs_claim_no_difference(name):
    df = load(name)
    s = stats.summarize(df, baseline="A", candidate="B")
    got = verdicts(s)
    assert got and set(got.values()) <= {"equivalent", "inconclusive"}, got


def test_injected_effect_on_recorded_aa_shifts_estimate_and_interval_by_exactly_that_factor():
    df = load("aa_contended.csv")
    # (multiplicity none: Holm's levels follow the claims, which the injected effect changes)
    base = stats.summarize(df, baseline="A", candidate="B", metrics=["decode_tok_s"], memory=[], multiplicity="none")
    k = 2.0
    inj = df.copy()
    inj.loc[inj["arm"] == "B", "decode_tok_s"] *= k
    s = stats.summarize(inj, baseline="A", candidate="B", metrics=["decode_tok_s"], memory=[], multiplicity="none")
    for cid, by in s["paired"].items():
        a, b = base["paired"][cid]["decode_tok_s"], by["decode_tok_s"]
        for key in ("hl_ratio", "median_ratio", "ci_low", "ci_high"):
            if a[key] is not None:
                assert b[key] == pytest.approx(k * a[key], rel=1e-9), (cid, key)


# --------------------------------------------------------------------------- disclosures

def test_slow_samples_are_flagged_and_retained(known, expected):
    df, s = known
    got = {(f["arm"], f["condition"], f["metric"], f["round"]): f for f in s["disclosures"]["slow_samples"]
           if f["arm"] == "stock"}
    want = {(w["arm"], w["condition"], w["metric"], w["round"]): w for w in expected["slow_samples"]}
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert got[key]["side"] == w["side"]
        assert got[key]["robust_z"] == pytest.approx(w["robust_z"], abs=1e-3)
    assert s["arms"]["stock"]["in256-out64"]["ttft_ms"]["max"] == 200
    assert s["arms"]["stock"]["in256-out64"]["ttft_ms"]["n"] == 10
    assert "retained" in report(df, **KNOWN)


def test_median_trimmed_disagreement_of_the_seed_report_is_disclosed():
    s = stats.summarize(load("seed_case.csv"), baseline="base", candidate="cand", metrics=["decode_tok_s"])
    [d] = s["disclosures"]["median_trimmed_disagreements"]
    assert d["median_change"] == pytest.approx(0.0093, abs=1e-6)
    assert d["trimmed_mean_change"] == pytest.approx(0.0749, abs=1e-6)
    assert d["sign_differs"] is False
    md = report(load("seed_case.csv"), baseline="base", candidate="cand", metrics=["decode_tok_s"])
    assert "+0.93%" in md and "+7.49%" in md


def test_unpaired_rounds_are_disclosed_and_left_out_of_pairs():
    df = load("known.csv")
    df = df[~((df["arm"] == "patched") & (df["round"] == 2) & (df["condition"] == "in256-out64"))]
    s = stats.summarize(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"])
    assert s["disclosures"]["unpaired"] == [{"arm": "stock", "condition": "in256-out64", "round": 2}]
    assert s["paired"]["in256-out64"]["decode_tok_s"]["n_pairs"] == 9
    assert ("unpaired (partial visit): `stock` round 2"
            in report(df, baseline="stock", candidate="patched", metrics=["decode_tok_s"]))


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.drop(columns=["round"]), "round"),
    (lambda d: d.drop(columns=["ttft_ms"]), "ttft_ms"),
    (lambda d: d.assign(selected="maybe"), "selected"),
    (lambda d: d.assign(decode_tok_s="fast"), "decode_tok_s"),
    (lambda d: pd.concat([d, d.iloc[[0]]]), "more than one selected row for arm 'stock', condition in256-out64, round 1"),
    (lambda d: d.assign(ok=d["round"] != 4), "selected but failed a gate .* round 4"),
])
def test_bad_input_names_the_culprit(mutate, match):
    with pytest.raises(stats.StatsInputError, match=match):
        stats.summarize(mutate(load("known.csv")), baseline="stock", candidate="patched",
                        metrics=["decode_tok_s"], secondary=["ttft_ms"])


def test_bad_arm_names_are_errors():
    with pytest.raises(stats.StatsInputError, match="candidate arm 'patchd'.*patched, stock"):
        stats.summarize(load("known.csv"), baseline="stock", candidate="patchd", metrics=["decode_tok_s"])


# --------------------------------------------------------------------------- outputs

def test_summary_validates_against_schema_and_round_trips(tmp_path, known):
    df, _ = known
    s = whole(df, **KNOWN)
    artifacts.validate("summary", stamped(s))
    artifacts.validate("summary", stamped(whole(memory_frame(True), baseline="A", candidate="B",
                                                metrics=["decode_tok_s"])))
    artifacts.validate("summary", stamped(whole(load("aa_contended.csv"), baseline="A", candidate="B")))
    path = tmp_path / "summary.json"
    artifacts.write_artifact(path, "summary", {**s, "inputs": {"measurements": "cd" * 32}})
    assert artifacts.read_artifact(path, "summary")["comparisons"] == json.loads(json.dumps(s["comparisons"]))


def test_schema_rejects_a_verdict_outside_the_vocabulary(known):
    df, _ = known
    bad = json.loads(json.dumps(stamped(whole(df, **KNOWN))))
    bad["comparisons"]["patched"]["paired"]["in256-out64"]["decode_tok_s"]["verdict"] = "no detectable difference"
    with pytest.raises(artifacts.ArtifactError, match="comparisons/patched/paired/in256-out64/decode_tok_s/verdict"):
        artifacts.validate("summary", bad)


def test_summary_is_deterministic():
    df = load("aa_contended.csv")
    a = stats.summarize(df, baseline="A", candidate="B", seed=7)
    b = stats.summarize(df, baseline="A", candidate="B", seed=7)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_tables_hold_only_numbers_and_allowlisted_categories(known):
    df, _ = known
    tables = summary_tables(whole(df, **KNOWN))
    assert len(tables["summary"]) == 2 * 2 * 2 and len(tables["paired"]) == 2 * 2
    assert len(tables["ratios"]) == 10 * 2 + 4 * 2
    assert set(tables["paired"]["candidate"]) == {"patched"}
    allowed = {"candidate", "arm", "condition", "metric", "verdict", "role"}
    for name, t in tables.items():
        for col in (t.columns if len(t) else []):
            if col not in allowed:
                assert pd.api.types.is_numeric_dtype(t[col]) or pd.api.types.is_bool_dtype(t[col]), (name, col)
    row = tables["paired"].set_index(["candidate", "condition", "metric"]).loc[("patched", "in512-out64", "decode_tok_s")]
    assert row["hl_ratio"] == pytest.approx(2 ** 1.5) and row["verdict"] == "inconclusive"


def test_report_speaks_plain_language():
    md = report(frame({64: ramp(math.log(1.041), 0.004)}), baseline="A", candidate="B", metrics=["decode_tok_s"])
    assert md.startswith("## Statistics")
    line = next(l for l in md.splitlines() if "at 64 input tokens, 64 output tokens" in l and "decode" in l)
    assert line.startswith("- **faster**: decode throughput (`decode_tok_s`) at 64 input tokens, 64 output tokens "
                           "is 4.1% higher")
    assert "95.00% interval" in line and "p = " in line
    inc = report(frame({64: ramp(0.0, 0.02)}), baseline="A", candidate="B", metrics=["decode_tok_s"])
    line = next(l for l in inc.splitlines() if l.startswith("- **inconclusive**"))
    assert "half-width ±5.0%" in line and "about 253 pairs would likely resolve it" in line
    assert "this run would detect a change of about 8.5% or more" in line


def test_a_condition_whose_every_record_was_excluded_stays_in_the_family_and_the_summary(known):
    df, full = known
    cond = sorted(df["condition"].unique())[0]
    dropped = df.assign(selected=df["selected"] & (df["condition"] != cond))
    summary = stats.summarize(dropped, **KNOWN)
    assert cond in summary["paired"], "the excluded condition left the summary"
    for p in summary["paired"][cond].values():
        assert p["n_pairs"] == 0 and p["verdict"] == ("inconclusive" if p["role"] == "primary" else None)
    assert len(verdicts(summary)) == len(verdicts(full))  # the family keeps its size
