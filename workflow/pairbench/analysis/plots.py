"""PNG plots for the report bundle: paired ratios with their CI band, and per-arm drift by round,
one panel per condition (its id in the title; the report names what each id means).

Both take the same inputs as the statistics (``stats/summary.json`` body, ``tables/measurements.csv``
as a DataFrame) and write one PNG each with matplotlib's Agg backend (no display needed), via a
temporary file and ``os.replace`` so a killed job never leaves half an image.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pairbench.analysis.loadstats import curves  # noqa: E402
from pairbench.analysis.measurements import StatsInputError, as_bool, condition_order  # noqa: E402
from pairbench.core.metrics import METRICS  # noqa: E402

CANDIDATE_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
ARM_STYLES = ("o-", "s--", "^-.", "d:")


def _save(fig: plt.Figure, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)  # tight_layout already ran: no second "tight" pass
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def _empty(path: str | os.PathLike, title: str, why: str) -> None:
    """A figure that says there is nothing to draw, and why (a run with no selected record still
    gets its report, which says the same)."""
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.set_axis_off()
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=10, wrap=True)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    _save(fig, path)


def plot_ratios(summary: dict, path: str | os.PathLike) -> None:
    """One panel per condition × metric, every candidate side by side (one colour and x offset each):
    its per-round ratios candidate/baseline and, right of the rounds, its Hodges–Lehmann estimate
    with the interval at the level it was judged at; the ±noise band around 1; the verdicts in the title."""
    cands = list(summary.get("candidates") or [])
    pairs = {c: summary["comparisons"][c] for c in cands}
    first = pairs[cands[0]] if cands else {}
    # a condition with no pair of any candidate (every record excluded) has nothing to draw
    conds = [c for c in summary.get("conditions") or [] if c["id"] in (first.get("paired") or {})
             and any(p.get("n_pairs") for cand in pairs.values()
                     for p in (cand.get("paired") or {}).get(c["id"], {}).values())]
    metrics = [m for m, v in (first.get("metrics") or {}).items() if v.get("role") != "memory"]
    if not cands or not metrics:
        raise StatsInputError("summary has no candidates or metrics to plot")
    title = f"Paired ratios against {summary['baseline']}, by round: {', '.join(cands)}"
    if not conds:
        _empty(path, title, "No condition had a selected record of both arms: nothing to pair.")
        return
    noise = summary["params"]["noise"]
    colours = {c: CANDIDATE_COLOURS[i % len(CANDIDATE_COLOURS)] for i, c in enumerate(cands)}
    width = 0.6 / len(cands)
    offsets = {c: (i - (len(cands) - 1) / 2) * width for i, c in enumerate(cands)}
    fig, axes = plt.subplots(len(metrics), len(conds), squeeze=False, sharex=True,
                             figsize=(3.6 * len(conds) + 0.6, 2.5 * len(metrics) + 1.0))
    for col, cond in enumerate(conds):
        for row, metric in enumerate(metrics):
            ax = axes[row][col]
            cells = {c: pairs[c]["paired"].get(cond["id"], {}).get(metric) for c in cands}
            cells = {c: p for c, p in cells.items() if p is not None}
            if not cells:
                ax.set_axis_off()
                continue
            ax.axhspan(1 - noise, 1 + noise, color="0.88", lw=0, label=f"1 ± noise ({noise:g})")
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
            last = max((q["round"] for p in cells.values() for q in p["pairs"]), default=0)
            for cand, p in cells.items():
                valid = [q for q in p["pairs"] if q["valid"]]
                ax.plot([q["round"] + offsets[cand] for q in valid], [q["ratio"] for q in valid], "o",
                        color=colours[cand], ms=3.5, label=f"{cand}: per-round ratio")
                if p["hl_ratio"] is not None:
                    lo = p["hl_ratio"] - p["ci_low"] if p["ci_low"] is not None else 0.0
                    hi = p["ci_high"] - p["hl_ratio"] if p["ci_high"] is not None else 0.0
                    ax.errorbar([last + 1.5 + offsets[cand]], [p["hl_ratio"]], yerr=[[lo], [hi]], fmt="D",
                                color=colours[cand], ms=5, capsize=3, label=f"{cand}: HL estimate, interval")
            ax.grid(axis="y", alpha=0.3)
            better = "higher" if next(iter(cells.values()))["higher_is_better"] else "lower"
            verdicts = "; ".join(f"{c} {p['verdict'] or 'not tested'}" for c, p in cells.items())
            ax.set_title(f"{metric} @ {cond['id']}: {verdicts}", fontsize=8)
            if col == 0:
                ax.set_ylabel(f"candidate / baseline\n({better} is faster)", fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("round (right: estimate and interval)", fontsize=8)
            ax.tick_params(labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    _save(fig, path)


def plot_drift(df: pd.DataFrame, path: str | os.PathLike, metrics: tuple[str, ...]) -> None:
    """Per arm, each of *metrics* (the run's primary metrics) by round (one panel per metric ×
    condition), to show drift over the run.

    Selected samples are drawn as connected markers; excluded rows as grey crosses, so a gate
    failure or retry shows where it happened.
    """
    missing = [c for c in ("round", "arm", "condition", *metrics) if c not in df.columns]
    if missing:
        raise StatsInputError(f"measurements table lacks column(s) for the drift plot: {', '.join(missing)}")
    if df.empty:
        raise StatsInputError("measurements table is empty: nothing to plot")
    df = df.copy()
    df["selected"] = as_bool(df["selected"], "selected") if "selected" in df.columns else True
    conds = condition_order(df["condition"].astype(str).unique())
    arms = list(dict.fromkeys(df["arm"].astype(str)))
    fig, axes = plt.subplots(len(metrics), len(conds), squeeze=False, sharex=True,
                             figsize=(3.6 * len(conds) + 0.6, 2.6 * len(metrics) + 0.8))
    for col, cond in enumerate(conds):
        for row, metric in enumerate(metrics):
            ax = axes[row][col]
            for i, arm in enumerate(arms):
                cell = df[(df["arm"].astype(str) == arm) & (df["condition"] == cond)].sort_values("round")
                sel = cell[cell["selected"]]
                ax.plot(sel["round"], sel[metric], ARM_STYLES[i % len(ARM_STYLES)], ms=4, lw=1,
                        color=f"C{i}", label=arm)
                exc = cell[~cell["selected"]]
                if not exc.empty:
                    ax.plot(exc["round"], exc[metric], "x", color="0.5", ms=6,
                            label="excluded" if i == 0 else None)
            ax.grid(alpha=0.3)
            unit = METRICS[metric].unit if metric in METRICS else ""
            ax.set_title(f"{metric} @ {cond}", fontsize=9)
            if col == 0:
                ax.set_ylabel(f"{metric} ({unit})" if unit else metric, fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
            rounds = np.sort(df["round"].unique())
            if len(rounds) <= 20:
                ax.set_xticks(rounds)
    handles = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle("Drift: each arm by round", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, path)


def plot_load(summary: dict, df: pd.DataFrame, path: str | os.PathLike) -> None:
    """A load run's curves: per curve (the conditions that differ only in their load) and primary
    metric, each arm's value against the load, the median over rounds with the range (min to max)
    as error bars; only selected (valid) levels, so a client-bound level is never drawn as the
    engine's. The capacity verdict per candidate is in the title when the run has an SLO."""
    metrics = tuple(summary["params"]["primary"])
    df = df.copy()
    df["selected"] = as_bool(df["selected"], "selected")
    groups = curves(condition_order(df["condition"].astype(str).unique()))
    factor = (summary.get("load") or {}).get("factor", "concurrency")
    arms = [summary["baseline"], *summary["candidates"]]
    title = f"Load curves: {', '.join(arms)}"
    if not groups:
        _empty(path, title, "No load level in the measurements: nothing to draw.")
        return
    cap = ((summary.get("load") or {}).get("capacity") or {}).get("comparisons", {})
    fig, axes = plt.subplots(len(metrics), len(groups), squeeze=False,
                             figsize=(4.2 * len(groups) + 0.6, 2.8 * len(metrics) + 1.0))
    for col, (group, levels) in enumerate(groups.items()):
        load = {c: x for x, c in levels}
        for row, metric in enumerate(metrics):
            ax = axes[row][col]
            for i, arm in enumerate(arms):
                cell = df[(df["arm"].astype(str) == arm) & df["condition"].isin(list(load)) & df["selected"]]
                pts = []
                for cid, g in cell.groupby("condition"):
                    v = pd.to_numeric(g[metric], errors="coerce").dropna()
                    if len(v):
                        pts.append((load[cid], float(v.median()), float(v.min()), float(v.max())))
                pts.sort()
                if not pts:
                    continue
                x, med, lo, hi = (np.array(c) for c in zip(*pts))
                ax.errorbar(x, med, yerr=[med - lo, hi - med], fmt=ARM_STYLES[i % len(ARM_STYLES)], ms=4,
                            lw=1, capsize=3, color=f"C{i}", label=arm)
            xs = [x for x, _ in levels]
            if len(xs) > 1 and xs[-1] / xs[0] >= 4:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs], fontsize=7)
            ax.grid(alpha=0.3)
            words = "; ".join(f"{c}: capacity {cap[c][group]['verdict']}" for c in cap if group in cap[c])
            ax.set_title(f"{metric} @ {group}" + (f"\n{words}" if words and row == 0 else ""), fontsize=8)
            ax.set_ylabel(f"{metric} ({METRICS[metric].unit})", fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("streams" if factor == "concurrency" else "requests/s", fontsize=8)
            ax.tick_params(labelsize=7)
    handles = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=max(1, len(handles)), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title + " (median and range over rounds, valid levels only)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _save(fig, path)
