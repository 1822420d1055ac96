"""Recompute every published verdict and number from the bundle's own measurements (``verify``).

A bundle holds ``tables/measurements.csv`` (one row per steady request, ``selected`` saying which
entered the statistics) and ``stats_params.json`` (the parameters the statistics used and the run
facts the report states). From those two alone :func:`recompute_problems` runs
:func:`pairbench.analysis.stats.summarize_all` again, every candidate in one multiplicity family as
the statistics stage ran it, and checks, cell by cell, that

- ``tables/paired.csv``, ``tables/summary.csv``, ``tables/ratios.csv`` and ``tables/memory.csv``
  hold the same numbers (relative tolerance 1e-9; CSV text round-trips floats exactly) and the same
  verdicts;
- the run facts that follow from the table (rounds run, records, unproven cold caches, the
  cold-cache cross-check) are the recorded ones;
- ``README.md`` contains the statistics section, regenerated from the recomputed summary, verbatim;
- ``gate.json``, when the bundle has one, is the decision its recorded policy gives over the
  recomputed summary (:func:`pairbench.publish.gate.gate_problems`): its decision, reason and every
  gated cell (its cost channel cells are judged again as recorded: ``stats/cost.json`` is not in the
  bundle, and :mod:`pairbench.publish.costcheck` recomputes it where the run folder is at hand).

Any difference is a problem naming the file, the row and the column: a published number or verdict
that the measurements do not give.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd

from pairbench.analysis import coldcheck, loadstats, stats as pb_stats, tables as pb_tables
from pairbench.analysis.measurements import StatsInputError, as_bool
from pairbench.core.artifacts import ArtifactError, validate
from pairbench.publish import gate as pb_gate
from pairbench.publish.load_section import load_section
from pairbench.publish.stats_section import statistics_section

PARAMS = "stats_params.json"
GATE = "gate.json"
TABLES = ("summary", "paired", "ratios", "memory")
LOAD_TABLES = ("capacity", "capacity_paired")  # a load run's (with an SLO)
KEYS = {"summary": ["candidate", "arm", "condition", "metric"], "paired": ["candidate", "condition", "metric"],
        "ratios": ["candidate", "condition", "metric", "round"], "memory": ["candidate", "condition", "metric"],
        "capacity": ["candidate", "condition", "round"], "capacity_paired": ["candidate", "condition"]}
REL_TOL = 1e-9


def _same(a, b) -> bool:
    a_missing = a is None or (isinstance(a, float) and math.isnan(a))
    b_missing = b is None or (isinstance(b, float) and math.isnan(b))
    if a_missing or b_missing:
        return a_missing and b_missing
    if isinstance(a, (bool,)) or isinstance(b, (bool,)) or isinstance(a, str) or isinstance(b, str):
        return str(a).lower() == str(b).lower()
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)


def _cell(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v.item() if hasattr(v, "item") else v


def table_problems(name: str, published: pd.DataFrame, recomputed: pd.DataFrame) -> list[str]:
    rel = f"tables/{name}.csv"
    keys = KEYS[name]
    problems = []
    if list(published.columns) != list(recomputed.columns):
        return [f"{rel}: columns {list(published.columns)} differ from the recomputed {list(recomputed.columns)}"]
    if len(published) != len(recomputed):
        return [f"{rel}: {len(published)} rows, the measurements give {len(recomputed)}"]
    pub = published.reset_index(drop=True)
    rec = recomputed.reset_index(drop=True)
    for i in range(len(rec)):
        where = ", ".join(f"{k} {_cell(rec.loc[i, k])}" for k in keys)
        for col in rec.columns:
            a, b = _cell(pub.loc[i, col]), _cell(rec.loc[i, col])
            if not _same(a, b):
                problems.append(f"{rel}: row {i + 2} ({where}): column {col!r} is {a!r}, the measurements give {b!r}")
                if len(problems) > 20:
                    return problems
    return problems


def recompute(root: Path) -> tuple[dict, dict]:
    """(recorded params, recomputed summary) from the bundle at *root*."""
    params = json.loads((root / PARAMS).read_text())
    validate("stats_params", params, where=PARAMS)
    df = pd.read_csv(root / "tables" / "measurements.csv")
    summary = pb_stats.summarize_all(df, baseline=params["baseline"], candidates=params["candidates"],
                                     metrics=params["metrics"], secondary=params["secondary"],
                                     memory=params["memory"], multiplicity=params["multiplicity"],
                                     trim=params["trim"], alpha=params["alpha"], noise=params["noise"],
                                     seed=params["seed"], load=params.get("load"))
    summary["run"] = params["run"]
    return params, summary


def run_problems(params: dict, df: pd.DataFrame) -> list[str]:
    """The recorded run facts that the measurements table can confirm."""
    run = params["run"]
    problems = []
    rounds = int(pd.to_numeric(df["round"]).nunique()) if len(df) else 0
    if run["rounds"]["run"] != rounds:
        problems.append(f"{PARAMS}: run.rounds.run is {run['rounds']['run']}, tables/measurements.csv has {rounds} rounds")
    superseded = df["reason"].astype("string").fillna("").str.startswith("superseded") if "reason" in df else False
    current = df[~superseded] if "reason" in df else df
    cc = run["cold_cache"]
    if cc["records"] != len(current):
        problems.append(f"{PARAMS}: run.cold_cache.records is {cc['records']}, the table has {len(current)}")
    if "cold_cache" in current.columns:
        unproven = int(current["cold_cache"].isna().sum())
        if cc["unproven"] != unproven:
            problems.append(f"{PARAMS}: run.cold_cache.unproven is {cc['unproven']}, the table has {unproven}")
        if not cc["allowed"]:
            sel = as_bool(current["selected"], "selected")
            bad = current[sel & current["cold_cache"].isna()]
            if len(bad):
                problems.append(f"tables/measurements.csv: {len(bad)} selected row(s) without cold-cache proof, "
                                "but the run did not opt in (gates.allow_unproven_cold_cache)")
    if cc["cross_check"] != coldcheck.cross_check(current):
        problems.append(f"{PARAMS}: run.cold_cache.cross_check differs from the one the measurements give")
    return problems


def recompute_problems(root: str | Path) -> list[str]:
    """Problems (empty = every published verdict and number recomputes). A bundle that publishes
    verdicts (``tables/paired.csv``) without ``stats_params.json`` is a problem, never a silent pass;
    one that publishes none (no paired table, no parameters) has nothing to recompute."""
    root = Path(root)
    if not (root / PARAMS).is_file():
        if (root / "tables" / "paired.csv").is_file():
            return [f"{PARAMS}: missing, so the published verdicts cannot be recomputed from tables/measurements.csv"]
        return []
    if not (root / "tables" / "measurements.csv").is_file():
        return ["tables/measurements.csv: missing, so the verdicts cannot be recomputed"]
    try:
        params, summary = recompute(root)
    except (ArtifactError, json.JSONDecodeError) as exc:
        return [f"{PARAMS}: {exc}"]
    except StatsInputError as exc:
        return [f"tables/measurements.csv: the statistics cannot be recomputed: {exc}"]
    problems = run_problems(params, pd.read_csv(root / "tables" / "measurements.csv"))
    flat = pb_tables.summary_tables(summary)
    names = TABLES
    if params.get("load"):
        flat.update(loadstats.capacity_tables(summary))
        names = (*TABLES, *LOAD_TABLES)
    for name in names:
        path = root / "tables" / f"{name}.csv"
        if not path.is_file():
            problems.append(f"tables/{name}.csv: missing from the bundle")
            continue
        recomputed = pd.read_csv(io.StringIO(flat[name].to_csv(index=False)))
        problems += table_problems(name, pd.read_csv(path), recomputed)
    readme = root / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    section = statistics_section(summary).rstrip()
    if section not in text:
        first = _first_difference(text, section)
        problems.append(f"README.md: its statistics section is not the one the measurements give ({first})")
    load = load_section(summary).rstrip()
    if load and load not in text:
        first = _first_difference(text, load, heading="## Load")
        problems.append(f"README.md: its load section is not the one the measurements give ({first})")
    gate = root / GATE
    if gate.is_file():
        problems += pb_gate.gate_problems(json.loads(gate.read_text()), summary)
    return problems


def _first_difference(text: str, section: str, heading: str = "## Statistics") -> str:
    start = text.find(heading)
    if start < 0:
        return f"no '{heading}' section"
    got = text[start:].splitlines()
    for i, want in enumerate(section.splitlines()):
        if i >= len(got) or got[i] != want:
            return f"line {i + 1} of the section: published {got[i] if i < len(got) else '<end>'!r}, recomputed {want!r}"
    return "it differs after the section"
