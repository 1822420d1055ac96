"""Tests of pairbench.analysis.plots: the PNGs are written whole, show the panels and verdict colours the
summary calls for, and bad input gets an error naming what is missing."""

from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from pairbench.analysis import plots
from pairbench.analysis import stats
from pairbench.analysis.measurements import StatsInputError

DATA = Path(__file__).resolve().parent.parent / "data" / "stats"
DRIFT_METRICS = ("decode_tok_s", "ttft_ms")


def summary_for(df: pd.DataFrame, candidates=("B",), **kw) -> dict:
    return stats.summarize_all(df, baseline="A", candidates=list(candidates), **kw)


def has_colour(png: Path, name: str, tol: float = 0.06) -> bool:
    img = matplotlib.image.imread(png)[..., :3]
    want = np.array(matplotlib.colors.to_rgb(name))
    return bool((np.abs(img - want).max(axis=-1) < tol).any())


def faster_run() -> pd.DataFrame:
    df = pd.read_csv(DATA / "aa_contended.csv")
    base = df[df["arm"] == "A"]
    rng = np.random.default_rng(1)
    return pd.concat([base, base.assign(arm="B", decode_tok_s=base["decode_tok_s"] * 1.1
                                        * np.exp(rng.normal(0, 0.02, len(base))))])


def test_plot_ratios_shows_every_candidate_in_its_own_colour(tmp_path):
    df = faster_run()
    three = pd.concat([df, df[df["arm"] == "B"].assign(arm="C")], ignore_index=True)
    out = tmp_path / "plots" / "ratios.png"
    plots.plot_ratios(summary_for(three, candidates=("B", "C"), metrics=["decode_tok_s"], secondary=["ttft_ms"]), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert has_colour(out, plots.CANDIDATE_COLOURS[0]) and has_colour(out, plots.CANDIDATE_COLOURS[1])
    assert [p.name for p in out.parent.iterdir()] == ["ratios.png"]  # no temporary left behind

    one = tmp_path / "one.png"
    plots.plot_ratios(summary_for(df, metrics=["decode_tok_s"]), one)
    assert has_colour(one, plots.CANDIDATE_COLOURS[0]) and not has_colour(one, plots.CANDIDATE_COLOURS[1])


def test_plot_ratios_grid_grows_with_conditions_and_metrics(tmp_path):
    df = pd.read_csv(DATA / "aa_contended.csv")
    small, big = tmp_path / "small.png", tmp_path / "big.png"
    one_condition = df[df["input_tokens"] == df["input_tokens"].min()]
    plots.plot_ratios(summary_for(one_condition, metrics=["decode_tok_s"], secondary=[]), small)
    plots.plot_ratios(summary_for(df, metrics=["decode_tok_s"], secondary=["ttft_ms"]), big)
    h_small, w_small = matplotlib.image.imread(small).shape[:2]
    h_big, w_big = matplotlib.image.imread(big).shape[:2]
    assert w_big > 1.5 * w_small and h_big > 1.5 * h_small  # 2 conditions x 2 metrics against 1 x 1


def test_plot_ratios_rejects_an_empty_summary(tmp_path):
    with pytest.raises(StatsInputError, match="no candidates or metrics to plot"):
        plots.plot_ratios({"baseline": "A", "candidates": [], "comparisons": {}, "params": {"noise": 0.01}},
                          tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_ratios_without_any_pair_draws_a_figure_that_says_so(tmp_path):
    # no selected record at all: every condition is listed (excluded, not vanished) with no pair,
    # yet the run's report still gets its figure
    df = pd.read_csv(DATA / "aa_contended.csv").assign(selected=False)
    summary = summary_for(df, metrics=["decode_tok_s"])
    paired = summary["comparisons"]["B"]["paired"]
    assert summary["conditions"] and all(p["n_pairs"] == 0 for by in paired.values() for p in by.values())
    out = tmp_path / "ratios.png"
    plots.plot_ratios(summary, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not has_colour(out, plots.CANDIDATE_COLOURS[0])  # nothing drawn but the explanation


def test_plot_drift_draws_each_arm_and_marks_excluded_rows(tmp_path):
    out = tmp_path / "drift.png"
    plots.plot_drift(pd.read_csv(DATA / "known.csv"), out, DRIFT_METRICS)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert has_colour(out, "C0") and has_colour(out, "C1")  # one colour per arm
    one, both = tmp_path / "one.png", tmp_path / "both.png"
    df = pd.read_csv(DATA / "aa_contended.csv")
    plots.plot_drift(df[df["input_tokens"] == df["input_tokens"].min()], one, DRIFT_METRICS)
    plots.plot_drift(df, both, DRIFT_METRICS)
    assert matplotlib.image.imread(both).shape[1] > matplotlib.image.imread(one).shape[1]


def test_plot_drift_names_a_missing_column(tmp_path):
    df = pd.read_csv(DATA / "known.csv").drop(columns=["ttft_ms"])
    with pytest.raises(StatsInputError, match="ttft_ms"):
        plots.plot_drift(df, tmp_path / "d.png", DRIFT_METRICS)
