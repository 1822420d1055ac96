#!/usr/bin/env python3
"""The rows of docs/reproductions.md from finished reproduction runs (issue 36).

Not a test: reads each run's ``results/<label>/`` (``stats/summary.json``, ``stats/crosscheck.json``,
``plan.json``, the visits' ``measure/*.json``) and prints, per primary metric and condition, the
verdict, the Hodges-Lehmann ratio with its (Holm-adjusted) interval, the interval's half-width on
the log scale (the smallest change the run could have detected as a percentage: exp(half-width) - 1),
the pairs, llama-bench's ratio and the two agreement columns, and the candidate's exercise status; then
the visits' 1-minute load averages and wall time from first to last visit.

    python3 bench/reproductions_table.py results/repro-nop-barriers results/repro-nop-barriers-run2 ...
        [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
from pathlib import Path


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def visits(run: Path) -> dict:
    loads, times = [], []
    for p in sorted(glob.glob(str(run / "measure" / "r*-*.json"))):
        if ".retry" in p:
            continue
        m = json.loads(Path(p).read_text())
        h = m.get("host") or {}
        loads += [x for x in (h.get("load1_start"), h.get("load1_end")) if x is not None]
        times += [x for x in (m.get("started_unix"), m.get("ended_unix")) if x is not None]
    return {"visits": len(glob.glob(str(run / "measure" / "r*-*.json"))),
            "load1_min": min(loads) if loads else None, "load1_max": max(loads) if loads else None,
            "visits_span_s": max(times) - min(times) if len(times) > 1 else None}


def rows(run: Path) -> list[dict]:
    summary = load(run / "stats" / "summary.json")
    if summary is None:
        raise SystemExit(f"{run}: no stats/summary.json")
    cross = load(run / "stats" / "crosscheck.json") or {"rows": [], "exercise": None}
    cand = summary["candidates"][0]
    pair = summary["comparisons"][cand]
    out = []
    for cond in pair["conditions"]:
        for metric, cell in pair["paired"][cond["id"]].items():
            if cell.get("role") != "primary":
                continue
            lhw = cell.get("log_half_width")
            x = next((r for r in cross["rows"] if r["condition"] == cond["id"] and r["metric"] == metric), None)
            out.append({
                "run": run.name, "condition": cond["id"], "metric": metric, "verdict": cell["verdict"],
                "ratio": cell["hl_ratio"], "ci_low": cell["ci_low"], "ci_high": cell["ci_high"],
                "ci_level": cell.get("ci_level"), "pairs": cell["n_pairs"],
                "detectable": math.exp(lhw) - 1 if lhw is not None else None,
                "detectable_change": cell.get("detectable_change"),
                "tool_ratio": x["tool_ratio"] if x else None, "direction": x["direction"] if x else None,
                "size": x["size"] if x else None, "exercise": (cross.get("exercise") or {}).get("status"),
                **visits(run)})
    return out


def fmt(r: dict) -> str:
    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)
    ci = f"[{f(r['ci_low'])}, {f(r['ci_high'])}]"
    det = "–" if r["detectable"] is None else f"±{r['detectable'] * 100:.1f}%"
    return (f"| {r['run']} | `{r['condition']}` | `{r['metric']}` | **{r['verdict']}** {f(r['ratio'])} {ci} "
            f"| {r['pairs']} | {det} | {f(r['tool_ratio'])} | {r['direction'] or '–'} / {r['size'] or '–'} "
            f"| {r['exercise'] or '–'} | {f(r['load1_min'], '.2f')}-{f(r['load1_max'], '.2f')} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    allrows = [r for run in a.runs for r in rows(Path(run))]
    print("| run | condition | metric | verdict, ratio [interval] | pairs | detectable | llama-bench | "
          "direction / size | exercise | load1 |")
    print("|---|---|---|---|---:|---:|---:|---|---|---|")
    for r in allrows:
        print(fmt(r))
    if a.json:
        Path(a.json).write_text(json.dumps(allrows, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
