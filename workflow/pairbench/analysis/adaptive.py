"""Adaptive rounds within a time budget: a stopping rule that reads interval *widths* and the *clock*.

After ``min`` rounds, and after every further block of rounds (one counterbalanced block), the
pipeline asks :func:`decide` whether to measure another block. It stops (``stopped_by``):

- ``target``: every primary comparison of every candidate (candidates × primary metrics × conditions)
  has an interval whose half-width on the log scale, h = (high − low) / 2 of the interval of
  log(candidate / baseline), is at most log(1 + ``target_halfwidth``);
- ``max``: another block would pass ``max`` rounds (the last decision is taken at ``max`` itself,
  so the run's final widths, time and next-run figure are always recorded);
- ``budget``: another block, predicted from what the rounds so far took, would take the rounds past
  ``max_minutes`` (:func:`time_used`).

Neither reads where an interval lies. The width is taken at one fixed level, the widest the
multiplicity procedure can assign (α/m for Holm's m comparisons over every candidate,
:func:`pairbench.analysis.verdicts.width_level`), never at the level Holm finally assigns (that
depends on where the intervals lie). On the log scale the width is location-free: shifting every
difference by δ shifts every Walsh average, and so both ends of the interval, by δ, and high − low
does not move (a ratio-scale width, (e^high − e^low)/2 = e^centre·sinh h, would grow with the
ratio: near the target a +20% candidate would need about 1.44× the rounds of an identical one).
Under identical arms the width is the same for the data and their mirror image, and the clock
does not depend on which arm is which, so stopping cannot favour either claim;
tests/pairbench/test_stats_simulation.py runs this function on resampled real noise and shows the
identical-arms false-claim rate stays at most alpha, with the budget stopping runs early.

The decision uses each visit's own measurement only, never its validation retries: a pair with a
retried side is dropped from the paired statistics anyway (not adjacent in time), and so the
retries, which run after every visit, can come after the decision without changing it.

Each decision also states what a next run would need for the target from the variance observed
(:func:`rounds_for_target`), in rounds and, at this run's pace, minutes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import norm

from pairbench.analysis import signrank, verdicts as pb_verdicts
from pairbench.analysis.pairing import paired_differences

HL_EFFICIENCY = 3 / math.pi  # the Hodges–Lehmann interval's efficiency against a t interval, normal noise


def differences(df: pd.DataFrame, *, baseline: str, candidates: list[str], metrics) -> dict:
    """``{(candidate, condition, metric): log(candidate / baseline) per valid pair}`` of the selected
    rows, paired as the statistics pair them (:func:`pairbench.analysis.pairing.paired_differences`)."""
    return {(cand, cond, metric): d for cand in candidates
            for (cond, metric), d in paired_differences(df, baseline=baseline, candidate=cand,
                                                        metrics=metrics).items()}


def log_half_width(d: np.ndarray, level: float) -> float | None:
    """Half of high − low of the interval of *d* at *level* (log scale); None when it is unbounded."""
    low, high = signrank.interval(signrank.walsh(d), d.size, level)
    return (high - low) / 2 if math.isfinite(low) else None


def fewest_bounded(level: float) -> int:
    """The fewest pairs with which an interval at *level* is bounded at all: 2·2⁻ⁿ < level."""
    return math.floor(1 - math.log2(level)) + 1


def rounds_for_target(n_pairs: int, target: float, level: float, *, log_half_width: float | None = None,
                      sd: float | None = None) -> int | None:
    """About how many pairs bring a comparison's log half-width at *level* to log(1 + *target*).

    The half-width of a rank interval shrinks as 1/√n, so from a bounded interval of n pairs with
    log half-width h: n·(h / log(1 + target))². From an unbounded one (too few pairs), from the SD
    of the differences: (z·sd / log(1 + target))² / (3/π), z the normal quantile of *level* and 3/π
    the Hodges–Lehmann interval's efficiency under normal noise. Never fewer than the pairs with
    which an interval at *level* is bounded at all; None when neither width nor SD is known.
    """
    goal = math.log1p(target)
    if log_half_width is not None:
        need = n_pairs * (log_half_width / goal) ** 2
    elif sd is not None and math.isfinite(sd) and sd > 0:
        need = (float(norm.ppf(1 - level / 2)) * sd / goal) ** 2 / HL_EFFICIENCY
    else:
        return None
    return max(fewest_bounded(level), math.ceil(need - 1e-9))


def widths(diffs: dict, *, alpha: float, multiplicity: str, target: float) -> dict:
    """``{"width_level", "comparisons": [{candidate, condition, metric, n_pairs, log_half_width, half_width,
    rounds_for_target}]}`` at the fixed level of the family over every comparison in *diffs*.
    ``half_width`` is exp(log_half_width) − 1: the interval spans its centre ×/÷ (1 + half_width)."""
    level = pb_verdicts.width_level(len(diffs), alpha, multiplicity)
    rows = []
    for (cand, cond, metric), d in diffs.items():
        h = log_half_width(d, level)
        sd = float(np.std(d, ddof=1)) if h is None and d.size >= 2 else None  # only read when unbounded
        rows.append({"candidate": cand, "condition": cond, "metric": metric, "n_pairs": int(d.size),
                     "log_half_width": h, "half_width": None if h is None else math.expm1(h),
                     "rounds_for_target": rounds_for_target(int(d.size), target, level, log_half_width=h, sd=sd)})
    return {"width_level": level, "comparisons": rows}


def time_used(visits: list[dict], now_unix: float | None = None, pause_limit_s: float | None = None) -> dict:
    """The wall time the rounds took so far, per round, from each visit's clock.

    *visits*: ``[{"id", "round", "started_unix", "ended_unix"}]``, each visit's own measurement
    (its span runs from the start of its quiet wait to its record's end). A visit costs its span
    plus the gap since the previous visit ended: the validations and decision run in between, the
    workflow's own work and the job's start-up are the rounds' cost too. So the costs add up to the
    wall time from the first visit's start to the last one's end, and *now_unix* (the decision's own
    clock) adds the gap after the last visit (its segment's validations) to the last round.

    A gap longer than *pause_limit_s* (the budget itself: a run within its budget never spends that
    long between two visits) is a run stopped and resumed: it counts as the median of the other gaps
    and is listed under ``pauses``. Returns ``{"used_s", "round_s": [cost per round, in round
    order], "pauses": [{"before", "gap_s", "counted_s"}]}``.
    """
    order = sorted(visits, key=lambda v: v["started_unix"])
    gaps = [(v["id"], max(0.0, v["started_unix"] - prev["ended_unix"])) for prev, v in zip(order, order[1:])]
    if now_unix is not None and order:
        gaps.append(("decision", max(0.0, now_unix - order[-1]["ended_unix"])))
    long_gap = (lambda g: pause_limit_s is not None and g > pause_limit_s)
    usual = [g for _, g in gaps if not long_gap(g)]
    typical = float(np.median(usual)) if usual else 0.0
    counted = {who: (typical if long_gap(g) else g) for who, g in gaps}
    pauses = [{"before": who, "gap_s": g, "counted_s": typical} for who, g in gaps if long_gap(g)]
    per_round: dict[int, float] = {}
    for v in order:
        cost = v["ended_unix"] - v["started_unix"] + counted.get(v["id"], 0.0)
        per_round[v["round"]] = per_round.get(v["round"], 0.0) + cost
    if order and "decision" in counted:
        per_round[order[-1]["round"]] += counted["decision"]
    round_s = [per_round[r] for r in sorted(per_round)]
    return {"used_s": float(sum(round_s)), "round_s": round_s, "pauses": pauses}


def visit_clock(measures: list[dict], now_unix: float | None) -> dict:
    """The :func:`decide` *clock* from measure bodies (each visit's own measurement) and the time now."""
    return {"visits": [{"id": m["visit"]["id"], "round": m["visit"]["round"], "started_unix": m["started_unix"],
                        "ended_unix": m["ended_unix"]} for m in measures],
            "now_unix": now_unix}


def _budget(clock: dict | None, max_minutes: float | None, block: int) -> dict:
    """The ``budget`` block of a decision: the time used, per round, and the next block's prediction."""
    budget_s = None if max_minutes is None else 60.0 * max_minutes
    t = time_used(clock["visits"], clock.get("now_unix"), budget_s) if clock and clock.get("visits") else None
    out = {"max_minutes": max_minutes, "used_s": None, "round_s": None, "predicted_next_block_s": None,
           "pauses": [], "decided_unix": (clock or {}).get("now_unix")}
    if t:
        out.update(used_s=t["used_s"], round_s=t["round_s"], pauses=t["pauses"],
                   predicted_next_block_s=block * t["used_s"] / len(t["round_s"]))
    return out


def decide(diffs: dict, *, alpha: float, multiplicity: str, rounds_done: int, adaptive: dict,
           clock: dict | None = None) -> dict:
    """Whether to measure another block: ``{"decision": "continue"|"stop", "stopped_by", "reason",
    "width_level", "comparisons", "budget", "next_run", ...}``.

    *diffs* is :func:`differences` (every candidate's primary comparisons); *adaptive* the plan's
    block (min, max, block, target_halfwidth, max_minutes); *clock* :func:`visit_clock` (None: the
    time is not known, and no budget applies). It stops when every primary interval reached the
    target, at ``max``, or when the next block would not fit into ``max_minutes``.
    """
    target, block, most = adaptive["target_halfwidth"], adaptive["block"], adaptive["max"]
    w = widths(diffs, alpha=alpha, multiplicity=multiplicity, target=target)
    hs = [c["log_half_width"] for c in w["comparisons"]]
    reached = bool(hs) and all(h is not None and h <= math.log1p(target) for h in hs)
    widest = None if not hs or any(h is None for h in hs) else math.expm1(max(hs))
    widest_text = "unbounded" if widest is None else f"±{widest:.2%}"
    if len(diffs) > 1 and hs:
        # which comparison holds the run back (the first unbounded one, else the widest)
        row = max(w["comparisons"], key=lambda c: math.inf if c["log_half_width"] is None else c["log_half_width"])
        who = f"{row['candidate']}: " if len({c["candidate"] for c in w["comparisons"]}) > 1 else ""
        widest_text += f" ({who}{row['metric']} at {row['condition']})"
    at = f"target ±{target:.2%}, at level {1 - w['width_level']:.2%}"
    budget = _budget(clock, adaptive.get("max_minutes"), block)
    used, nxt, cap = budget["used_s"], budget["predicted_next_block_s"], budget["max_minutes"]
    if reached:
        stopped_by = "target"
        reason = (f"stopped after {rounds_done} rounds: every primary interval reached the target ±{target:.2%} "
                  f"(widest {widest_text}, at level {1 - w['width_level']:.2%})")
    elif rounds_done + block > most:
        stopped_by = "max"
        reason = f"stopped at the maximum of {most} rounds: the widest primary interval is {widest_text} ({at})"
    elif cap is not None and used is not None and used + nxt > 60.0 * cap:
        stopped_by = "budget"
        reason = (f"stopped after {rounds_done} rounds on the time budget: the rounds took {used / 60:.1f} of "
                  f"{cap:g} minutes and another block would take about {nxt / 60:.1f} more; the widest primary "
                  f"interval is {widest_text} ({at})")
    else:
        stopped_by = None
        spent = "" if used is None else (f"; {used / 60:.1f} min used" + (f" of {cap:g}" if cap is not None else ""))
        reason = (f"after {rounds_done} rounds the widest primary interval is {widest_text} (target ±{target:.2%}"
                  f"{spent}): measure rounds {rounds_done + 1}-{rounds_done + block}")
    return {"rounds": rounds_done, "decision": "continue" if stopped_by is None else "stop",
            "stopped_by": stopped_by, "reason": reason, "target_halfwidth": target, **w, "budget": budget,
            "next_run": next_run(w["comparisons"], block, budget["round_s"])}


def next_run(comparisons: list[dict], block: int, round_s: list[float] | None) -> dict:
    """What a next run would need for the target: the most rounds any comparison needs
    (:func:`rounds_for_target`), whole blocks, and at this run's mean cost per round, minutes."""
    need = [c["rounds_for_target"] for c in comparisons]
    if not need or any(n is None for n in need):
        return {"rounds_for_target": None, "minutes_for_target": None}
    rounds = block * math.ceil(max(need) / block)
    minutes = rounds * sum(round_s) / len(round_s) / 60 if round_s else None
    return {"rounds_for_target": rounds, "minutes_for_target": minutes}


def report_facts(decision: dict) -> dict:
    """The run's time and precision for ``summary.run.rounds.budget`` (the report states them), from
    the last decision: the budget, the time the rounds took, what it bought (every primary
    comparison's half-width at the fixed level) and what a next run would need for the target."""
    b = decision.get("budget") or {}
    return {"stopped_by": decision.get("stopped_by"), "max_minutes": b.get("max_minutes"),
            "used_minutes": None if b.get("used_s") is None else b["used_s"] / 60,
            "width_level": decision["width_level"],
            "half_widths": [{k: c[k] for k in ("candidate", "condition", "metric", "half_width")}
                            for c in decision["comparisons"]],
            "rounds_for_target": decision["next_run"]["rounds_for_target"],
            "minutes_for_target": decision["next_run"]["minutes_for_target"]}
