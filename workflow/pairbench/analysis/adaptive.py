"""Precision-based adaptive rounds: the stopping rule, which reads only interval *widths*.

After ``min`` rounds, and after every further block of k rounds (one per arm, counterbalanced),
the pipeline asks :func:`decide` whether to measure another block. It stops when every primary
comparison of every candidate (candidates × primary metrics × conditions) has an interval whose
half-width, as a ratio, is at most ``target_halfwidth``, or when ``max`` rounds were run.

The width is taken at one fixed level, the widest the multiplicity procedure can assign (α/m for
Holm's m comparisons over every candidate, :func:`pairbench.analysis.verdicts.width_level`), never at the level Holm
finally assigns (that depends on where the intervals lie). The width of a Hodges–Lehmann interval
does not move when the data shift, and under identical arms it is the same for the data and their
mirror image, so stopping cannot favour either claim; tests/pairbench/test_stats_simulation.py
shows on resampled real noise that the identical-arms false-claim rate stays at most alpha.

The decision uses each visit's own measurement only, never its validation retries: a pair with a
retried side is dropped from the paired statistics anyway (not adjacent in time), and so the
retries, which run after every visit, can come after the decision without changing it.
"""

from __future__ import annotations

import math

import pandas as pd

from pairbench.analysis import signrank, verdicts as pb_verdicts
from pairbench.analysis.pairing import paired_differences


def widths(df: pd.DataFrame, *, baseline: str, candidates: list[str], metrics, alpha: float,
           multiplicity: str) -> dict:
    """``{"width_level", "comparisons": [{candidate, condition, metric, n_pairs, half_width}]}`` at the
    fixed level of the family over every candidate."""
    d = {c: paired_differences(df, baseline=baseline, candidate=c, metrics=metrics) for c in candidates}
    level = pb_verdicts.width_level(sum(len(v) for v in d.values()), alpha, multiplicity)
    rows = []
    for cand in candidates:
        for (cond, metric), diffs in d[cand].items():  # conditions in plan order
            w = signrank.walsh(diffs)
            low, high = signrank.interval(w, diffs.size, level)
            half = (math.exp(high) - math.exp(low)) / 2 if math.isfinite(low) else None
            rows.append({"candidate": cand, "condition": cond, "metric": metric, "n_pairs": int(diffs.size),
                         "half_width": half})
    return {"width_level": level, "comparisons": rows}


def decide(df: pd.DataFrame, *, baseline: str, candidates: list[str], metrics, alpha: float, multiplicity: str,
           rounds_done: int, adaptive: dict) -> dict:
    """Whether to measure another block: ``{"decision": "continue"|"stop", "reason", ...}``; it stops
    only when every candidate's primary intervals reached the target (or at ``max``)."""
    target, block, most = adaptive["target_halfwidth"], adaptive["block"], adaptive["max"]
    w = widths(df, baseline=baseline, candidates=list(candidates), metrics=metrics, alpha=alpha,
               multiplicity=multiplicity)
    halves = [c["half_width"] for c in w["comparisons"]]
    reached = bool(halves) and all(h is not None and h <= target for h in halves)
    widest = None if not halves or any(h is None for h in halves) else max(halves)
    widest_text = "unbounded" if widest is None else f"±{widest:.2%}"
    if len(candidates) > 1 and halves:
        # which candidate holds the run back (the first unbounded one, else the widest)
        row = max(w["comparisons"], key=lambda c: math.inf if c["half_width"] is None else c["half_width"])
        widest_text += f" ({row['candidate']}: {row['metric']} at {row['condition']})"
    if reached:
        decision = "stop"
        reason = (f"stopped after {rounds_done} rounds: every primary interval reached the target ±{target:.2%} "
                  f"(widest {widest_text}, at level {1 - w['width_level']:.2%})")
    elif rounds_done + block > most:
        decision = "stop"
        reason = (f"stopped at the maximum of {most} rounds: the widest primary interval is {widest_text} "
                  f"(target ±{target:.2%}, at level {1 - w['width_level']:.2%})")
    else:
        decision = "continue"
        reason = (f"after {rounds_done} rounds the widest primary interval is {widest_text} (target "
                  f"±{target:.2%}): measure rounds {rounds_done + 1}-{rounds_done + block}")
    return {"rounds": rounds_done, "decision": decision, "reason": reason, "target_halfwidth": target,
            **w}
