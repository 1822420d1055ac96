#!/usr/bin/env python3
"""Harness self-benchmark: how precise is pairbench on this machine? (issue 4, item 9)

A script, not a test: it prints figures for the closing note, from a ``tables/measurements.csv``
of a real run (best: an A/A run, both arms identical):

1. the A/A 95% half-width of the paired ratio's Hodges-Lehmann interval at the run's rounds, per
   condition and metric, in percent: (ci_high - ci_low) / 2, each comparison on its own (no Holm). With
   an A/A run no verdict may read faster or slower;
2. the client-vs-engine disagreement on decode (and prefill) tok/s: the median over selected rows of
   |client / engine - 1|, per arm and condition and overall (target <= 1%).

    python3 bench/harness_selfbench.py results/<label>/tables/measurements.csv [--baseline A --candidate B]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))
from pairbench.analysis.measurements import as_bool
from pairbench.analysis import stats  # noqa: E402

TARGET = 0.01


def aa_half_widths(df: pd.DataFrame, baseline: str, candidate: str, metrics: list[str],
                   rounds: int | None, seed: int) -> pd.DataFrame:
    if rounds is not None:
        df = df[df["round"] <= rounds]
    primary = [m for m in metrics if m in ("decode_tok_s", "prefill_tok_s", "e2e_ms")]
    secondary = [m for m in metrics if m not in primary]
    # one comparison at a time (no multiplicity): the smallest effect a single question could resolve
    s = stats.summarize(df, baseline=baseline, candidate=candidate, metrics=primary, secondary=secondary,
                        memory=[], multiplicity="none", seed=seed)
    rows = []
    for cond, by in s["paired"].items():
        for metric, p in by.items():
            half = None if p["ci_low"] is None else (p["ci_high"] - p["ci_low"]) / 2 * 100
            rows.append({"condition": cond, "metric": metric, "n_pairs": p["n_pairs"],
                         "hl_ratio": p["hl_ratio"], "ci_low": p["ci_low"], "ci_high": p["ci_high"],
                         "ci_half_width_pct": half, "verdict": p["verdict"]})
    return pd.DataFrame(rows)


def client_engine(df: pd.DataFrame, kind: str) -> pd.DataFrame | None:
    client, engine = f"{kind}_tok_s", f"engine_{kind}_tok_s"
    if engine not in df.columns or client not in df.columns:
        return None
    sel = df[as_bool(df["selected"], "selected")].copy()
    sel = sel[np.isfinite(sel[client]) & np.isfinite(sel[engine]) & (sel[engine] > 0)]
    if sel.empty:
        return None
    sel["dev"] = (sel[client] / sel[engine] - 1).abs()
    sel["signed"] = sel[client] / sel[engine] - 1
    out = sel.groupby(["arm", "condition"]).agg(n=("dev", "size"), median_abs_dev=("dev", "median"),
                                            median_signed=("signed", "median")).reset_index()
    overall = pd.DataFrame([{"arm": "(all)", "condition": "(all)", "n": len(sel),
                             "median_abs_dev": sel["dev"].median(),
                             "median_signed": sel["signed"].median()}])
    return pd.concat([out, overall], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measurements", type=Path, help="tables/measurements.csv of a run")
    ap.add_argument("--baseline", help="baseline arm (default: the first arm in the file)")
    ap.add_argument("--candidate", help="candidate arm (default: the second arm in the file)")
    ap.add_argument("--rounds", type=int, default=None, help="use only rounds 1..N (default: all)")
    ap.add_argument("--metrics", default="decode_tok_s,prefill_tok_s,ttft_ms,e2e_ms")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    df = pd.read_csv(args.measurements)
    arms = list(dict.fromkeys(df["arm"].astype(str)))
    baseline = args.baseline or arms[0]
    candidate = args.candidate or (arms[1] if len(arms) > 1 else None)
    if candidate is None:
        ap.error(f"{args.measurements} holds one arm ({baseline}); an A/A run needs two")
    pd.set_option("display.width", 160)

    rounds = df["round"].nunique() if args.rounds is None else args.rounds
    print(f"# A/A half-width: {candidate} / {baseline}, {rounds} rounds, file {args.measurements.name}")
    hw = aa_half_widths(df, baseline, candidate, args.metrics.split(","), args.rounds, args.seed)
    print(hw.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    finite = hw["ci_half_width_pct"].dropna()
    if not finite.empty:
        print(f"median half-width: {finite.median():.2f}% (range {finite.min():.2f}%..{finite.max():.2f}%)")
    claims = hw[hw["verdict"].isin(["faster", "slower"])]
    print(f"verdicts: {hw['verdict'].value_counts().to_dict()}"
          + ("  <- an A/A run should claim no difference" if not claims.empty else ""))

    for kind in ("decode", "prefill"):
        print()
        table = client_engine(df, kind)
        if table is None:
            print(f"# client vs engine {kind} tok/s: no engine timings in this file")
            continue
        print(f"# client vs engine {kind} tok/s: median |client/engine - 1| (target <= {TARGET:.0%})")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        overall = float(table.iloc[-1]["median_abs_dev"])
        print(f"overall: {overall * 100:.2f}% {'(within target)' if overall <= TARGET else '(OVER target)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
