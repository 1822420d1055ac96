"""The landing page of ``snakemake --report``: the verdict table and the retry disclosure, as RST.

Snakemake renders the workflow description (workflow/report/workflow.rst) on the report's first page
through docutils, which can ``.. include::`` a file but cannot compute anything. This module turns
``tables/paired.csv`` and ``tables/measurements.csv`` into a compact RST snippet
(``results/<label>/report/landing.rst``) that the description includes: one row per input length and
metric with the median paired ratio, its CI, the p-value and the verdict (the full-precision columns
stay in the Summary category), and every visit that needed more than one attempt.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pairbench.artifacts import atomic_write_text


def _num(x, spec: str = ".3f") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(x) else format(x, spec)


def verdict_rows(paired: pd.DataFrame) -> list[list[str]]:
    """[length, metric, median ratio, CI, p, verdict] per row of tables/paired.csv."""
    rows = []
    for _, r in paired.iterrows():
        lo, hi = _num(r.get("ci_low")), _num(r.get("ci_high"))
        ci = "n/a" if "n/a" in (lo, hi) else f"[{lo}, {hi}]"
        rows.append([str(int(r["length"])), f"``{r['metric']}``", _num(r.get("median_ratio")), ci,
                     _num(r.get("p_value"), ".3g"), str(r["verdict"])])
    return rows


def retry_rows(measurements: pd.DataFrame) -> list[list[str]]:
    """[round, arm, attempt] for every visit whose kept attempt is above 1."""
    if "attempt" not in measurements.columns:
        return []
    df = measurements[pd.to_numeric(measurements["attempt"], errors="coerce") > 1]
    df = df.drop_duplicates(subset=["round", "arm", "attempt"]).sort_values(["round", "arm"])
    return [[str(int(r["round"])), str(r["arm"]), str(int(r["attempt"]))] for _, r in df.iterrows()]


def _list_table(title: str, header: list[str], rows: list[list[str]], cls: str) -> str:
    out = [f".. list-table:: {title}", "   :header-rows: 1", f"   :class: {cls}", ""]
    for row in [header, *rows]:
        out.append(f"   * - {row[0]}")
        out += [f"     - {cell}" for cell in row[1:]]
    return "\n".join(out) + "\n"


def landing_rst(paired_csv: str | Path, measurements_csv: str | Path) -> str:
    paired = pd.read_csv(paired_csv)
    measurements = pd.read_csv(measurements_csv)
    parts = []
    verdicts = verdict_rows(paired)
    if verdicts:
        parts.append(_list_table(
            "Verdicts: candidate / baseline, median of the per-round paired ratios",
            ["length", "metric", "ratio", "CI", "p", "verdict"], verdicts, "pairbench-verdicts"))
    else:
        parts.append("**No verdicts**: no input length and metric had paired samples "
                     "(see tables/summary.csv and the excluded rows in stats/summary.json).\n")
    retries = retry_rows(measurements)
    if retries:
        parts.append(_list_table("Retried visits (an engine fault failed the earlier attempts)",
                                 ["round", "arm", "attempt"], retries, "pairbench-retries"))
    else:
        parts.append("Retried visits: none (every visit succeeded at its first attempt).\n")
    return "\n".join(parts)


def write_landing(paired_csv: str | Path, measurements_csv: str | Path, out: str | Path) -> None:
    atomic_write_text(out, landing_rst(paired_csv, measurements_csv))
