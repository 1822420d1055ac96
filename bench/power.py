#!/usr/bin/env python3
"""Power of the default run: does it call a known, injected decode slowdown, and nothing on A/A?

Not a test: it runs the real pipeline (``snakemake --cores 1``) with the default config
(config/config.yaml, or ``--config``) whose candidate arm is replaced by the stock engine plus
``bench/patches/decode-slowdown.patch``, which spins every decode step for a fixed fraction of its
own time: with ``PAIRBENCH_DECODE_SLOWDOWN = s`` decode tok/s falls by exactly the fraction s
(the spin is proportional, so the effect is the same ratio whatever the machine's speed). Effect 0
runs identical arms (no patch: A/A). Each effect × replicate is its own run label
(``results/power-<pct>-r<k>/``).

Per effect it reports, over the replicates: how often decode_tok_s was called **slower** at every
length and at each (the detection rate), the error of the estimate against the injected effect
(mean, RMS and largest), both nominal (1 − s) and as the engine's own timings measured it (the
median ratio of ``engine_decode_tok_s`` over the selected pairs), false claims and their rate (any
faster/slower of a primary metric on A/A, or a **faster** decode when slowed), the half-widths,
each run's rounds, what stopped them (target, max or the time budget) and their minutes, the wall
time and the load averages.

    python3 bench/power.py [--effects 0 0.03 0.05 0.10] [--replicates 1] [--config config/config.yaml]
        [--json out.json] [--keep]

A run takes as long as the default run (≤ 10 minutes on the project's 2-core machine, its rounds
limited by ``rounds.max_minutes``), so ``--replicates 3`` over four effects is about two hours of a
machine left alone; figures from this machine are in docs/statistics.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))
from pairbench.core.conditions import parse_id
from pairbench.core.artifacts import read_artifact  # noqa: E402

PATCH = "bench/patches/decode-slowdown.patch"


def config_for(base: dict, effect: float, replicate: int) -> dict:
    cfg = json.loads(json.dumps(base))
    label = f"power-{round(effect * 100):02d}-r{replicate}"
    stock = {k: v for k, v in cfg["arms"][next(iter(cfg["arms"]))].items() if k not in ("patches", "env")}
    arms = {"baseline": {**stock, "patches": []}, "candidate": {**stock, "patches": [PATCH] if effect else []}}
    if effect:
        arms["candidate"]["env"] = {"PAIRBENCH_DECODE_SLOWDOWN": f"{effect:g}"}
    cfg.update(label=label, arms=arms, baseline="baseline", candidate="candidate",
               seed=int(cfg.get("seed", 0)) + replicate)
    cfg.setdefault("validate", {})["agreement"] = 1.0  # a spin changes no token
    return cfg


def run_one(cfg: dict, keep: bool) -> dict:
    label = cfg["label"]
    path = ROOT / "results" / f"{label}.config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", str(path)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{label}: snakemake failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = ROOT / "results" / label
    run = read_artifact(res / "stats" / "summary.json", "summary")
    summary = {**run["comparisons"]["candidate"], "run": run["run"]}
    df = pd.read_csv(res / "tables" / "measurements.csv")
    out = {"label": label, "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()[0],
           "visit_load": summary["run"].get("load"), "rounds": summary["run"]["rounds"], "conditions": {}}
    sel = df[df["selected"]]
    for cond, by in summary["paired"].items():
        p = by.get("decode_tok_s")
        if p is None:
            continue
        eng = sel[sel["condition"] == cond].pivot_table(index="round", columns="arm",
                                                         values="engine_decode_tok_s", aggfunc="median")
        engine_ratio = float((eng["candidate"] / eng["baseline"]).median()) if len(eng.columns) == 2 else None
        out["conditions"][cond] = {"verdict": p["verdict"], "hl_ratio": p["hl_ratio"], "ci_low": p["ci_low"],
                                  "ci_high": p["ci_high"], "half_width": p["half_width"], "ci_level": p["ci_level"],
                                  "engine_ratio": engine_ratio, "n_pairs": p["n_pairs"]}
    out["claims"] = sorted({(m, p["verdict"]) for by in summary["paired"].values() for m, p in by.items()
                            if p["role"] == "primary" and p["verdict"] in ("faster", "slower")})
    if not keep:
        shutil.rmtree(res / "src", ignore_errors=True)  # the exported trees are the bulk
    return out


def summarise(effect: float, runs: list[dict]) -> dict:
    """Over the replicates of one effect: the detection rate (decode_tok_s called **slower** at every
    condition, and per condition), the estimates' error against the injected effect (mean, RMS and largest,
    in percentage points of the ratio; also against the engine's own timings), the false claims
    (A/A: any faster/slower of a primary metric; slowed: a faster decode) and their rate, and each
    run's rounds, what stopped it, its minutes and wall time."""
    conds = sorted({c for r in runs for c in r["conditions"]}, key=parse_id)
    detected = sum(all(r["conditions"][c]["verdict"] == "slower" for c in conds) for r in runs)
    errs, eng_errs, halves = [], [], []
    for r in runs:
        for c in conds:
            x = r["conditions"][c]
            errs.append(x["hl_ratio"] - (1 - effect))
            if x["engine_ratio"] is not None:
                eng_errs.append(x["hl_ratio"] - x["engine_ratio"])
            halves.append(x["half_width"])
    false = sum(bool(r["claims"]) if effect == 0 else any(m == "decode_tok_s" and v == "faster" for m, v in r["claims"])
                for r in runs)
    budget = [r["rounds"].get("budget") or {} for r in runs]
    return {"effect": effect, "replicates": len(runs),
            "detection_rate": None if effect == 0 else detected / len(runs),
            "detected_per_condition": None if effect == 0 else
            {c: sum(r["conditions"][c]["verdict"] == "slower" for r in runs) / len(runs) for c in conds},
            "mean_error_pp": 100 * sum(errs) / len(errs),
            "rms_error_pp": 100 * (sum(e * e for e in errs) / len(errs)) ** 0.5,
            "max_abs_error_pp": 100 * max(abs(e) for e in errs),
            "max_abs_error_vs_engine_pp": 100 * max(abs(e) for e in eng_errs) if eng_errs else None,
            "half_widths_pct": [None if h is None else round(100 * h, 2) for h in halves],
            "false_claims": false, "false_claim_rate": false / len(runs),
            "rounds": [r["rounds"]["run"] for r in runs], "stopped_by": [b.get("stopped_by") for b in budget],
            "rounds_minutes": [None if b.get("used_minutes") is None else round(b["used_minutes"], 1) for b in budget],
            "wall_s": [round(r["wall_s"]) for r in runs],
            "load": [(round(r["load_before"], 2), round(r["load_after"], 2)) for r in runs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--effects", type=float, nargs="+", default=[0.0, 0.03, 0.05, 0.10])
    ap.add_argument("--replicates", type=int, default=1)
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--keep", action="store_true", help="keep each run's exported source trees")
    args = ap.parse_args(argv)
    base = yaml.safe_load(Path(args.config).read_text())
    report, rows = {}, []
    for effect in args.effects:
        runs = []
        for k in range(1, args.replicates + 1):
            cfg = config_for(base, effect, k)
            print(f"[power] {cfg['label']}: running (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
            runs.append(run_one(cfg, args.keep))
            print(f"[power] {cfg['label']}: {json.dumps(runs[-1]['conditions'])} in {runs[-1]['wall_s']:.0f} s",
                  file=sys.stderr)
        report[f"{effect:g}"] = runs
        rows.append(summarise(effect, runs))
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 80)
    print(pd.DataFrame(rows).to_string(index=False))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": rows, "runs": report}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
