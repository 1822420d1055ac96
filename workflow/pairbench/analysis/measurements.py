"""The measurements table as the statistics read it: checked, typed, one selected row per cell.

One row per steady request (``tables/measurements.csv``, docs/contracts.md §2). A *cell* is one
arm, condition, round and repeat; only rows with ``selected == True`` enter the statistics. Input
that cannot be summarised raises :class:`StatsInputError` naming the key, column, arm or rows.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from pairbench.core import conditions as pb_conditions
from pairbench.core import metrics as pb_metrics

REQUIRED_COLUMNS = ("round", "arm", "condition", "selected")


class StatsInputError(ValueError):
    """The measurements table cannot be summarised; the message names the key, column, arm or row."""


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
        return pb_metrics.check_metric_lists(metrics, secondary, memory, where)
    except ValueError as exc:
        raise StatsInputError(str(exc)) from None


def condition_order(ids: Iterable[str]) -> list[str]:
    """Condition ids in the plan's order (each factor numerically, the first factor outermost)."""
    try:
        return [c.id for c in sorted({pb_conditions.parse_id(str(i)) for i in ids})]
    except ValueError as exc:
        raise StatsInputError(f"column 'condition': {exc}") from None


def check_table(df: pd.DataFrame, arms: Iterable[str], metrics: tuple[str, ...],
                optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """A typed copy of *df*: the required columns present, booleans and integers parsed, every
    *arm* present, no selected row that failed a gate, and one selected row per cell."""
    if not isinstance(df, pd.DataFrame):
        raise StatsInputError(f"measurements must be a pandas DataFrame, got {type(df).__name__}")
    arms = list(arms)
    missing = [c for c in (*REQUIRED_COLUMNS, *metrics) if c not in df.columns]
    if missing:
        raise StatsInputError(f"measurements table lacks column(s): {', '.join(missing)}")
    df = df.copy()
    df["selected"] = as_bool(df["selected"], "selected")
    if "ok" in df.columns:
        df["ok"] = as_bool(df["ok"], "ok")
    df["arm"] = df["arm"].astype(str)
    df["condition"] = df["condition"].astype(str)
    condition_order(df["condition"].unique())  # every id readable
    for column in ["round"] + [c for c in ("repeat",) if c in df.columns]:
        try:
            df[column] = pd.to_numeric(df[column], errors="raise").astype(int)
        except (ValueError, TypeError) as exc:
            raise StatsInputError(f"column {column!r} must hold integers: {exc}") from None
    for metric in (*metrics, *(m for m in optional if m in df.columns)):
        try:
            df[metric] = pd.to_numeric(df[metric], errors="raise").astype(float)
        except (ValueError, TypeError) as exc:
            raise StatsInputError(f"column {metric!r} must hold numbers: {exc}") from None
    present = set(df["arm"])
    for role, arm in zip(["baseline"] + ["candidate"] * (len(arms) - 1), arms):
        if arm not in present:
            raise StatsInputError(
                f"{role} arm {arm!r} has no rows; arms present: {', '.join(sorted(present)) or 'none'}")
    if "ok" in df.columns:
        bad = df[df["selected"] & ~df["ok"]]
        if not bad.empty:
            first = bad.iloc[0]
            raise StatsInputError(
                f"row(s) {', '.join(map(str, bad.index[:6]))} are selected but failed a gate (ok "
                f"false), e.g. arm {first['arm']!r}, condition {first['condition']}, round {first['round']}: "
                f"a gated record must never enter the statistics")
    sel = df[df["selected"] & df["arm"].isin(arms)]
    cell = ["arm", "condition", "round"] + (["repeat"] if "repeat" in df.columns else [])
    dup = sel[sel.duplicated(cell, keep=False)]
    if not dup.empty:
        first = dup.iloc[0]
        what = f", repeat {first['repeat']}" if "repeat" in df.columns else ""
        raise StatsInputError(
            f"more than one selected row for arm {first['arm']!r}, condition {first['condition']}, round "
            f"{first['round']}{what} (rows {', '.join(map(str, dup.index[:6]))}): the measure stage must "
            f"select exactly one steady record per round, arm, condition" + (" and repeat" if what else ""))
    return df


def selected(df: pd.DataFrame, arms: Iterable[str]) -> pd.DataFrame:
    """The selected rows of *arms*."""
    return df[df["selected"] & df["arm"].isin(list(arms))]


def measured_conditions(df: pd.DataFrame, arms: Iterable[str]) -> list[str]:
    """Every condition *arms* measured, in the plan's order, selected or not: a condition whose every
    record was excluded stays (no pairs: inconclusive) instead of silently leaving the family."""
    return condition_order(df.loc[df["arm"].isin(list(arms)), "condition"].unique())
