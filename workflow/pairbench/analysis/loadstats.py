"""A load run's statistics beyond the per-level verdicts: the SLO capacity compared, and the facts
the report discloses per level (achieved load, schedule lag, client CPU, exclusions).

Read from the measurements table alone (one row per level record, :mod:`pairbench.analysis.tables`),
inside :func:`pairbench.analysis.stats.summarize_all`, so ``verify`` recomputes all of it from the
bundle. The per-level verdicts need nothing new: a level is a condition, so they are the ordinary
paired comparisons, one family with every primary metric and level.

**Capacity** (:mod:`pairbench.analysis.capacity`): per candidate, per *curve* (the conditions that
differ only in their load factor: the group is the condition id without it), per arm and round, the
highest load at which the SLO holds, interpolated between the levels of the round's own visit that
passed every gate, case and validity check (a client-bound level says nothing about the engine) and
those where the engine failed measured requests (:func:`capacity_rows`: a timeout or dropped stream
under load is the SLO failing there, counted as a request that is not good, never a level left out,
which would let a curve that breaks down read as holding); then per curve the paired
ratio over the rounds where both arms have one, with its interval and verdict (``more``, ``less``,
``equivalent``, ``inconclusive``), censored rounds at their worst case. The capacity comparisons of
every candidate and curve are one multiplicity family of their own (as memory's are), and each
curve's levels to add when a capacity lies outside the levels measured
(:func:`pairbench.analysis.capacity.bracketing_levels`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pairbench.analysis import capacity as pb_capacity
from pairbench.analysis import verdicts as pb_verdicts
from pairbench.analysis.measurements import StatsInputError, as_bool
from pairbench.core import conditions as pb_conditions
from pairbench.core.metrics import NAMES
from pairbench.core.slo import BOUNDS

ATTAINMENT = NAMES.slo_attainment
FACT_COLUMNS = (NAMES.achieved_concurrency, NAMES.achieved_rate_rps, NAMES.lag_p99_ms, NAMES.client_cpu_share)


def _num(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def curves(conds: list[str]) -> dict[str, list[tuple[float, str]]]:
    """``{group id: [(load, condition id), ...]}`` in increasing load: each curve's levels."""
    out: dict[str, list[tuple[float, str]]] = {}
    for cid in conds:
        c = pb_conditions.parse_id(cid)
        if c.load is not None:
            out.setdefault(c.without_load().id, []).append((float(c.load[1]), cid))
    return {g: sorted(v) for g, v in out.items()}


def capacity_rows(df: pd.DataFrame, arms: list[str]) -> pd.DataFrame:
    """The level rows of *arms* a capacity is read from: each round's levels as its visit measured
    them (never a validation retry's, which ran after every visit, on another launch, not beside the
    round's other levels), those selected and those where the engine failed measured requests
    (``engine_failed``: the SLO did not hold there, its attainment counting each failed request as
    not good; such a level is often retried, and its retry cannot stand in). A level the client paced,
    or with a gate or case failed, stays out: that round's curve is read from its other levels."""
    missing = [c for c in ("selected", "retry", "engine_failed") if c not in df.columns]
    if missing:
        raise StatsInputError(f"measurements table lacks column(s) the SLO capacity reads: {', '.join(missing)}")
    own = pd.to_numeric(df["retry"], errors="coerce").fillna(0) == 0
    failed = as_bool(df["engine_failed"], "engine_failed")
    return df[own & (as_bool(df["selected"], "selected") | failed) & df["arm"].isin(arms)]


def arm_capacities(rows: pd.DataFrame, arm: str, levels: list[tuple[float, str]], target: float) -> dict:
    """``{round: Capacity}`` of one arm on one curve, from its levels per round (:func:`capacity_rows`)."""
    rows = rows[(rows["arm"] == arm) & rows["condition"].isin([c for _, c in levels])]
    load = {c: x for x, c in levels}
    out = {}
    for rnd, g in rows.groupby("round"):
        att = pd.to_numeric(g[ATTAINMENT], errors="coerce")
        if att.isna().any():
            bad = g.loc[att.isna(), "condition"].tolist()
            raise StatsInputError(f"round {rnd}, arm {arm}: no {ATTAINMENT} at level(s) {bad}, which the "
                                  f"capacity reads")
        pts = sorted((load[c], float(a)) for c, a in zip(g["condition"], att))
        out[int(rnd)] = pb_capacity.capacity([x for x, _ in pts], [y for _, y in pts], target)
    return out


def _rounds(base: dict, cand: dict) -> list[dict]:
    out = []
    for r in sorted(set(base) & set(cand)):
        lo, hi = pb_capacity.log_ratio_bounds(base[r], cand[r])
        out.append({"round": r, "baseline": base[r].to_dict(), "candidate": cand[r].to_dict(),
                    "ratio_low": math.exp(lo) if lo > -math.inf else 0.0,
                    "ratio_high": math.exp(hi) if hi < math.inf else None})
    return out


def capacity_block(rows: pd.DataFrame, *, baseline: str, candidates: list[str], conds: list[str], target: float,
                   factor: str, alpha: float, noise: float, multiplicity: str) -> dict:
    """``{"family_size", "comparisons": {candidate: {group: entry}}}``: every candidate's capacity on
    every curve, judged at the level its own family assigned."""
    pairs, prepared = {}, {}
    for cand in candidates:
        for group, levels in curves(conds).items():
            base = arm_capacities(rows, baseline, levels, target)
            mine = arm_capacities(rows, cand, levels, target)
            rounds = sorted(set(base) & set(mine))
            b, c = [base[r] for r in rounds], [mine[r] for r in rounds]
            prepared[(cand, group)] = (levels, base, mine, b, c)
            pairs[(cand, group)] = pb_capacity.claim_p(b, c, noise)[0] if rounds else 1.0
    assigned = pb_verdicts.assign_from_p(pairs, alpha, multiplicity)
    out: dict = {"family_size": len(pairs), "comparisons": {}}
    for (cand, group), (levels, base, mine, b, c) in prepared.items():
        entry = assigned[(cand, group)]
        if b:
            res = pb_capacity.compare(b, c, alpha=entry["alpha"], noise=noise)
        else:
            res = {"n_pairs": 0, "verdict": "inconclusive", "reason": "no round has a capacity for both arms "
                   "(no valid level with an SLO attainment)", "ci_level": 1 - entry["alpha"]}
        loads = [x for x, _ in levels]
        out["comparisons"].setdefault(cand, {})[group] = {
            **res, "claim_p": entry["claim_p"], "family_rank": entry["rank"],
            "levels": [{"condition": cid, "load": x} for x, cid in levels],
            "rounds": _rounds(base, mine),
            "bracketing": pb_capacity.bracketing_levels(loads, [*base.values(), *mine.values()],
                                                        integer=factor == "concurrency"),
            "unpaired": {"baseline": sorted(set(base) - set(mine)), "candidate": sorted(set(mine) - set(base))}}
    return out


def level_facts(df: pd.DataFrame, arms: list[str], conds: list[str]) -> dict:
    """``{condition: {arm: facts}}``: per level and arm, how many level records there were, how many
    were selected, the validity checks the others failed (by count), and the medians and maxima of
    the achieved load, the p99 schedule lag and the client's CPU share over the rounds."""
    out: dict = {}
    for cid in conds:
        for arm in arms:
            g = df[(df["condition"] == cid) & (df["arm"] == arm)]
            if g.empty:
                continue
            reasons: dict[str, int] = {}
            for r in g.loc[~g["selected"], "reason"].astype("string").fillna(""):
                reasons[str(r) or "not selected"] = reasons.get(str(r) or "not selected", 0) + 1
            facts = {"levels": int(len(g)), "selected": int(g["selected"].sum()), "excluded": reasons}
            for col in FACT_COLUMNS:
                v = pd.to_numeric(g[col], errors="coerce") if col in g.columns else pd.Series(dtype=float)
                v = v[np.isfinite(v)]
                facts[col] = {"median": _num(v.median()) if len(v) else None, "max": _num(v.max()) if len(v) else None}
            out.setdefault(cid, {})[arm] = facts
    return out


def load_summary(df: pd.DataFrame, *, baseline: str, candidates: list[str], conds: list[str],
                 load: dict, alpha: float, noise: float, multiplicity: str) -> dict:
    """The summary's ``load`` block: what the run's load was, the per-level facts, and (with an SLO)
    the capacity comparisons. *load* is the plan's load parameters as stats_params records them."""
    factor = load["factor"]
    slo = load["slo"]
    has_slo = any(slo.get(k) is not None for k in BOUNDS)
    out = {"factor": factor, "slo": slo, "prefix": load["prefix"],
           "facts": level_facts(df, [baseline, *candidates], conds), "capacity": None}
    if has_slo and ATTAINMENT in df.columns:
        rows = capacity_rows(df, [baseline, *candidates])
        out["capacity"] = capacity_block(rows, baseline=baseline, candidates=candidates, conds=conds,
                                         target=float(slo["attainment"]), factor=factor, alpha=alpha, noise=noise,
                                         multiplicity=multiplicity)
    return out


CAPACITY_COLUMNS = ["candidate", "condition", "round", "baseline_capacity", "baseline_censored_above",
                    "baseline_censored_below", "candidate_capacity", "candidate_censored_above",
                    "candidate_censored_below", "ratio_low", "ratio_high"]
CAPACITY_PAIRED_COLUMNS = ["candidate", "condition", "n_pairs", "n_censored", "hl_ratio", "hl_ratio_low",
                           "hl_ratio_high", "ci_low", "ci_high", "ci_level", "p_value", "claim_p", "family_rank",
                           "verdict"]


def capacity_tables(summary: dict) -> dict[str, pd.DataFrame]:
    """``tables/capacity.csv`` (per candidate × curve × round: each arm's capacity and censoring, the
    ratio's bounds) and ``tables/capacity_paired.csv`` (per candidate × curve: the paired ratio, its
    interval and verdict); numeric and allowlisted categorical columns only. Empty without a capacity."""
    cap = (summary.get("load") or {}).get("capacity") or {"comparisons": {}}
    rows, paired = [], []
    for cand in summary["candidates"]:
        for group, e in cap["comparisons"].get(cand, {}).items():
            for r in e["rounds"]:
                rows.append({"candidate": cand, "condition": group, "round": r["round"],
                             **{f"{side}_{k}": v for side in ("baseline", "candidate") for k, v in (
                                 ("capacity", r[side]["capacity"]), ("censored_above", r[side]["censored"] == "above"),
                                 ("censored_below", r[side]["censored"] == "below"))},
                             "ratio_low": r["ratio_low"], "ratio_high": r["ratio_high"]})
            paired.append({"candidate": cand, "condition": group,
                           **{k: e.get(k) for k in CAPACITY_PAIRED_COLUMNS[2:]}})
    out = {"capacity": pd.DataFrame(rows, columns=CAPACITY_COLUMNS),
           "capacity_paired": pd.DataFrame(paired, columns=CAPACITY_PAIRED_COLUMNS)}
    out["capacity_paired"]["family_rank"] = out["capacity_paired"]["family_rank"].astype("Int64")
    return out
