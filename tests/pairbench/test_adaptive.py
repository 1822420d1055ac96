"""The adaptive-rounds stopping rule: it reads interval widths only, at one fixed level."""

import math

import pandas as pd
import pytest

from pairbench.analysis import adaptive

ADAPT = {"min": 8, "max": 12, "block": 2, "target_halfwidth": 0.02}


def frame(d_by_input, rounds=None, arm="B"):
    """Baseline A at 100, *arm* at 100 exp(d), at each input length's condition (64 output tokens)."""
    rows = []
    for n, d in d_by_input.items():
        cond = {"condition": f"in{n}-out64", "input_tokens": n, "output_tokens": 64}
        for r, di in enumerate(d[:rounds] if rounds else d, start=1):
            rows += [{"round": r, "arm": "A", **cond, "selected": True, "decode_tok_s": 100.0},
                     {"round": r, "arm": arm, **cond, "selected": True, "decode_tok_s": 100.0 * math.exp(di)}]
    return pd.DataFrame(rows)


def ramp(center, step, n=8):
    return [center + step * (i - (n + 1) / 2) for i in range(1, n + 1)]


def decide(df, rounds_done=8, candidates=("B",), **kw):
    return adaptive.decide(df, baseline="A", candidates=list(candidates), metrics=["decode_tok_s"], alpha=0.05,
                           multiplicity="holm", rounds_done=rounds_done, adaptive={**ADAPT, **kw})


def two_candidates(d_b, d_c):
    """Baseline A, candidates B and C; one condition each (in256-out64), C's rows added to B's frame."""
    both = pd.concat([frame({256: d_b}), frame({256: d_c}, arm="C")], ignore_index=True)
    return both.drop_duplicates(["round", "arm", "condition"])


def test_waits_for_every_candidate():
    d = decide(two_candidates(ramp(0.0, 0.001), ramp(0.0, 0.05)), candidates=("B", "C"), block=3)
    assert d["decision"] == "continue" and "measure rounds 9-11" in d["reason"]
    assert "the widest primary interval is ±" in d["reason"] and "(C: decode_tok_s at in256-out64)" in d["reason"]
    assert d["width_level"] == pytest.approx(0.025)  # alpha / (2 candidates x 1 metric x 1 condition)
    assert [(c["candidate"], c["half_width"] <= 0.02) for c in d["comparisons"]] == [("B", True), ("C", False)]
    assert decide(two_candidates(ramp(0.0, 0.001), ramp(0.0, 0.002)), candidates=("B", "C"))["decision"] == "stop"


def test_stops_when_every_primary_interval_reached_the_target():
    d = decide(frame({256: ramp(0.0, 0.001), 1024: ramp(0.0, 0.002)}))
    assert d["decision"] == "stop" and d["reason"].startswith("stopped after 8 rounds: every primary interval")
    assert d["width_level"] == pytest.approx(0.025)  # alpha / the 2 primary comparisons
    assert [c["n_pairs"] for c in d["comparisons"]] == [8, 8]


def test_continues_while_one_interval_is_too_wide():
    d = decide(frame({256: ramp(0.0, 0.001), 1024: ramp(0.0, 0.05)}))
    assert d["decision"] == "continue" and "measure rounds 9-10" in d["reason"]


def test_unbounded_intervals_continue():
    # 6 pairs at 0.05 / 2: the best two-sided p, 2^-5 = 0.031, is not below 0.025: no bounded interval
    d = decide(frame({256: ramp(0.0, 0.001, n=6), 1024: ramp(0.0, 0.001, n=6)}), rounds_done=6, min=6)
    assert d["decision"] == "continue" and d["comparisons"][0]["half_width"] is None
    assert "the widest primary interval is unbounded" in d["reason"]


def test_stops_at_the_maximum():
    d = decide(frame({256: ramp(0.0, 0.05, n=12)}), rounds_done=12)
    assert d["decision"] == "stop" and d["reason"].startswith("stopped at the maximum of 12 rounds")


@pytest.mark.parametrize("shift", [math.log(0.9), math.log(0.99), 0.0, math.log(1.2)])
def test_the_decision_does_not_depend_on_where_the_interval_lies(shift):
    # the same spread at any location: the same widths (as log widths) and the same decision
    base = decide(frame({256: ramp(0.0, 0.004), 1024: ramp(0.0, 0.004)}))
    moved = decide(frame({256: ramp(shift, 0.004), 1024: ramp(shift, 0.004)}))
    assert moved["decision"] == base["decision"]
    for a, b in zip(base["comparisons"], moved["comparisons"]):
        assert b["half_width"] == pytest.approx(a["half_width"] * math.exp(shift), rel=1e-9)
