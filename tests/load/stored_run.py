"""A load run stored by pairbench before its level metrics moved into the statistics (measure/v3,
levelrun/v1), rewritten in today's shape (measure/v4) and recomputed: the proof that the move
changed no published number.

Before, a level record held the level's ``metrics`` and ``validity``, computed in the measure job,
and the private level body (``private/levels/<visit>-<condition>.json``) held per request its TTFT,
its inter-token gaps, e2e and lag in ms. Today a level record holds the raw times under ``client``
(per request: due, sent, end, and each token's arrival since its send) and the statistics compute
the metrics (:func:`pairbench.analysis.loadlevel.judged`). The old artifacts do not hold the token
arrivals, so they are rebuilt from the TTFT and the gaps (``arrival = TTFT, then + each gap``): the
one round trip through gaps left, which moves a figure by float rounding only (about 1e-13 of it).

Run on a stored run folder (the statistics written to *new*, never into *old*)::

    PYTHONPATH=workflow:. python3 -m tests.load.stored_run results/load-fake /tmp/load-fake-v4

It prints every figure of ``stats/summary.json`` and ``tables/*.csv`` that differs by more than
``1e-9`` relative, and every verdict that differs (exit status 1 if any does).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pandas as pd

from pairbench.core.artifacts import write_artifact
from pairbench.core.layout import Layout

REL = 1e-9  # a figure is unchanged within this relative difference (the gaps' round trip is ~1e-13)


def token_times(req: dict) -> list[float]:
    """A v1 request's token arrivals since its send, rebuilt from its TTFT and gaps (ms)."""
    if req["ttft_ms"] is None:  # a failed request: its gaps remain, its first token's time does not
        return []
    t = [req["ttft_ms"] / 1e3]
    for gap in req["itl_ms"]:
        t.append(t[-1] + gap / 1e3)
    return t


def client_block(level_v1: dict) -> dict:
    """The ``client`` block of a v4 level record, from a v1 private level body's ``level``."""
    return {"wall_s": level_v1["wall_s"], "cpu_s": level_v1["client_cpu_s"],
            "offered_rate_rps": level_v1["offered_rate_rps"],
            "requests": [{"index": r["index"], "warmup": r["warmup"], "stream": r["stream"],
                          "scheduled_s": r["scheduled_s"], "sent_s": r["sent_s"], "end_s": r["end_s"],
                          "token_s": token_times(r), "completion_tokens": r["completion_tokens"],
                          "error_kind": r["error_kind"], "error": r["error"]} for r in level_v1["records"]]}


def level_record_v4(rec: dict, level_v1: dict) -> dict:
    """A v3 level record as today's measurement writes it: the raw times instead of ``metrics`` and
    ``validity``; its flags and ``ok`` the gates' alone (the statistics add the validity again)."""
    judged_flags = set(rec["validity"]["messages"])
    flags = [f for f in rec["flags"] if f not in judged_flags and not f.startswith("validity idle:")]
    out = {k: v for k, v in rec.items() if k not in ("metrics", "validity")}
    return {**out, "client": client_block(level_v1), "flags": flags,
            "ok": all(g is not False for g in rec["gates"].values())}


def measure_v4(body: dict, levels: dict[str, dict]) -> dict:
    """A v3 measure body in v4's shape; *levels* maps a level's condition id to its v1 private body."""
    body = {k: v for k, v in body.items() if k != "schema"}
    body["records"] = [level_record_v4(r, levels[r["condition"]]["level"]) if r.get("kind") == "level" else r
                       for r in body["records"]]
    return body


def _level_bodies(res: Path, label: str) -> dict[str, dict]:
    """A visit's (or retry's) v1 private level bodies by condition id, read as plain JSON (their
    version is not today's)."""
    out = {}
    for p in sorted((res / "private" / "levels").glob(f"{label}-*.json")):
        body = json.loads(p.read_text())
        if body.get("visit") == label.split(".")[0]:
            out[body["condition"]] = body
    return out


def chain(res: Path, kind: str) -> list[Path]:
    """A run folder's *kind* (``measure``, ``validate``) artifacts in the order the pipeline hands
    them to the statistics: each visit in the plan's order, then its retries."""
    plan = json.loads((res / "plan.json").read_text())
    return [p for v in plan["visits"] for p in [res / kind / f"{v['id']}.json",
                                                *sorted((res / kind).glob(f"{v['id']}.retry*.json"))] if p.exists()]


def convert(old: Path, new: Path) -> list[Path]:
    """Copy the plan and validations of the run folder *old* into *new* and write its measure
    artifacts in v4's shape; returns the new measure paths (visits, then retries, as in *old*)."""
    shutil.rmtree(new, ignore_errors=True)
    (new / "measure").mkdir(parents=True)
    write_artifact(new / "plan.json", "plan", plan_today(json.loads((old / "plan.json").read_text())))
    shutil.copytree(old / "validate", new / "validate")
    paths = []
    for p in chain(old, "measure"):
        body = json.loads(p.read_text())
        if body["schema"] != "pairbench.measure/v3":
            raise ValueError(f"{p}: {body['schema']}, not a measure/v3 artifact")
        out = new / "measure" / p.name
        write_artifact(out, "measure", measure_v4(body, _level_bodies(old, p.stem)))
        paths.append(out)
    return paths


def plan_today(plan: dict) -> dict:
    """A stored plan in today's shape: plan/v4 named the load factor ``mode`` (v5: ``factor``)."""
    body = {k: v for k, v in plan.items() if k != "schema"}
    if body.get("load") and "mode" in body["load"]:
        body["load"] = {("factor" if k == "mode" else k): v for k, v in body["load"].items()}
    return body


def summary_today(summary: dict) -> dict:
    """A stored summary in today's shape (summary/v4: the load parameters' ``mode`` is ``factor``),
    without its ``schema`` and ``inputs`` (the converted artifacts' hashes)."""
    body = {k: v for k, v in summary.items() if k not in ("schema", "inputs")}
    load = body.get("params", {}).get("load")
    if load and "mode" in load:
        body["params"] = {**body["params"], "load": {("factor" if k == "mode" else k): v for k, v in load.items()}}
    return body


def recompute(old: Path, new: Path) -> None:
    """The statistics of the converted run, with the parameters its own summary recorded."""
    from pairbench.stages.analysis import StatsOptions, stats_stage

    prm = json.loads((old / "stats" / "summary.json").read_text())["params"]
    stats = {"metrics": prm["primary"], "secondary": prm["secondary"], "memory": prm["memory"],
             "multiplicity": prm["multiplicity"], "trim": prm["trim"], "alpha": prm["alpha"], "noise": prm["noise"]}
    measures = convert(old, new)
    for d in ("stats", "tables"):
        (new / d).mkdir(exist_ok=True)
    validations = [str(p) for p in chain(new, "validate")]
    stats_stage(Layout.of(new), StatsOptions.from_rule({"stats": stats}), measures=[str(p) for p in measures],
                validations=validations)


def differences(a, b, where: str = "") -> list[str]:
    """Every place two JSON values differ: a number by more than :data:`REL`, anything else at all."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        return out + [d for k in sorted(set(a) & set(b)) for d in differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and not isinstance(a, bool):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=REL, abs_tol=0.0)
        return [] if same else [f"{where}: {a!r} against {b!r}"]
    return [] if a == b else [f"{where}: {a!r} against {b!r}"]


def compare(old: Path, new: Path) -> list[str]:
    """The differences between the two runs' summaries (their ``inputs``, the converted artifacts'
    hashes, left out) and flat tables."""
    a, b = (summary_today(json.loads((r / "stats" / "summary.json").read_text())) for r in (old, new))
    out = differences(a, b, "summary")
    for csv in sorted((old / "tables").glob("*.csv")):
        x, y = pd.read_csv(csv), pd.read_csv(new / "tables" / csv.name)
        out += differences(json.loads(x.to_json(orient="records")), json.loads(y.to_json(orient="records")),
                           f"tables/{csv.name}")
    return out


def main(argv: list[str]) -> int:
    old, new = Path(argv[0]), Path(argv[1])
    recompute(old, new)
    diffs = compare(old, new)
    summary = json.loads((new / "stats" / "summary.json").read_text())
    verdicts = {(c, cond, m): p["verdict"] for c, pair in summary["comparisons"].items()
                for cond, ms in pair["paired"].items() for m, p in ms.items() if p.get("verdict")}
    print(f"{old} -> {new}: {len(verdicts)} verdicts recomputed from raw times; "
          f"{len(diffs)} difference(s) beyond {REL:g} relative")
    for d in diffs:
        print("  " + d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
