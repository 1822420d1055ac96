"""The landing page of ``snakemake --report``: the verdict table and the retry disclosure, as RST.

Snakemake renders the workflow description (workflow/report/workflow.rst) on the report's first page
through docutils, which can ``.. include::`` a file but cannot compute anything. This module turns
``tables/paired.csv`` and ``tables/measurements.csv`` into a compact RST snippet
(``results/<label>/report/landing.rst``) that the description includes: one row per condition and
tested metric with the Hodges-Lehmann ratio, its interval and level, and the verdict (the full-precision columns
stay in the Summary category), and every retry (engine-fault re-attempts and validation retries).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pairbench.core.artifacts import atomic_write_text
from pairbench.core.conditions import parse_id
from pairbench.publish.bundle import CATEGORICAL_FIELDS
from pairbench.publish.verify import read_table


def _num(x, spec: str = ".3f") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(x) else format(x, spec)


def verdict_rows(paired: pd.DataFrame) -> list[list[str]]:
    """[candidate, condition, metric, estimate, interval (level), verdict] per tested row of
    tables/paired.csv, every candidate in one table (secondary metrics, shown but never tested,
    are left to the Summary category)."""
    rows = []
    for _, r in paired.iterrows():
        if "role" in paired.columns and r["role"] != "primary":
            continue
        lo, hi = _num(r.get("ci_low")), _num(r.get("ci_high"))
        level = _num(100 * float(r["ci_level"]), ".1f") if r.get("ci_level") == r.get("ci_level") else "n/a"
        ci = "unbounded" if "n/a" in (lo, hi) else f"[{lo}, {hi}] ({level}%)"
        rows.append([f"``{r['candidate']}``", f"``{r['condition']}``", f"``{r['metric']}``", _num(r.get("hl_ratio")), ci,
                     str(r["verdict"])])
    return rows


def retry_rows(measurements: pd.DataFrame) -> list[list[str]]:
    """[round, arm, condition, attempt, retry, outcome] for every row measured by a retry.

    A retry is an engine-fault re-attempt of a measurement job (``attempt`` > 1: a row for each
    record of that visit) or a validation retry (``retry`` > 0, a partial visit: a row for each
    re-measured condition).
    """
    cols = measurements.columns
    attempt = pd.to_numeric(measurements["attempt"], errors="coerce") if "attempt" in cols else None
    retry = pd.to_numeric(measurements["retry"], errors="coerce") if "retry" in cols else None
    if attempt is None and retry is None:
        return []
    mask = pd.Series(False, index=measurements.index)
    if attempt is not None:
        mask |= attempt > 1
    if retry is not None:
        mask |= retry > 0
    df = measurements[mask].copy()
    df["_attempt"] = attempt[mask].fillna(1).astype(int) if attempt is not None else 1
    df["_retry"] = retry[mask].fillna(0).astype(int) if retry is not None else 0
    df["_order"] = df["condition"].map({c: i for i, c in enumerate(sorted(set(df["condition"]), key=parse_id))})
    df = df.sort_values(["round", "arm", "_retry", "_order"])

    def outcome(r) -> str:
        if bool(r["selected"]):
            return "used"
        reason = str(r["reason"]) if "reason" in df.columns and r["reason"] == r["reason"] else ""
        return reason if reason.startswith("superseded") else "excluded"

    return [[str(int(r["round"])), str(r["arm"]), str(r["condition"]), str(r["_attempt"]), str(r["_retry"]),
             outcome(r)] for _, r in df.iterrows()]


def _list_table(title: str, header: list[str], rows: list[list[str]], cls: str) -> str:
    out = [f".. list-table:: {title}", "   :header-rows: 1", f"   :class: {cls}", ""]
    for row in [header, *rows]:
        out.append(f"   * - {row[0]}")
        out += [f"     - {cell}" for cell in row[1:]]
    return "\n".join(out) + "\n"


def landing_rst(paired_csv: str | Path, measurements_csv: str | Path) -> str:
    # both read back against their schema (pairbench.table/v1): text lands on the report's first page
    paired = read_table(paired_csv, CATEGORICAL_FIELDS, required=("candidate", "condition", "metric", "verdict"))
    measurements = read_table(measurements_csv, CATEGORICAL_FIELDS, required=("round", "arm", "condition", "selected"))
    parts = []
    verdicts = verdict_rows(paired)
    if verdicts:
        parts.append(_list_table(
            "Verdicts: each candidate / baseline, Hodges-Lehmann estimate and its interval (level adjusted "
            "across every candidate's comparisons)",
            ["candidate", "condition", "metric", "ratio", "interval", "verdict"], verdicts, "pairbench-verdicts"))
    else:
        parts.append("**No verdicts**: no condition and metric had paired samples "
                     "(see tables/summary.csv and the excluded rows in stats/summary.json).\n")
    retries = retry_rows(measurements)
    if retries:
        parts.append(_list_table("Retries (attempt > 1: an engine fault failed the earlier attempts of the job; "
                                 "retry > 0: a validation retry re-measured the record)",
                                 ["round", "arm", "condition", "attempt", "retry", "outcome"], retries,
                                 "pairbench-retries"))
    else:
        parts.append("Retries: none (every visit succeeded at its first attempt and none needed a "
                     "validation retry).\n")
    return "\n".join(parts)


def write_landing(paired_csv: str | Path, measurements_csv: str | Path, out: str | Path) -> None:
    atomic_write_text(out, landing_rst(paired_csv, measurements_csv))
