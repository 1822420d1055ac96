"""The adaptive-rounds stopping rule: log-scale interval widths at one fixed level, and the clock."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from pairbench.analysis import adaptive
from pairbench.core.artifacts import schema_id, validate

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


def decide(df, rounds_done=8, candidates=("B",), clock=None, **kw):
    diffs = adaptive.differences(df, baseline="A", candidates=list(candidates), metrics=["decode_tok_s"])
    body = adaptive.decide(diffs, alpha=0.05, multiplicity="holm", rounds_done=rounds_done,
                           adaptive={**ADAPT, **kw}, clock=clock)
    validate("adapt", {**body, "schema": schema_id("adapt"), "inputs": {}})
    return body


def back_to_back(rounds, visit_s, arms=("A", "B")):
    """A clock of *rounds* rounds whose visits each took *visit_s* seconds, one straight after another."""
    visits = [{"id": f"r{r:02d}-{a}", "round": r} for r in range(1, rounds + 1) for a in arms]
    for i, v in enumerate(visits):
        v.update(started_unix=1000.0 + i * visit_s, ended_unix=1000.0 + (i + 1) * visit_s)
    return {"visits": visits, "now_unix": visits[-1]["ended_unix"]}


def two_candidates(d_b, d_c):
    """Baseline A, candidates B and C; one condition each (in256-out64), C's rows added to B's frame."""
    both = pd.concat([frame({256: d_b}), frame({256: d_c}, arm="C")], ignore_index=True)
    return both.drop_duplicates(["round", "arm", "condition"])


def test_waits_for_every_candidate():
    d = decide(two_candidates(ramp(0.0, 0.001), ramp(0.0, 0.05)), candidates=("B", "C"), block=3)
    assert d["decision"] == "continue" and d["stopped_by"] is None and "measure rounds 9-11" in d["reason"]
    assert "the widest primary interval is ±" in d["reason"] and "(C: decode_tok_s at in256-out64)" in d["reason"]
    assert d["width_level"] == pytest.approx(0.025)  # alpha / (2 candidates x 1 metric x 1 condition)
    assert [(c["candidate"], c["half_width"] <= 0.02) for c in d["comparisons"]] == [("B", True), ("C", False)]
    assert decide(two_candidates(ramp(0.0, 0.001), ramp(0.0, 0.002)), candidates=("B", "C"))["decision"] == "stop"


def test_stops_when_every_primary_interval_reached_the_target():
    d = decide(frame({256: ramp(0.0, 0.001), 1024: ramp(0.0, 0.002)}))
    assert d["decision"] == "stop" and d["stopped_by"] == "target"
    assert d["reason"].startswith("stopped after 8 rounds: every primary interval")
    assert d["width_level"] == pytest.approx(0.025)  # alpha / the 2 primary comparisons
    assert [c["n_pairs"] for c in d["comparisons"]] == [8, 8]


def test_continues_while_one_interval_is_too_wide():
    d = decide(frame({256: ramp(0.0, 0.001), 1024: ramp(0.0, 0.05)}))
    assert d["decision"] == "continue" and "measure rounds 9-10" in d["reason"]
    assert "(decode_tok_s at in1024-out64)" in d["reason"]  # which comparison holds the run back


def test_unbounded_intervals_continue():
    # 6 pairs at 0.05 / 2: the best two-sided p, 2^-5 = 0.031, is not below 0.025: no bounded interval
    d = decide(frame({256: ramp(0.0, 0.001, n=6), 1024: ramp(0.0, 0.001, n=6)}), rounds_done=6, min=6)
    assert d["decision"] == "continue" and d["comparisons"][0]["half_width"] is None
    assert d["comparisons"][0]["log_half_width"] is None
    assert "the widest primary interval is unbounded" in d["reason"]


def test_stops_at_the_maximum():
    d = decide(frame({256: ramp(0.0, 0.05, n=12)}), rounds_done=12)
    assert d["decision"] == "stop" and d["stopped_by"] == "max"
    assert d["reason"].startswith("stopped at the maximum of 12 rounds")


# 8 evenly spaced differences (step s) at level 0.025: the exact signed-rank count is c = 2
# (2·P(T <= 2) = 6/256 < 0.025 <= 2·P(T <= 3) = 10/256), so the interval is [W(3), W(34)] of the
# 36 Walsh averages: centre ± 2.5 s. The target ±2% is a log half-width of log(1.02) = 0.019803.
# s = 0.0076 gives 0.019 (reached), s = 0.0082 gives 0.0205 (not). A ratio-scale width,
# e^centre·sinh(2.5 s), would flip both: 0.0228 > 0.02 at +20%, 0.0185 < 0.02 at -10%.
@pytest.mark.parametrize("step, expected", [(0.0076, "stop"), (0.0082, "continue")])
@pytest.mark.parametrize("shift", [math.log(0.9), 0.0, math.log(1.2), math.log(1.5)])
def test_the_decision_does_not_depend_on_where_the_interval_lies(step, expected, shift):
    d = decide(frame({256: ramp(shift, step), 1024: ramp(shift, step)}))
    assert d["decision"] == expected
    for c in d["comparisons"]:
        assert c["log_half_width"] == pytest.approx(2.5 * step, rel=1e-9)
        assert c["half_width"] == pytest.approx(math.expm1(2.5 * step), rel=1e-9)


def test_a_mirrored_run_decides_alike():
    # identical arms' differences and their mirror image (the arms swapped): the same widths and decision
    d = [0.03, -0.01, 0.02, 0.05, -0.04, 0.0, 0.012, -0.02]
    a, b = decide(frame({256: d})), decide(frame({256: [-x for x in d]}))
    assert a["decision"] == b["decision"] == "continue"
    assert a["comparisons"][0]["log_half_width"] == pytest.approx(b["comparisons"][0]["log_half_width"], rel=1e-12)


def test_rounds_for_the_target():
    target = 0.02
    g = math.log1p(target)
    # twice the target's width with 10 pairs: 1/sqrt(n) scaling needs 4 times the pairs
    assert adaptive.rounds_for_target(10, target, 0.0125, log_half_width=2 * g) == 40
    # already narrower than the target: never fewer than the 8 pairs that bound any interval at 0.0125
    assert adaptive.rounds_for_target(10, target, 0.0125, log_half_width=g / 2) == 8
    assert adaptive.fewest_bounded(0.0125) == 8 and adaptive.fewest_bounded(0.05) == 6
    assert adaptive.fewest_bounded(0.025) == 7 and adaptive.fewest_bounded(2 ** -5) == 7  # 2·2^-n < level
    # unbounded (too few pairs): from the SD, (z·sd / log 1.02)² / (3/π) with z = 1.959964 at 0.05:
    # (1.959964 · 0.05 / 0.0198026)² = 24.4903, / 0.954930 = 25.646 -> 26
    assert adaptive.rounds_for_target(5, target, 0.05, sd=0.05) == 26
    assert adaptive.rounds_for_target(1, target, 0.05) is None


def test_time_used_adds_each_visit_and_the_gap_before_it():
    v = [{"id": "r01-A", "round": 1, "started_unix": 0.0, "ended_unix": 10.0},
         {"id": "r01-B", "round": 1, "started_unix": 12.0, "ended_unix": 22.0},
         {"id": "r02-B", "round": 2, "started_unix": 23.0, "ended_unix": 33.0},
         {"id": "r02-A", "round": 2, "started_unix": 40.0, "ended_unix": 50.0}]
    t = adaptive.time_used(v, now_unix=60.0)
    # r1: 10 + (10 + 2); r2: (10 + 1) + (10 + 7) + the 10 s from the last visit to the decision
    assert t == {"used_s": 60.0, "round_s": [22.0, 38.0], "pauses": []}
    assert adaptive.time_used(list(reversed(v)), now_unix=60.0) == t  # in start order, whatever the input order


def test_a_pause_longer_than_the_budget_counts_as_the_usual_gap():
    v = [{"id": "r01-A", "round": 1, "started_unix": 0.0, "ended_unix": 10.0},
         {"id": "r01-B", "round": 1, "started_unix": 12.0, "ended_unix": 22.0},
         {"id": "r02-B", "round": 2, "started_unix": 1023.0, "ended_unix": 1033.0},  # stopped, resumed
         {"id": "r02-A", "round": 2, "started_unix": 1040.0, "ended_unix": 1050.0}]
    t = adaptive.time_used(v, now_unix=1060.0, pause_limit_s=600.0)
    # the other gaps are 2, 7 and 10 s: the 1001 s pause counts as their median, 7
    assert t["pauses"] == [{"before": "r02-B", "gap_s": 1001.0, "counted_s": 7.0}]
    assert t["round_s"] == [22.0, 17.0 + 17.0 + 10.0] and t["used_s"] == 66.0
    assert adaptive.time_used(v, now_unix=1060.0)["used_s"] == 1060.0  # no budget: every second counts


def test_stops_when_the_next_block_would_not_fit_the_budget():
    wide = frame({256: ramp(0.0, 0.05), 1024: ramp(0.0, 0.05)})
    clock = back_to_back(8, 3.5)  # 16 visits of 3.5 s: 56 s used, 7 s a round, the next block 14 s
    d = decide(wide, clock=clock, max_minutes=1.0)  # 56 + 14 > 60
    assert d["decision"] == "stop" and d["stopped_by"] == "budget"
    assert d["reason"].startswith("stopped after 8 rounds on the time budget: the rounds took 0.9 of 1 minutes "
                                  "and another block would take about 0.2 more")
    b = d["budget"]
    assert (b["max_minutes"], b["used_s"], b["predicted_next_block_s"]) == (1.0, 56.0, 14.0)
    assert b["round_s"] == [7.0] * 8 and b["pauses"] == [] and b["decided_unix"] == 1056.0
    d = decide(wide, clock=clock, max_minutes=1.2)  # 56 + 14 <= 72
    assert d["decision"] == "continue" and "0.9 min used of 1.2): measure rounds 9-10" in d["reason"]
    assert decide(wide, max_minutes=1.0)["decision"] == "continue"  # no clock: no budget to apply


def test_the_budget_reads_the_clock_only():
    # the same clock and widths wherever the differences lie: the same stop
    clock = back_to_back(8, 3.5)
    for shift in (math.log(0.8), 0.0, math.log(1.25)):
        d = decide(frame({256: ramp(shift, 0.05), 1024: ramp(shift, 0.05)}), clock=clock, max_minutes=1.0)
        assert (d["stopped_by"], d["budget"]["used_s"]) == ("budget", 56.0)


def test_the_target_and_the_maximum_come_before_the_budget():
    clock = back_to_back(8, 3.5)
    narrow = decide(frame({256: ramp(0.0, 0.001), 1024: ramp(0.0, 0.001)}), clock=clock, max_minutes=1.0)
    assert narrow["stopped_by"] == "target"
    at_max = decide(frame({256: ramp(0.0, 0.05), 1024: ramp(0.0, 0.05)}), clock=clock, max_minutes=1.0, max=8)
    assert at_max["stopped_by"] == "max"


def test_the_next_run_needs_whole_blocks_at_this_runs_pace():
    # decode at 256 and 1024, 8 pairs each, log half-widths 2.5 s = 0.05 and 0.025 (steps 0.02, 0.01):
    # 8 · (0.05 / log 1.02)² = 51.002 -> 52 and 8 · (0.025 / log 1.02)² = 12.75 -> 13 rounds; at 7 s a
    # round, 52 rounds take 6.07 minutes
    d = decide(frame({256: ramp(0.0, 0.02), 1024: ramp(0.0, 0.01)}), clock=back_to_back(8, 3.5))
    assert [c["rounds_for_target"] for c in d["comparisons"]] == [52, 13]
    assert d["next_run"] == {"rounds_for_target": 52, "minutes_for_target": pytest.approx(52 * 7 / 60)}
    facts = adaptive.report_facts(d)
    assert facts["rounds_for_target"] == 52 and facts["stopped_by"] is None and facts["max_minutes"] is None
    assert facts["used_minutes"] == pytest.approx(56 / 60) and facts["width_level"] == pytest.approx(0.025)
    assert [(h["condition"], round(h["half_width"], 6)) for h in facts["half_widths"]] == [
        ("in256-out64", round(math.expm1(0.05), 6)), ("in1024-out64", round(math.expm1(0.025), 6))]


def test_differences_key_every_candidate():
    d = adaptive.differences(two_candidates(ramp(0.0, 0.001), ramp(0.1, 0.002)), baseline="A",
                             candidates=["B", "C"], metrics=["decode_tok_s"])
    assert list(d) == [("B", "in256-out64", "decode_tok_s"), ("C", "in256-out64", "decode_tok_s")]
    assert np.allclose(d[("C", "in256-out64", "decode_tok_s")], ramp(0.1, 0.002))
