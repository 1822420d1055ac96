"""Comparing two arms: descriptive statistics, paired ratios, verdicts and disclosures.

This is the *comparing* module of pairbench (measuring lives in ``measure``, reporting in ``report``;
the split is pyperf's). It reads one row per steady request (``tables/measurements.csv``, see
docs/contracts.md §2) and returns the JSON-able body of ``stats/summary.json``. docs/statistics.md
explains every method and rule used here; the short version:

- Only rows with ``selected == True`` enter the statistics. Every other row is listed, with its
  reason, under ``disclosures.excluded``: nothing is dropped silently.
- Per arm × length × metric: n, full-N median, min, max and a trimmed mean (``trim`` values dropped
  from *each* end; default ``n // 10`` per end, at least 1 once n ≥ 5).
- Per length × metric: the per-round paired ratio candidate/baseline (pairs matched by ``round``),
  its median, the Hodges–Lehmann estimate of the log ratios back-transformed to a ratio, a 95% paired
  BCa bootstrap CI of that estimate (``scipy.stats.bootstrap``, seeded) and the two-sided Wilcoxon
  signed-rank p of the log ratios (``scipy.stats.wilcoxon``).
- Verdict: ``faster``/``slower`` only when p < alpha *and* the whole CI lies outside 1 ± noise;
  ``inconclusive`` when n pairs can never reach p < alpha or anything fails or is NaN; otherwise
  ``no detectable difference``. There is no path by which an error becomes a difference (pyperf's
  ``is_significant`` fallback is the counter-example).
- Disclosures: slow samples (|robust z| > 3.5, z from the median absolute deviation) are flagged and
  *retained*; a median-based change and a trimmed-mean-based change that disagree in sign or by more
  than the noise threshold are reported; excluded rows, retries and unpaired rounds are listed.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

import numpy as np
import pandas as pd
import scipy.stats

# The metrics a verdict can be given for, with their orientation. A speed verdict ("faster") needs
# to know which way is better: throughput is better higher, latency better lower.
METRICS: dict[str, dict[str, Any]] = {
    "decode_tok_s": {"unit": "tok/s", "higher_is_better": True, "label": "decode throughput"},
    "prefill_tok_s": {"unit": "tok/s", "higher_is_better": True, "label": "prefill throughput"},
    "engine_decode_tok_s": {"unit": "tok/s", "higher_is_better": True,
                            "label": "engine-reported decode throughput"},
    "engine_prefill_tok_s": {"unit": "tok/s", "higher_is_better": True,
                             "label": "engine-reported prefill throughput"},
    "ttft_ms": {"unit": "ms", "higher_is_better": False, "label": "time to first token"},
    "e2e_ms": {"unit": "ms", "higher_is_better": False, "label": "end-to-end time"},
}
DEFAULT_METRICS = ("decode_tok_s", "prefill_tok_s", "ttft_ms", "e2e_ms")
REQUIRED_COLUMNS = ("round", "arm", "length", "selected")
VERDICTS = ("faster", "slower", "no detectable difference", "inconclusive")
CI_LEVEL = 0.95
SLOW_Z = 3.5  # Iglewicz & Hoaglin's cut-off for the modified (MAD-based) z-score

__all__ = [
    "METRICS", "DEFAULT_METRICS", "VERDICTS", "StatsInputError",
    "summarize", "as_bool",
    "default_trim", "trimmed_mean", "hodges_lehmann", "robust_z", "min_attainable_wilcoxon_p",
]


class StatsInputError(ValueError):
    """The measurements table cannot be summarised; the message names the column, arm or row."""


# ---------------------------------------------------------------------------------------------
# Small pure estimators (unit-tested on known answers)


def default_trim(n: int) -> int:
    """Values dropped from EACH end when no trim is configured.

    ``n // 10`` per end (the 10% trimmed mean: 10 rounds leave 8, 20 leave 16), but at least 1 per
    end once n ≥ 5, so that one wild sample in a short run cannot drag the mean; below 5 nothing is
    dropped (trimming would leave too little to average).
    """
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


def hodges_lehmann(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """One-sample Hodges–Lehmann estimate: the median of all Walsh averages (x_i + x_j)/2, i ≤ j.

    It is the location estimate that goes with the Wilcoxon signed-rank test. Vectorised along
    *axis* so that ``scipy.stats.bootstrap`` can call it on a whole batch of resamples.
    """
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    i, j = np.triu_indices(x.shape[-1])
    return np.median((x[..., i] + x[..., j]) / 2.0, axis=-1)


def robust_z(values: Iterable[float]) -> np.ndarray:
    """Modified z-scores (x − median) / (1.4826 · MAD); all NaN when the MAD is 0 (no spread)."""
    x = np.asarray(list(values), dtype=float)
    mad = scipy.stats.median_abs_deviation(x, scale="normal")
    if not np.isfinite(mad) or mad == 0:
        return np.full(x.shape, np.nan)
    return (x - np.median(x)) / mad


def min_attainable_wilcoxon_p(n: int) -> float:
    """Smallest two-sided exact Wilcoxon signed-rank p possible with *n* non-zero differences.

    The most extreme outcome (all differences of one sign) has probability 2^-n under the null on
    each side, so the best two-sided p is 2 · 2^-n = 2^(1-n): 0.0625 for 5 pairs, 0.03125 for 6.
    """
    if n <= 0:
        return 1.0
    return min(1.0, 2.0 ** (1 - n))


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


def _check_input(df: pd.DataFrame, baseline: str, candidate: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise StatsInputError(f"measurements must be a pandas DataFrame, got {type(df).__name__}")
    if baseline == candidate:
        raise StatsInputError(f"baseline and candidate are the same arm {baseline!r}")
    for metric in metrics:
        if metric not in METRICS:
            raise StatsInputError(
                f"metric {metric!r} has no known orientation; known: {', '.join(METRICS)}")
    missing = [c for c in (*REQUIRED_COLUMNS, *metrics) if c not in df.columns]
    if missing:
        raise StatsInputError(f"measurements table lacks column(s): {', '.join(missing)}")
    df = df.copy()
    df["selected"] = as_bool(df["selected"], "selected")
    if "ok" in df.columns:
        df["ok"] = as_bool(df["ok"], "ok")
    df["arm"] = df["arm"].astype(str)
    for column in ("round", "length"):
        try:
            df[column] = pd.to_numeric(df[column], errors="raise").astype(int)
        except (ValueError, TypeError) as exc:
            raise StatsInputError(f"column {column!r} must hold integers: {exc}") from None
    for metric in metrics:
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
    dup = sel[sel.duplicated(["arm", "length", "round"], keep=False)]
    if not dup.empty:
        first = dup.iloc[0]
        raise StatsInputError(
            f"more than one selected row for arm {first['arm']!r}, length {first['length']}, round "
            f"{first['round']} (rows {', '.join(map(str, dup.index[:6]))}): the measure stage must "
            f"select exactly one steady record per round, arm and length")
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


def _paired(base: pd.Series, cand: pd.Series, metric: str, *, alpha: float, noise: float,
            seed: int, n_resamples: int) -> dict:
    """Paired comparison of one metric at one length. *base*/*cand* are indexed by round."""
    rounds = sorted(set(base.index) & set(cand.index))
    b = base.reindex(rounds).to_numpy(dtype=float)
    c = cand.reindex(rounds).to_numpy(dtype=float)
    valid = np.isfinite(b) & np.isfinite(c) & (b > 0) & (c > 0)
    ratio = np.where(valid, c / np.where(b > 0, b, np.nan), np.nan)
    pairs = [{"round": int(r), "baseline": _num(bv), "candidate": _num(cv), "ratio": _num(rv),
              "valid": bool(ok)} for r, bv, cv, rv, ok in zip(rounds, b, c, ratio, valid)]
    higher = METRICS[metric]["higher_is_better"]
    out: dict[str, Any] = {
        "higher_is_better": higher,
        "n_pairs": int(valid.sum()),
        "n_invalid_pairs": int((~valid).sum()),
        "unpaired_rounds": {"baseline": sorted(int(r) for r in set(base.index) - set(cand.index)),
                            "candidate": sorted(int(r) for r in set(cand.index) - set(base.index))},
        "pairs": pairs,
        "median_ratio": None, "hl_ratio": None, "ci_low": None, "ci_high": None,
        "p_value": None, "min_attainable_p": None,
        "verdict": "inconclusive", "reason": "",
    }
    b, c = b[valid], c[valid]
    d = np.log(c) - np.log(b)
    n_nonzero = int(np.count_nonzero(d))
    out["min_attainable_p"] = min_attainable_wilcoxon_p(n_nonzero)
    if d.size:
        out["median_ratio"] = _num(np.median(c / b))
        out["hl_ratio"] = _num(np.exp(hodges_lehmann(d)))
    if out["min_attainable_p"] >= alpha:
        out["reason"] = (f"too few valid pairs: {n_nonzero} non-zero paired differences can reach at "
                         f"best p = {out['min_attainable_p']:.4g}, not below alpha = {alpha:g}")
        return out
    try:
        with warnings.catch_warnings():
            # A degenerate bootstrap returns NaN with a warning; NaN is handled below.
            warnings.simplefilter("ignore")
            boot = scipy.stats.bootstrap(
                (b, c), lambda bb, cc, axis=-1: hodges_lehmann(np.log(cc) - np.log(bb), axis=axis),
                paired=True, vectorized=True, n_resamples=n_resamples,
                # cap the (resamples x Walsh averages) working array at ~20M floats
                batch=max(1, min(n_resamples, 20_000_000 // (d.size * (d.size + 1) // 2))),
                confidence_level=CI_LEVEL, method="BCa", rng=np.random.default_rng(seed))
            test = scipy.stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
        ci_low, ci_high = (math.exp(v) for v in (boot.confidence_interval.low,
                                                  boot.confidence_interval.high))
        p = float(test.pvalue)
    except Exception as exc:  # noqa: BLE001 - any failure must land on "inconclusive"
        out["reason"] = f"statistics failed: {type(exc).__name__}: {exc}"
        return out
    out.update(ci_low=_num(ci_low), ci_high=_num(ci_high), p_value=_num(p))
    if None in (out["hl_ratio"], out["median_ratio"], out["ci_low"], out["ci_high"], out["p_value"]):
        out["reason"] = "a statistic came out NaN (degenerate data, e.g. identical ratios)"
        return out
    outside_up = ci_low > 1.0 + noise
    outside_down = ci_high < 1.0 - noise
    if p < alpha and (outside_up or outside_down):
        better = outside_up if higher else outside_down
        out["verdict"] = "faster" if better else "slower"
        out["reason"] = (f"p = {p:.3g} < alpha = {alpha:g} and the {CI_LEVEL:.0%} CI "
                         f"[{ci_low:.4f}, {ci_high:.4f}] lies outside 1 ± {noise:g}")
    else:
        out["verdict"] = "no detectable difference"
        why = []
        if p >= alpha:
            why.append(f"p = {p:.3g} ≥ alpha = {alpha:g}")
        if not (outside_up or outside_down):
            why.append(f"the {CI_LEVEL:.0%} CI [{ci_low:.4f}, {ci_high:.4f}] reaches into 1 ± {noise:g}")
        out["reason"] = "; ".join(why)
    return out


def _change(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base <= 0:
        return None
    return _num(cand / base - 1.0)


# ---------------------------------------------------------------------------------------------
# Public API


def summarize(df: pd.DataFrame, *, baseline: str, candidate: str,
              metrics: Iterable[str] = DEFAULT_METRICS, trim: int | None = None,
              alpha: float = 0.05, noise: float = 0.01, seed: int = 0,
              n_resamples: int = 9999) -> dict:
    """Summarise a measurements table into the JSON-able body of ``stats/summary.json``.

    The caller adds ``schema`` and ``inputs``. Raises :class:`StatsInputError` (naming the column,
    arm or rows) for a table that cannot be summarised; a statistic that cannot be computed is
    never an exception but an ``inconclusive`` verdict with its reason.
    """
    metrics = tuple(metrics)
    if not metrics:
        raise StatsInputError("no metrics requested")
    if trim is not None and (not isinstance(trim, (int, np.integer)) or trim < 0):
        raise StatsInputError(f"trim must be a non-negative integer or None, got {trim!r}")
    if not 0 < alpha < 1:
        raise StatsInputError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not 0 <= noise < 1:
        raise StatsInputError(f"noise must lie in [0, 1), got {noise!r}")
    if int(n_resamples) < 100:
        raise StatsInputError(f"n_resamples must be at least 100, got {n_resamples!r}")
    df = _check_input(df, baseline, candidate, metrics)

    sel = df[df["selected"] & df["arm"].isin([baseline, candidate])]
    lengths = sorted(int(v) for v in sel["length"].unique())
    arms_out: dict[str, dict] = {}
    slow: list[dict] = []
    for arm in (baseline, candidate):
        arms_out[arm] = {}
        for length in lengths:
            cell = sel[(sel["arm"] == arm) & (sel["length"] == length)].sort_values("round")
            arms_out[arm][str(length)] = {}
            for metric in metrics:
                values = cell[metric].dropna()
                values = values[np.isfinite(values)]
                desc = _describe(values.to_numpy(dtype=float), trim)
                desc["n_missing"] = int(len(cell) - len(values))
                z = robust_z(values.to_numpy(dtype=float)) if len(values) else np.array([])
                for (idx, value), zv in zip(values.items(), z):
                    if np.isfinite(zv) and abs(zv) > SLOW_Z:
                        # "slow" = in the worse direction for this metric; both sides are flagged.
                        worse = (zv < 0) if METRICS[metric]["higher_is_better"] else (zv > 0)
                        slow.append({"arm": arm, "length": length, "metric": metric,
                                     "round": int(cell.loc[idx, "round"]), "value": _num(value),
                                     "robust_z": _num(zv), "side": "slow" if worse else "fast"})
                desc["n_outliers"] = sum(1 for s in slow if (s["arm"], s["length"], s["metric"])
                                         == (arm, length, metric))
                arms_out[arm][str(length)][metric] = desc

    paired_out: dict[str, dict] = {}
    disagreements: list[dict] = []
    for length in lengths:
        paired_out[str(length)] = {}
        for metric in metrics:
            def series(arm: str) -> pd.Series:
                cell = sel[(sel["arm"] == arm) & (sel["length"] == length)]
                return pd.Series(cell[metric].to_numpy(dtype=float),
                                 index=cell["round"].to_numpy(dtype=int))
            res = _paired(series(baseline), series(candidate), metric, alpha=alpha, noise=noise,
                          seed=seed, n_resamples=int(n_resamples))
            bd = arms_out[baseline][str(length)][metric]
            cd = arms_out[candidate][str(length)][metric]
            res["median_change"] = _change(bd["median"], cd["median"])
            res["trimmed_mean_change"] = _change(bd["trimmed_mean"], cd["trimmed_mean"])
            mc, tc = res["median_change"], res["trimmed_mean_change"]
            if mc is not None and tc is not None:
                sign_differs = (mc > 0) != (tc > 0) and mc != 0 and tc != 0
                if sign_differs or abs(mc - tc) > noise:
                    disagreements.append({"length": length, "metric": metric, "median_change": mc,
                                          "trimmed_mean_change": tc, "sign_differs": bool(sign_differs)})
            paired_out[str(length)][metric] = res

    excluded = []
    for idx, row in df[~df["selected"]].iterrows():
        excluded.append({"row": int(idx) if isinstance(idx, (int, np.integer)) else None,
                         "arm": str(row["arm"]), "length": int(row["length"]),
                         "round": int(row["round"]),
                         "attempt": _int_or_none(row.get("attempt")),
                         "reason": _excluded_reason(row)})
    retries = []
    attempt = pd.to_numeric(df["attempt"], errors="coerce") if "attempt" in df.columns else pd.Series(1, df.index)
    retry = pd.to_numeric(df["retry"], errors="coerce") if "retry" in df.columns else pd.Series(0, df.index)
    for idx, row in df[(attempt > 1) | (retry > 0)].iterrows():
        n = int(retry[idx]) if retry[idx] == retry[idx] else 0
        retries.append({"arm": str(row["arm"]), "length": int(row["length"]),
                        "round": int(row["round"]), "attempt": int(attempt[idx]) if attempt[idx] == attempt[idx] else 1,
                        "retry": n, "selected": bool(row["selected"])})
    unpaired = []
    for length in lengths:
        for metric in metrics[:1]:  # rounds pair the same way for every metric
            u = paired_out[str(length)][metric]["unpaired_rounds"]
            for role, arm in (("baseline", baseline), ("candidate", candidate)):
                for r in u[role]:
                    unpaired.append({"arm": arm, "length": length, "round": r})
    other_arms = sorted(set(df["arm"]) - {baseline, candidate})

    return {
        "baseline": baseline,
        "candidate": candidate,
        "metrics": {m: {"unit": METRICS[m]["unit"], "higher_is_better": METRICS[m]["higher_is_better"]}
                    for m in metrics},
        "lengths": lengths,
        "params": {"alpha": float(alpha), "noise": float(noise), "seed": int(seed),
                   "n_resamples": int(n_resamples), "trim": None if trim is None else int(trim),
                   "ci_level": CI_LEVEL, "slow_z": SLOW_Z,
                   "ci_method": "BCa bootstrap (scipy.stats.bootstrap, paired) of the "
                                "Hodges-Lehmann estimate of log(candidate/baseline)",
                   "test": "two-sided Wilcoxon signed-rank (scipy.stats.wilcoxon) on "
                           "log(candidate/baseline), zero differences dropped"},
        "counts": {"rows": int(len(df)), "selected": int(df["selected"].sum()),
                   "excluded": len(excluded), "retries": len(retries),
                   "unpaired": len(unpaired)},
        "arms": arms_out,
        "paired": paired_out,
        "disclosures": {
            "slow_samples": slow,
            "median_trimmed_disagreements": disagreements,
            "excluded": excluded,
            "retries": retries,
            "unpaired": unpaired,
            "other_arms": other_arms,
        },
    }
