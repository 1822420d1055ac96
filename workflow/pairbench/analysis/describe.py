"""Descriptive statistics per arm, condition and metric: n, full-N median, min, max, a trimmed mean,
and the outlying samples (flagged, never dropped).

Small pure estimators, unit-tested on known answers.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd
import scipy.stats

from pairbench.core.metrics import METRICS

SLOW_Z = 3.5  # Iglewicz & Hoaglin's cut-off for the modified (MAD-based) z-score


def num(value: Any) -> float | None:
    """A JSON-safe float: NaN and infinities become None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


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


def describe(values: np.ndarray, trim: int | None) -> dict:
    n = int(values.size)
    k = default_trim(n) if trim is None else int(trim)
    return {
        "n": n,
        "median": num(np.median(values)) if n else None,
        "min": num(values.min()) if n else None,
        "max": num(values.max()) if n else None,
        "trimmed_mean": num(trimmed_mean(values, k)) if n else None,
        "trim_per_end": k,
    }


def _cell(sel: pd.DataFrame, arm: str, condition: str, metric: str, trim: int | None,
          flag_outliers: bool) -> tuple[dict, list[dict]]:
    """One arm × condition × metric: its description and its outlying samples."""
    cell = sel[(sel["arm"] == arm) & (sel["condition"] == condition)].sort_values("round")
    values = cell[metric].dropna()
    values = values[np.isfinite(values)]
    desc = describe(values.to_numpy(dtype=float), trim)
    desc["n_missing"] = int(len(cell) - len(values))
    desc["n_visits"] = int(cell.loc[values.index, "round"].nunique()) if len(values) else 0
    slow = []
    if flag_outliers and len(values):
        for (idx, value), zv in zip(values.items(), robust_z(values.to_numpy(dtype=float))):
            if np.isfinite(zv) and abs(zv) > SLOW_Z:
                # "slow" = in the worse direction for this metric; both sides are flagged.
                worse = (zv < 0) if METRICS[metric].higher_is_better else (zv > 0)
                slow.append({"arm": arm, "condition": condition, "metric": metric,
                             "round": int(cell.loc[idx, "round"]), "value": num(value),
                             "robust_z": num(zv), "side": "slow" if worse else "fast"})
    desc["n_outliers"] = len(slow)
    return desc, slow


def per_arm(sel: pd.DataFrame, arms: Iterable[str], conditions: list[str], shown: tuple[str, ...],
            memory: tuple[str, ...], trim: int | None) -> tuple[dict, list[dict]]:
    """``{arm: {condition: {metric: description}}}`` and the outlying samples (speed metrics only)."""
    out: dict[str, dict] = {}
    slow: list[dict] = []
    for arm in arms:
        out[arm] = {}
        for cond in conditions:
            out[arm][cond] = {}
            for metric in (*shown, *memory):
                desc, flagged = _cell(sel, arm, cond, metric, trim, metric in shown)
                out[arm][cond][metric] = desc
                slow += flagged
    return out, slow
