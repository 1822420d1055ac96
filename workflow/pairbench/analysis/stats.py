"""Comparing arms: descriptive statistics, paired comparisons, verdicts and disclosures, for one or
several candidates against one baseline (:func:`summarize_all`; :func:`summarize` is one pair).

This is the *comparing* module of pairbench (measuring lives in ``measure``, reporting in ``publish``;
the split is pyperf's). It reads one row per steady request (``tables/measurements.csv``, see
docs/contracts.md §2) and returns the JSON-able body of ``stats/summary.json``. docs/statistics.md
explains every method and rule; the short version:

- Only rows with ``selected == True`` enter the statistics; every other row is listed, with its
  reason, under ``disclosures.excluded``.
- Per arm × length × metric: n, full-N median, min, max and a trimmed mean over the requests.
- The paired unit is the *visit*: per round, arm and length, the median of its selected repeats
  (``repeat`` column; one request per visit without it). Pairs are matched by round.
- Primary metrics (``metrics``: one per question, see :data:`QUESTIONS`) are tested: the
  Hodges–Lehmann interval of log(candidate/baseline) that inverts the exact Wilcoxon signed-rank
  test (:mod:`~pairbench.analysis.signrank`), at the level Holm assigns across candidates × primary
  metrics × lengths (:mod:`~pairbench.analysis.verdicts`), and a verdict read from it: faster / slower /
  equivalent / inconclusive. Secondary metrics are shown with their unadjusted interval, never
  tested. Memory metrics (``memory``) are compared per length: an exact ratio when constant across
  rounds, otherwise tested like speed (smaller / larger / equivalent / inconclusive).
- Disclosures: slow samples flagged and retained, median vs trimmed-mean disagreements, excluded
  rows, retries, unpaired cells, pairs dropped because a validation retry measured one side later.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable

import numpy as np
import pandas as pd
import scipy.stats

from pairbench.analysis import verdicts as pb_verdicts
from pairbench.analysis.signrank import hodges_lehmann, min_attainable_p as min_attainable_wilcoxon_p
from pairbench.core import metrics as _metrics
# The metric registry (unit, orientation, question) is core's: the config check reads it too.
from pairbench.core.metrics import (DEFAULT_MEMORY, DEFAULT_METRICS, DEFAULT_SECONDARY, MEMORY_METRICS,
                                    METRICS, QUESTIONS, SPEED_METRICS)


REQUIRED_COLUMNS = ("round", "arm", "length", "selected")
VERDICTS = ("faster", "slower", "equivalent", "inconclusive")
MEMORY_VERDICTS = ("smaller", "larger", "equivalent", "inconclusive")
SLOW_Z = 3.5  # Iglewicz & Hoaglin's cut-off for the modified (MAD-based) z-score
VISIT_SUMMARY = "median"  # of a visit's repeats: the paired unit

__all__ = [
    "METRICS", "DEFAULT_METRICS", "DEFAULT_SECONDARY", "DEFAULT_MEMORY", "QUESTIONS", "SPEED_METRICS",
    "MEMORY_METRICS", "VERDICTS", "paired_differences",
    "MEMORY_VERDICTS", "StatsInputError", "summarize", "summarize_all", "as_bool", "check_metric_lists",
    "default_trim", "trimmed_mean", "hodges_lehmann", "robust_z", "min_attainable_wilcoxon_p",
]


class StatsInputError(ValueError):
    """The measurements table cannot be summarised; the message names the key, column, arm or row."""


# ---------------------------------------------------------------------------------------------
# Small pure estimators (unit-tested on known answers)


def default_trim(n: int) -> int:
    """Values dropped from EACH end when no trim is configured: ``n // 10``, at least 1 once n ≥ 5."""
    if n < 5:
        return 0
    return max(1, n // 10)


def trimmed_mean(values: Iterable[float], trim: int) -> float:
    """Mean after dropping the *trim* smallest and *trim* largest values; NaN if nothing is left."""
    x = np.sort(np.asarray(list(values), dtype=float))
    if trim < 0:
        raise ValueError(f"trim must be >= 0, got {trim}")
    if 2 * trim >= x.size:
        return math.nan
    return float(x[trim:x.size - trim].mean())


def robust_z(values: Iterable[float]) -> np.ndarray:
    """Modified z-scores (x − median) / (1.4826 · MAD); all NaN when the MAD is 0 (no spread)."""
    x = np.asarray(list(values), dtype=float)
    mad = scipy.stats.median_abs_deviation(x, scale="normal")
    if not np.isfinite(mad) or mad == 0:
        return np.full(x.shape, np.nan)
    return (x - np.median(x)) / mad


# ---------------------------------------------------------------------------------------------
# Input checking


def as_bool(series: pd.Series, column: str) -> pd.Series:
    if series.dtype == bool:
        return series
    mapping = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
    out = []
    for idx, value in series.items():
        if isinstance(value, (bool, np.bool_)):
            out.append(bool(value))
        elif isinstance(value, (int, np.integer)) and value in (0, 1):
            out.append(bool(value))
        elif isinstance(value, str) and value.strip().lower() in mapping:
            out.append(mapping[value.strip().lower()])
        else:
            raise StatsInputError(f"column {column!r}, row {idx}: not a boolean: {value!r}")
    return pd.Series(out, index=series.index, dtype=bool)


def check_metric_lists(metrics: Iterable[str], secondary: Iterable[str] = (), memory: Iterable[str] = (),
                       where: str = "stats") -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """:func:`pairbench.core.metrics.check_metric_lists`, raising :class:`StatsInputError`."""
    try:
        return _metrics.check_metric_lists(metrics, secondary, memory, where)
    except ValueError as exc:
        raise StatsInputError(str(exc)) from None


def _check_input(df: pd.DataFrame, baseline: str, candidate: str, metrics: tuple[str, ...],
                 optional: tuple[str, ...]) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise StatsInputError(f"measurements must be a pandas DataFrame, got {type(df).__name__}")
    if baseline == candidate:
        raise StatsInputError(f"baseline and candidate are the same arm {baseline!r}")
    missing = [c for c in (*REQUIRED_COLUMNS, *metrics) if c not in df.columns]
    if missing:
        raise StatsInputError(f"measurements table lacks column(s): {', '.join(missing)}")
    df = df.copy()
    df["selected"] = as_bool(df["selected"], "selected")
    if "ok" in df.columns:
        df["ok"] = as_bool(df["ok"], "ok")
    df["arm"] = df["arm"].astype(str)
    ints = ["round", "length"] + [c for c in ("repeat",) if c in df.columns]
    for column in ints:
        try:
            df[column] = pd.to_numeric(df[column], errors="raise").astype(int)
        except (ValueError, TypeError) as exc:
            raise StatsInputError(f"column {column!r} must hold integers: {exc}") from None
    for metric in (*metrics, *(m for m in optional if m in df.columns)):
        try:
            df[metric] = pd.to_numeric(df[metric], errors="raise").astype(float)
        except (ValueError, TypeError) as exc:
            raise StatsInputError(f"column {metric!r} must hold numbers: {exc}") from None
    arms = set(df["arm"])
    for role, arm in (("baseline", baseline), ("candidate", candidate)):
        if arm not in arms:
            raise StatsInputError(
                f"{role} arm {arm!r} has no rows; arms present: {', '.join(sorted(arms)) or 'none'}")
    if "ok" in df.columns:
        bad = df[df["selected"] & ~df["ok"]]
        if not bad.empty:
            first = bad.iloc[0]
            raise StatsInputError(
                f"row(s) {', '.join(map(str, bad.index[:6]))} are selected but failed a gate (ok "
                f"false), e.g. arm {first['arm']!r}, length {first['length']}, round {first['round']}: "
                f"a gated record must never enter the statistics")
    sel = df[df["selected"] & df["arm"].isin([baseline, candidate])]
    cell = ["arm", "length", "round"] + (["repeat"] if "repeat" in df.columns else [])
    dup = sel[sel.duplicated(cell, keep=False)]
    if not dup.empty:
        first = dup.iloc[0]
        what = f", repeat {first['repeat']}" if "repeat" in df.columns else ""
        raise StatsInputError(
            f"more than one selected row for arm {first['arm']!r}, length {first['length']}, round "
            f"{first['round']}{what} (rows {', '.join(map(str, dup.index[:6]))}): the measure stage must "
            f"select exactly one steady record per round, arm, length" + (" and repeat" if what else ""))
    return df


# ---------------------------------------------------------------------------------------------
# Pieces of the summary


def _num(value: Any) -> float | None:
    """A JSON-safe float: NaN and infinities become None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _describe(values: np.ndarray, trim: int | None) -> dict:
    n = int(values.size)
    k = default_trim(n) if trim is None else int(trim)
    return {
        "n": n,
        "median": _num(np.median(values)) if n else None,
        "min": _num(values.min()) if n else None,
        "max": _num(values.max()) if n else None,
        "trimmed_mean": _num(trimmed_mean(values, k)) if n else None,
        "trim_per_end": k,
    }


def _excluded_reason(row: pd.Series) -> str:
    reason = row.get("reason")
    if isinstance(reason, str) and reason.strip():
        return reason.strip()
    ok = row.get("ok")
    if ok is not None and not (isinstance(ok, float) and math.isnan(ok)) and not bool(ok):
        return "failed a gate (no reason recorded)"
    return "not selected (no reason recorded)"


def _int_or_none(value: Any) -> int | None:
    try:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return int(value)
    except (TypeError, ValueError):
        return None


def _visits(sel: pd.DataFrame, arm: str, length: int, metric: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Per round: the visit summary (median of the selected repeats with a positive finite value),
    the number of repeats it summarises, and whether any of them came from a validation retry."""
    cell = sel[(sel["arm"] == arm) & (sel["length"] == length)]
    vals = cell[metric]
    good = cell[np.isfinite(vals) & (vals > 0)]
    rounds = sorted(int(r) for r in cell["round"].unique())
    g = good.groupby("round")[metric]
    summary = g.median().reindex(rounds)
    n = g.size().reindex(rounds).fillna(0).astype(int)
    retried = (cell.groupby("round")["retry"].max() > 0).reindex(rounds) if "retry" in cell.columns \
        else pd.Series(False, index=rounds)
    return summary, n, retried.fillna(False).astype(bool)


def _pairs(sel: pd.DataFrame, baseline: str, candidate: str, length: int, metric: str) -> dict:
    """The paired rounds of one length × metric: values, ratios, validity, unpaired and dropped."""
    bs, bn, br = _visits(sel, baseline, length, metric)
    cs, cn, cr = _visits(sel, candidate, length, metric)
    common = sorted(set(bs.index) & set(cs.index))
    pairs, d, dropped = [], [], []
    for r in common:
        b, c = bs.get(r), cs.get(r)
        if br.get(r, False) or cr.get(r, False):
            # a validation retry measured one side after every visit: not adjacent to its partner
            arm = baseline if br.get(r, False) else candidate
            dropped.append({"round": int(r), "arm": arm})
            pairs.append({"round": int(r), "baseline": _num(b), "candidate": _num(c), "ratio": None,
                          "valid": False, "n_baseline": int(bn.get(r, 0)), "n_candidate": int(cn.get(r, 0))})
            continue
        valid = b is not None and c is not None and np.isfinite(b) and np.isfinite(c) and b > 0 and c > 0
        pairs.append({"round": int(r), "baseline": _num(b), "candidate": _num(c),
                      "ratio": _num(c / b) if valid else None, "valid": bool(valid),
                      "n_baseline": int(bn.get(r, 0)), "n_candidate": int(cn.get(r, 0))})
        if valid:
            d.append(math.log(c) - math.log(b))
    return {"pairs": pairs, "d": np.asarray(d, dtype=float), "dropped": dropped,
            "unpaired_rounds": {"baseline": sorted(int(r) for r in set(bs.index) - set(cs.index)),
                                "candidate": sorted(int(r) for r in set(cs.index) - set(bs.index))}}


def _change(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base <= 0:
        return None
    return _num(cand / base - 1.0)


def _constant(values: np.ndarray) -> bool:
    return values.size > 0 and float(values.min()) == float(values.max())


def _excluded(df: pd.DataFrame) -> list[dict]:
    """Every row that is not selected, with its reason."""
    return [{"row": int(idx) if isinstance(idx, (int, np.integer)) else None, "arm": str(row["arm"]),
             "length": int(row["length"]), "round": int(row["round"]), "attempt": _int_or_none(row.get("attempt")),
             "reason": _excluded_reason(row)} for idx, row in df[~df["selected"]].iterrows()]


def _retries(df: pd.DataFrame) -> list[dict]:
    """Rows measured by an engine-fault re-attempt (attempt > 1) or a validation retry (retry > 0)."""
    attempt = pd.to_numeric(df["attempt"], errors="coerce") if "attempt" in df.columns else pd.Series(1, df.index)
    retry = pd.to_numeric(df["retry"], errors="coerce") if "retry" in df.columns else pd.Series(0, df.index)
    out = []
    for idx, row in df[(attempt > 1) | (retry > 0)].iterrows():
        out.append({"arm": str(row["arm"]), "length": int(row["length"]), "round": int(row["round"]),
                    "attempt": int(attempt[idx]) if attempt[idx] == attempt[idx] else 1,
                    "retry": int(retry[idx]) if retry[idx] == retry[idx] else 0, "selected": bool(row["selected"])})
    return out


def _unpaired_and_dropped(pair_data: dict, lengths: list[int], metric: str, baseline: str,
                          candidate: str) -> tuple[list[dict], list[dict]]:
    """Cells without a partner, and pairs dropped for a retried side (rounds pair alike for every metric)."""
    unpaired, dropped = [], []
    for length in lengths:
        pdat = pair_data[(str(length), metric)]
        for role, arm in (("baseline", baseline), ("candidate", candidate)):
            unpaired += [{"arm": arm, "length": length, "round": r} for r in pdat["unpaired_rounds"][role]]
        dropped += [{"length": length, **dr} for dr in pdat["dropped"]]
    return unpaired, dropped


# ---------------------------------------------------------------------------------------------
# Public API


def paired_differences(df: pd.DataFrame, *, baseline: str, candidate: str, metrics: Iterable[str]) -> dict:
    """``{(length as str, metric): log(candidate/baseline) per valid pair}`` of the selected rows,
    paired as :func:`summarize` pairs them (visit medians, retried pairs dropped)."""
    metrics = tuple(metrics)
    df = _check_input(df, baseline, candidate, metrics, ())
    sel = df[df["selected"] & df["arm"].isin([baseline, candidate])]
    lengths = sorted(int(v) for v in sel["length"].unique())
    return {(str(n), m): _pairs(sel, baseline, candidate, n, m)["d"] for n in lengths for m in metrics}


def _per_arm(sel: pd.DataFrame, arms: tuple[str, str], lengths: list[int], shown: tuple[str, ...],
             memory: tuple[str, ...], trim: int | None) -> tuple[dict, list[dict]]:
    """Per arm × length × metric descriptive statistics, and the slow samples (speed metrics only)."""
    arms_out: dict[str, dict] = {}
    slow: list[dict] = []
    for arm in arms:
        arms_out[arm] = {}
        for length in lengths:
            cell = sel[(sel["arm"] == arm) & (sel["length"] == length)].sort_values("round")
            arms_out[arm][str(length)] = {}
            for metric in (*shown, *memory):
                values = cell[metric].dropna()
                values = values[np.isfinite(values)]
                desc = _describe(values.to_numpy(dtype=float), trim)
                desc["n_missing"] = int(len(cell) - len(values))
                desc["n_visits"] = int(cell.loc[values.index, "round"].nunique()) if len(values) else 0
                n_out = 0
                if metric in shown:
                    z = robust_z(values.to_numpy(dtype=float)) if len(values) else np.array([])
                    for (idx, value), zv in zip(values.items(), z):
                        if np.isfinite(zv) and abs(zv) > SLOW_Z:
                            # "slow" = in the worse direction for this metric; both sides are flagged.
                            worse = (zv < 0) if METRICS[metric]["higher_is_better"] else (zv > 0)
                            slow.append({"arm": arm, "length": length, "metric": metric,
                                         "round": int(cell.loc[idx, "round"]), "value": _num(value),
                                         "robust_z": _num(zv), "side": "slow" if worse else "fast"})
                            n_out += 1
                desc["n_outliers"] = n_out
                arms_out[arm][str(length)][metric] = desc

    return arms_out, slow


def _options(df: Any, metrics: Iterable[str], secondary: Iterable[str] | None, memory: Iterable[str] | None,
             trim: int | None, alpha: float, noise: float, multiplicity: str) -> dict:
    """The checked statistics options: ``{"metrics", "secondary", "memory", "explicit_memory"}``."""
    if trim is not None and (not isinstance(trim, (int, np.integer)) or trim < 0):
        raise StatsInputError(f"stats.trim: must be a non-negative integer or null, got {trim!r}")
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise StatsInputError(f"stats.alpha: must lie in (0, 1), got {alpha!r}")
    if not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise StatsInputError(f"stats.noise: must lie in [0, 1), got {noise!r}")
    if multiplicity not in pb_verdicts.MULTIPLICITY:
        raise StatsInputError(f"stats.multiplicity: {multiplicity!r} is not one of "
                              f"{', '.join(pb_verdicts.MULTIPLICITY)}")
    explicit_secondary, explicit_memory = secondary is not None, memory is not None
    metrics = tuple(metrics)
    columns = set(getattr(df, "columns", ()))
    secondary = tuple(secondary) if explicit_secondary else tuple(
        m for m in DEFAULT_SECONDARY if m not in metrics and m in columns)
    memory = tuple(memory) if explicit_memory else tuple(m for m in DEFAULT_MEMORY if m in columns)
    metrics, secondary, memory = check_metric_lists(metrics, secondary, memory)
    return {"metrics": metrics, "secondary": secondary, "memory": memory, "explicit_memory": explicit_memory}


def _prepare(df: pd.DataFrame, baseline: str, candidate: str, opts: dict, trim: int | None) -> dict:
    """One pair's checked table, per-arm statistics, paired data and its two families (untested yet)."""
    metrics, secondary, memory = opts["metrics"], opts["secondary"], opts["memory"]
    shown = (*metrics, *secondary)
    df = _check_input(df, baseline, candidate, shown, memory)
    missing_memory = [m for m in memory if m not in df.columns]
    if missing_memory and opts["explicit_memory"]:
        raise StatsInputError(f"stats.memory: measurements table lacks column(s): {', '.join(missing_memory)}")

    sel = df[df["selected"] & df["arm"].isin([baseline, candidate])]
    lengths = sorted(int(v) for v in sel["length"].unique())
    arms_out, slow = _per_arm(sel, (baseline, candidate), lengths, shown, memory, trim)

    # --- the comparisons: which are tested (the multiplicity family), then each one's verdict
    pair_data = {(str(n), m): _pairs(sel, baseline, candidate, n, m) for n in lengths for m in (*shown, *memory)}
    exact_memory = {}
    for length in lengths:
        for metric in memory:
            vals = [arms_out[a][str(length)][metric] for a in (baseline, candidate)]
            cells = [sel[(sel["arm"] == a) & (sel["length"] == length)][metric].to_numpy(dtype=float)
                     for a in (baseline, candidate)]
            cells = [c[np.isfinite(c) & (c > 0)] for c in cells]
            exact_memory[(str(length), metric)] = (all(_constant(c) for c in cells), vals, cells)
    family = [pb_verdicts.Comparison((str(n), m), pair_data[(str(n), m)]["d"], METRICS[m]["higher_is_better"],
                                     pb_verdicts.SPEED_WORDS) for n in lengths for m in metrics]
    # memory is its own question ("what does it cost"), so its own family: only what varies is tested
    memory_family = [pb_verdicts.Comparison(key, pair_data[key]["d"], False, pb_verdicts.MEMORY_WORDS)
                     for key, (exact, _, cells) in exact_memory.items()
                     if not exact and all(c.size for c in cells)]
    return {"df": df, "sel": sel, "lengths": lengths, "arms_out": arms_out, "slow": slow,
            "pair_data": pair_data, "exact_memory": exact_memory, "family": family,
            "memory_family": memory_family}


def _pair_body(parts: dict, assigned: dict, *, baseline: str, candidate: str, opts: dict, trim: int | None,
               alpha: float, noise: float, seed: int, multiplicity: str, family_size: int,
               memory_family_size: int, others: list[str]) -> dict:
    """One candidate's comparison with the baseline, its tested comparisons judged at the *assigned*
    levels (``{(length, metric): {"level", "rank", "claim_p"}}``) of a family of *family_size*."""
    metrics, secondary, memory = opts["metrics"], opts["secondary"], opts["memory"]
    shown = (*metrics, *secondary)
    df, sel, lengths = parts["df"], parts["sel"], parts["lengths"]
    arms_out, slow, pair_data = parts["arms_out"], parts["slow"], parts["pair_data"]
    exact_memory = parts["exact_memory"]

    def compare(key: tuple[str, str], comp: pb_verdicts.Comparison | None, level: float, tested: bool) -> dict:
        length, metric = key
        pd_ = pair_data[key]
        comp = comp or pb_verdicts.Comparison(key, pd_["d"], METRICS[metric]["higher_is_better"],
                                              pb_verdicts.SPEED_WORDS)
        res = pb_verdicts.judge(comp, level=level, noise=noise)
        out = {"higher_is_better": METRICS[metric]["higher_is_better"], "role": None,
               "n_invalid_pairs": sum(1 for p in pd_["pairs"] if not p["valid"]) - len(pd_["dropped"]),
               "n_dropped_pairs": len(pd_["dropped"]), "unpaired_rounds": pd_["unpaired_rounds"],
               "pairs": pd_["pairs"],
               "median_ratio": _num(np.median(np.exp(pd_["d"]))) if pd_["d"].size else None, **res}
        if not tested:
            out["verdict"] = None
            out["reason"] = "shown, not tested: " + res["reason"] if res["reason"] else "shown, not tested"
            out["rounds_needed"] = None
        out["claim_p"] = _num(assigned[key]["claim_p"]) if key in assigned else None
        out["family_rank"] = assigned[key]["rank"] if key in assigned else None
        bd = arms_out[baseline][length][metric]
        cd = arms_out[candidate][length][metric]
        out["median_change"] = _change(bd["median"], cd["median"])
        out["trimmed_mean_change"] = _change(bd["trimmed_mean"], cd["trimmed_mean"])
        return out

    by_key = {c.key: c for c in (*parts["family"], *parts["memory_family"])}
    paired_out: dict[str, dict] = {}
    disagreements: list[dict] = []
    for length in lengths:
        paired_out[str(length)] = {}
        for metric in shown:
            key = (str(length), metric)
            if metric in metrics:
                res = compare(key, by_key[key], assigned[key]["level"], True)
                res["role"] = "primary"
            else:
                res = compare(key, None, alpha, False)
                res["role"] = "secondary"
            mc, tc = res["median_change"], res["trimmed_mean_change"]
            if mc is not None and tc is not None:
                sign_differs = (mc > 0) != (tc > 0) and mc != 0 and tc != 0
                if sign_differs or abs(mc - tc) > noise:
                    disagreements.append({"length": length, "metric": metric, "median_change": mc,
                                          "trimmed_mean_change": tc, "sign_differs": bool(sign_differs)})
            paired_out[str(length)][metric] = res

    memory_out: dict[str, dict] = {}
    for length in lengths:
        memory_out[str(length)] = {}
        for metric in memory:
            key = (str(length), metric)
            exact, (bd, cd), cells = exact_memory[key]
            entry = {"baseline": bd["median"], "candidate": cd["median"], "n_baseline": bd["n"],
                     "n_candidate": cd["n"], "exact": False, "ratio": None, "verdict": "inconclusive",
                     "reason": "", "test": None}
            if not all(c.size for c in cells):
                entry["reason"] = "not recorded for " + " and ".join(
                    a for a, c in zip((baseline, candidate), cells) if not c.size)
            elif exact:
                ratio = float(cells[1][0] / cells[0][0])
                lo_t, hi_t = 1 - noise, 1 + noise
                entry.update(exact=True, ratio=ratio, verdict="smaller" if ratio < lo_t else
                             ("larger" if ratio > hi_t else "equivalent"),
                             reason="constant in every selected record of both arms: the exact ratio, no test")
            else:
                res = compare(key, by_key[key], assigned[key]["level"], True)
                res["role"] = "memory"
                entry.update(ratio=res["hl_ratio"], verdict=res["verdict"], reason=res["reason"], test=res)
            memory_out[str(length)][metric] = entry

    excluded, retries = _excluded(df), _retries(df)
    unpaired, dropped = _unpaired_and_dropped(pair_data, lengths, shown[0], baseline, candidate)
    other_arms = list(others)
    repeats = sel.groupby(["arm", "length", "round"]).size()

    return {
        "baseline": baseline,
        "candidate": candidate,
        "metrics": {m: {"unit": METRICS[m]["unit"], "higher_is_better": METRICS[m]["higher_is_better"],
                        "role": "primary" if m in metrics else ("secondary" if m in secondary else "memory"),
                        "question": METRICS[m]["question"]} for m in (*shown, *memory)},
        "lengths": lengths,
        "params": {"alpha": float(alpha), "noise": float(noise), "seed": int(seed),
                   "trim": None if trim is None else int(trim), "ci_level": 1.0 - float(alpha),
                   "slow_z": SLOW_Z, "multiplicity": multiplicity, "family_size": family_size,
                   "memory_family_size": memory_family_size,
                   "width_level": pb_verdicts.width_level(family_size, alpha, multiplicity),
                   "primary": list(metrics), "secondary": list(secondary), "memory": list(memory),
                   "visit_summary": VISIT_SUMMARY,
                   "ci_method": "Hodges-Lehmann interval of log(candidate/baseline) inverting the exact "
                                "Wilcoxon signed-rank test (Walsh averages), at the level the multiplicity "
                                "procedure assigns",
                   "test": "exact two-sided Wilcoxon signed-rank on log(candidate/baseline) of the "
                           "per-visit medians, the same Walsh averages"},
        "counts": {"rows": int(len(df)), "selected": int(df["selected"].sum()),
                   "excluded": len(excluded), "retries": len(retries),
                   "unpaired": len(unpaired), "dropped_pairs": len(dropped),
                   "max_repeats": int(repeats.max()) if len(repeats) else 0},
        "arms": arms_out,
        "paired": paired_out,
        "memory": memory_out,
        "disclosures": {
            "slow_samples": slow,
            "median_trimmed_disagreements": disagreements,
            "excluded": excluded,
            "retries": retries,
            "unpaired": unpaired,
            "dropped_pairs": dropped,
            "other_arms": other_arms,
        },
    }


def summarize(df: pd.DataFrame, *, baseline: str, candidate: str,
              metrics: Iterable[str] = DEFAULT_METRICS, trim: int | None = None,
              alpha: float = 0.05, noise: float = 0.01, seed: int = 0,
              secondary: Iterable[str] | None = None, memory: Iterable[str] | None = None,
              multiplicity: str = "holm", n_resamples: int | None = None) -> dict:
    """One candidate against the baseline: the pair body that ``stats/summary.json`` holds per
    candidate under ``comparisons`` (:func:`summarize_all`, whose one-candidate case this is), with
    its own family (primary metrics × lengths).

    *metrics* are the primary (tested) metrics, at most one per question; *secondary* are shown
    with an unadjusted interval and never tested (default: the speed metrics of
    :data:`DEFAULT_SECONDARY` not already primary and present in the table); *memory* are compared
    per length (default: :data:`DEFAULT_MEMORY` where present). *noise* is the practical threshold
    of every verdict. *multiplicity* is ``holm`` (default), ``bonferroni`` or ``none``. *seed* is
    recorded (the exact interval draws no random numbers); *n_resamples* is accepted for callers
    written for the bootstrap this replaced and ignored.

    Raises :class:`StatsInputError` (naming the key,
    column, arm or rows) for input that cannot be summarised; a statistic that cannot be computed is
    never an exception but an ``inconclusive`` verdict with its reason.
    """
    return summarize_all(df, baseline=baseline, candidates=[candidate], metrics=metrics, trim=trim, alpha=alpha,
                         noise=noise, seed=seed, secondary=secondary, memory=memory,
                         multiplicity=multiplicity)["comparisons"][candidate]


def _across(families: dict[str, list], alpha: float, noise: float, method: str) -> dict[str, dict]:
    """Levels assigned over one family spanning every candidate: ``{candidate: {key: level entry}}``."""
    keyed = [replace(c, key=(cand, *c.key)) for cand, comps in families.items() for c in comps]
    assigned = pb_verdicts.levels(keyed, alpha, noise, method)
    return {cand: {k[1:]: v for k, v in assigned.items() if k[0] == cand} for cand in families}


def summarize_all(df: pd.DataFrame, *, baseline: str, candidates: Iterable[str],
                  metrics: Iterable[str] = DEFAULT_METRICS, trim: int | None = None,
                  alpha: float = 0.05, noise: float = 0.01, seed: int = 0,
                  secondary: Iterable[str] | None = None, memory: Iterable[str] | None = None,
                  multiplicity: str = "holm", n_resamples: int | None = None) -> dict:
    """Every candidate against the baseline: the body of ``stats/summary.json`` (the caller adds
    ``schema``, ``run`` and ``inputs``): ``{"baseline", "candidates", "comparisons": {candidate: the
    pair body of :func:`summarize`}, "params"}``.

    One multiplicity family spans every candidate × primary metric × length (and one for the tested
    memory comparisons of every candidate), so the family-wise error of every claim of the run, over
    all its candidates, is at most *alpha*; each pair body records the levels and ranks its
    comparisons were given in that family, and its ``params.family_size`` is the whole family's.
    """
    candidates = list(candidates)
    if not candidates:
        raise StatsInputError("candidates: no candidate arm to compare with the baseline")
    dup = next((c for i, c in enumerate(candidates) if c in candidates[:i]), None)
    if dup is not None:
        raise StatsInputError(f"candidates: arm {dup!r} is listed twice")
    opts = _options(df, metrics, secondary, memory, trim, alpha, noise, multiplicity)
    parts = {c: _prepare(df, baseline, c, opts, trim) for c in candidates}
    speed = _across({c: p["family"] for c, p in parts.items()}, alpha, noise, multiplicity)
    mem = _across({c: p["memory_family"] for c, p in parts.items()}, alpha, noise, multiplicity)
    m = sum(len(p["family"]) for p in parts.values())
    m_memory = sum(len(p["memory_family"]) for p in parts.values())
    others = sorted(set(parts[candidates[0]]["df"]["arm"]) - {baseline, *candidates})
    comparisons = {c: _pair_body(parts[c], {**speed[c], **mem[c]}, baseline=baseline, candidate=c, opts=opts,
                                 trim=trim, alpha=alpha, noise=noise, seed=seed, multiplicity=multiplicity,
                                 family_size=m, memory_family_size=m_memory, others=others)
                   for c in candidates}
    return {"baseline": baseline, "candidates": candidates, "comparisons": comparisons,
            "params": {"alpha": float(alpha), "noise": float(noise), "seed": int(seed),
                       "trim": None if trim is None else int(trim), "multiplicity": multiplicity,
                       "family": "candidates × primary metrics × lengths",
                       "family_size": m, "memory_family_size": m_memory,
                       "width_level": pb_verdicts.width_level(m, alpha, multiplicity),
                       "primary": list(opts["metrics"]), "secondary": list(opts["secondary"]),
                       "memory": list(opts["memory"])}}
