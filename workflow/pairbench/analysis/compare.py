"""One candidate against the baseline: the pair body of ``stats/summary.json``, in three parts.

- speed: every primary metric tested at the level the family assigned it, every secondary metric
  shown with its unadjusted interval, per condition;
- memory: an exact ratio where a memory metric is constant in every selected record of both arms,
  otherwise tested like speed in its own family;
- disclosures: slow samples, median against trimmed-mean disagreements, excluded rows, retries,
  unpaired cells and dropped pairs.

The inputs arrive prepared and checked (:class:`PairInput`, :class:`Options`, :class:`Family`,
built by :mod:`pairbench.analysis.stats`); every verdict is read by
:func:`pairbench.analysis.verdicts.judge`, an exact memory ratio by
:func:`pairbench.analysis.verdicts.read_ratio`: one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pairbench.analysis import verdicts as pb_verdicts
from pairbench.analysis.describe import SLOW_Z, num
from pairbench.analysis.pairing import VISIT_SUMMARY, Pairs
from pairbench.core import conditions as pb_conditions
from pairbench.core.metrics import METRICS

Key = tuple[str, str]  # (condition id, metric)


@dataclass(frozen=True)
class Options:
    """The checked statistics options (config ``stats``)."""

    metrics: tuple[str, ...]  # primary: tested
    secondary: tuple[str, ...]  # shown, not tested
    memory: tuple[str, ...]
    explicit_memory: bool  # the memory list was given, not defaulted
    trim: int | None
    alpha: float
    noise: float
    seed: int
    multiplicity: str

    @property
    def shown(self) -> tuple[str, ...]:
        return (*self.metrics, *self.secondary)


@dataclass(frozen=True)
class MemoryCell:
    """One condition × memory metric of both arms."""

    exact: bool  # constant in every selected record of both arms
    baseline: dict  # the arms' descriptions
    candidate: dict
    values: tuple[np.ndarray, np.ndarray]  # the positive finite values of each arm


@dataclass(frozen=True)
class PairInput:
    """One candidate's comparison with the baseline, prepared: the checked table, per-arm figures,
    the paired data and its tested comparisons (not yet judged)."""

    baseline: str
    candidate: str
    df: pd.DataFrame  # the whole checked table
    sel: pd.DataFrame  # the selected rows of the two arms
    conditions: tuple[str, ...]  # in plan order
    arms: dict  # {arm: {condition: {metric: description}}}
    slow: tuple[dict, ...]
    pairs: dict[Key, Pairs]
    memory_cells: dict[Key, MemoryCell]
    family: tuple[pb_verdicts.Comparison, ...]  # primary metrics × conditions
    memory_family: tuple[pb_verdicts.Comparison, ...]  # the memory comparisons that vary


@dataclass(frozen=True)
class Family:
    """What the multiplicity family over every candidate assigned to this candidate's comparisons."""

    assigned: dict[Key, dict]  # key -> {"alpha", "rank", "claim_p"}
    size: int
    memory_size: int
    others: tuple[str, ...]  # arms in the table that are in no comparison


def _change(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base <= 0:
        return None
    return num(cand / base - 1.0)


def _judged(inp: PairInput, opts: Options, fam: Family, key: Key, comp: pb_verdicts.Comparison | None,
            tested: bool) -> dict:
    """One comparison's entry: the interval and verdict (at the assigned level when *tested*, else
    at alpha and without a verdict), its pairs, and the median and trimmed-mean changes."""
    cond, metric = key
    pairs = inp.pairs[key]
    comp = comp or pb_verdicts.Comparison(key, pairs.d, METRICS[metric].higher_is_better, pb_verdicts.SPEED_WORDS)
    res = pb_verdicts.judge(comp, alpha=fam.assigned[key]["alpha"] if tested else opts.alpha, noise=opts.noise)
    out = {"higher_is_better": METRICS[metric].higher_is_better, "role": None,
           "n_invalid_pairs": pairs.n_invalid, "n_dropped_pairs": len(pairs.dropped),
           "unpaired_rounds": pairs.unpaired_rounds, "pairs": list(pairs.pairs),
           "median_ratio": num(np.median(np.exp(pairs.d))) if pairs.d.size else None, **res}
    if not tested:
        out["verdict"] = None
        out["reason"] = "shown, not tested: " + res["reason"] if res["reason"] else "shown, not tested"
        out["rounds_needed"] = None
    entry = fam.assigned.get(key)
    out["claim_p"] = num(entry["claim_p"]) if entry else None
    out["family_rank"] = entry["rank"] if entry else None
    bd, cd = inp.arms[inp.baseline][cond][metric], inp.arms[inp.candidate][cond][metric]
    out["median_change"] = _change(bd["median"], cd["median"])
    out["trimmed_mean_change"] = _change(bd["trimmed_mean"], cd["trimmed_mean"])
    return out


def speed(inp: PairInput, opts: Options, fam: Family) -> tuple[dict, list[dict]]:
    """``{condition: {metric: entry}}`` of the primary and secondary metrics, and the conditions
    where the median and the trimmed mean tell different stories."""
    tested = {c.key: c for c in inp.family}
    out: dict[str, dict] = {}
    disagreements: list[dict] = []
    for cond in inp.conditions:
        out[cond] = {}
        for metric in opts.shown:
            key = (cond, metric)
            primary = metric in opts.metrics
            res = _judged(inp, opts, fam, key, tested.get(key), primary)
            res["role"] = "primary" if primary else "secondary"
            mc, tc = res["median_change"], res["trimmed_mean_change"]
            if mc is not None and tc is not None:
                sign_differs = (mc > 0) != (tc > 0) and mc != 0 and tc != 0
                if sign_differs or abs(mc - tc) > opts.noise:
                    disagreements.append({"condition": cond, "metric": metric, "median_change": mc,
                                          "trimmed_mean_change": tc, "sign_differs": bool(sign_differs)})
            out[cond][metric] = res
    return out, disagreements


def memory(inp: PairInput, opts: Options, fam: Family) -> dict:
    """``{condition: {metric: entry}}`` of the memory metrics: exact ratio, or tested, or not recorded."""
    tested = {c.key: c for c in inp.memory_family}
    out: dict[str, dict] = {}
    for cond in inp.conditions:
        out[cond] = {}
        for metric in opts.memory:
            key = (cond, metric)
            cell = inp.memory_cells[key]
            entry: dict[str, Any] = {"baseline": cell.baseline["median"], "candidate": cell.candidate["median"],
                                     "n_baseline": cell.baseline["n"], "n_candidate": cell.candidate["n"],
                                     "exact": False, "ratio": None, "verdict": "inconclusive", "reason": "",
                                     "test": None}
            if not all(v.size for v in cell.values):
                entry["reason"] = "not recorded for " + " and ".join(
                    a for a, v in zip((inp.baseline, inp.candidate), cell.values) if not v.size)
            elif cell.exact:
                ratio = float(cell.values[1][0] / cell.values[0][0])
                reading = pb_verdicts.read_ratio(ratio, noise=opts.noise, higher_is_better=False,
                                                 words=pb_verdicts.MEMORY_WORDS)
                entry.update(exact=True, ratio=ratio, verdict=reading.verdict,
                             reason="constant in every selected record of both arms: the exact ratio, no test")
            else:
                res = _judged(inp, opts, fam, key, tested[key], True)
                res["role"] = "memory"
                entry.update(ratio=res["hl_ratio"], verdict=res["verdict"], reason=res["reason"], test=res)
            out[cond][metric] = entry
    return out


def _int_or_none(value: Any) -> int | None:
    try:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return int(value)
    except (TypeError, ValueError):
        return None


def _excluded_reason(row: pd.Series) -> str:
    reason = row.get("reason")
    if isinstance(reason, str) and reason.strip():
        return reason.strip()
    ok = row.get("ok")
    if ok is not None and not (isinstance(ok, float) and math.isnan(ok)) and not bool(ok):
        return "failed a gate (no reason recorded)"
    return "not selected (no reason recorded)"


def _excluded(df: pd.DataFrame) -> list[dict]:
    """Every row that is not selected, with its reason."""
    return [{"row": int(idx) if isinstance(idx, (int, np.integer)) else None, "arm": str(row["arm"]),
             "condition": str(row["condition"]), "round": int(row["round"]),
             "attempt": _int_or_none(row.get("attempt")), "reason": _excluded_reason(row)}
            for idx, row in df[~df["selected"]].iterrows()]


def _retries(df: pd.DataFrame) -> list[dict]:
    """Rows measured by an engine-fault re-attempt (attempt > 1) or a validation retry (retry > 0)."""
    attempt = pd.to_numeric(df["attempt"], errors="coerce") if "attempt" in df.columns else pd.Series(1, df.index)
    retry = pd.to_numeric(df["retry"], errors="coerce") if "retry" in df.columns else pd.Series(0, df.index)
    out = []
    for idx, row in df[(attempt > 1) | (retry > 0)].iterrows():
        out.append({"arm": str(row["arm"]), "condition": str(row["condition"]), "round": int(row["round"]),
                    "attempt": int(attempt[idx]) if attempt[idx] == attempt[idx] else 1,
                    "retry": int(retry[idx]) if retry[idx] == retry[idx] else 0, "selected": bool(row["selected"])})
    return out


def disclosures(inp: PairInput, opts: Options, fam: Family) -> dict:
    """What the report must disclose; cells without a partner and dropped pairs are read from the
    first shown metric (rounds pair alike for every metric)."""
    unpaired, dropped = [], []
    for cond in inp.conditions:
        pairs = inp.pairs[(cond, opts.shown[0])]
        for role, arm in (("baseline", inp.baseline), ("candidate", inp.candidate)):
            unpaired += [{"arm": arm, "condition": cond, "round": r} for r in pairs.unpaired_rounds[role]]
        dropped += [{"condition": cond, **d} for d in pairs.dropped]
    return {"slow_samples": list(inp.slow), "excluded": _excluded(inp.df), "retries": _retries(inp.df),
            "unpaired": unpaired, "dropped_pairs": dropped, "other_arms": list(fam.others)}


def params(opts: Options, fam: Family) -> dict:
    return {"alpha": float(opts.alpha), "noise": float(opts.noise), "seed": int(opts.seed),
            "trim": None if opts.trim is None else int(opts.trim), "ci_level": 1.0 - float(opts.alpha),
            "slow_z": SLOW_Z, "multiplicity": opts.multiplicity, "family_size": fam.size,
            "memory_family_size": fam.memory_size,
            "width_level": pb_verdicts.width_level(fam.size, opts.alpha, opts.multiplicity),
            "primary": list(opts.metrics), "secondary": list(opts.secondary), "memory": list(opts.memory),
            "visit_summary": VISIT_SUMMARY,
            "ci_method": "Hodges-Lehmann interval of log(candidate/baseline) inverting the exact "
                         "Wilcoxon signed-rank test (Walsh averages), at the level the multiplicity "
                         "procedure assigns",
            "test": "exact two-sided Wilcoxon signed-rank on log(candidate/baseline) of the "
                    "per-visit medians, the same Walsh averages"}


def pair_body(inp: PairInput, opts: Options, fam: Family) -> dict:
    """The candidate's whole pair body."""
    paired, disagreements = speed(inp, opts, fam)
    disc = disclosures(inp, opts, fam)
    disc["median_trimmed_disagreements"] = disagreements
    repeats = inp.sel.groupby(["arm", "condition", "round"]).size()
    role = {**{m: "primary" for m in opts.metrics}, **{m: "secondary" for m in opts.secondary},
            **{m: "memory" for m in opts.memory}}
    return {
        "baseline": inp.baseline,
        "candidate": inp.candidate,
        "metrics": {m: {"unit": METRICS[m].unit, "higher_is_better": METRICS[m].higher_is_better,
                        "role": r, "question": METRICS[m].question} for m, r in role.items()},
        "conditions": [pb_conditions.parse_id(c).to_dict() for c in inp.conditions],
        "params": params(opts, fam),
        "counts": {"rows": int(len(inp.df)), "selected": int(inp.df["selected"].sum()),
                   "excluded": len(disc["excluded"]), "retries": len(disc["retries"]),
                   "unpaired": len(disc["unpaired"]), "dropped_pairs": len(disc["dropped_pairs"]),
                   "max_repeats": int(repeats.max()) if len(repeats) else 0},
        "arms": inp.arms,
        "paired": paired,
        "memory": memory(inp, opts, fam),
        "disclosures": disc,
    }
