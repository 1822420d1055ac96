"""Facts about the run the report states, computed from the plan and the records (``summary.run``).

How many rounds were planned and run and why the run stopped, the repeats per visit, how many
records lack cold-cache proof and what became of them, the client-side cold-cache cross-check, the
load average and CPU pinning per visit. The report words these; it never asserts them on its own.
"""

from __future__ import annotations

import pandas as pd

from pairbench.analysis import coldcheck


def _rounds(plan: dict, measures: list[dict], adaptive: dict | None) -> dict:
    run = len({m["visit"]["round"] for m in measures})
    a = plan.get("adaptive")
    if not a:
        return {"adaptive": False, "planned": plan["rounds"], "run": run}
    out = {"adaptive": True, "planned": a["max"], "run": run, "min": a["min"], "max": a["max"],
           "block": a["block"], "target_halfwidth": a["target_halfwidth"]}
    out["stop_reason"] = (adaptive or {}).get("stop_reason") or (
        "stopped at the maximum" if run >= a["max"] else f"stopped after {run} rounds")
    if (adaptive or {}).get("budget"):  # the time budget and what it bought (pairbench.analysis.adaptive.report_facts)
        out["budget"] = adaptive["budget"]
    return out


def _load(measures: list[dict]) -> dict | None:
    hosts = [(m["visit"]["id"], m["host"]) for m in measures if m.get("host") and m.get("retry", 0) == 0]
    if not hosts:
        return None
    loads = [h["load1_start"] for _, h in hosts if h.get("load1_start") is not None]
    threshold = next((h["external_load_threshold"] for _, h in hosts if "external_load_threshold" in h), None)
    out = {"visits": len(hosts), "threshold": threshold,
           "flagged": [vid for vid, h in hosts if h.get("external_load")],
           "min": min(loads) if loads else None, "max": max(loads) if loads else None}
    quiet = [(vid, h["quiet"]) for vid, h in hosts if h.get("quiet")]
    if quiet:  # the quiet guard's waits, disclosed
        out["waits"] = {"waited": [vid for vid, q in quiet if q["waited_s"] > 0],
                        "waited_s": sum(q["waited_s"] for _, q in quiet),
                        "timed_out": [vid for vid, q in quiet if q["timed_out"]],
                        "max_wait_s": max((q["max_wait_s"] or 0) for _, q in quiet)}
    return out


def _pinning(measures: list[dict]) -> str | None:
    pins = {(tuple(m["host"].get("server_cpus") or ()), tuple(m["host"].get("client_cpus") or ()))
            for m in measures if m.get("host")}
    if not pins:
        return None
    if pins == {((), ())}:
        return "not pinned (server.pin is off, or fewer than two CPUs)"
    parts = [f"server on CPU(s) {','.join(map(str, s)) or 'any'}, client on CPU(s) {','.join(map(str, c)) or 'any'}"
             for s, c in sorted(pins)]
    return "; ".join(parts) + (" in every visit" if len(pins) == 1 else " (differed between visits)")


def run_facts(plan: dict, measures: list[dict], df: pd.DataFrame, gates: dict, adaptive: dict | None = None) -> dict:
    """The ``run`` block of ``stats/summary.json``."""
    superseded = df["reason"].astype("string").fillna("").str.startswith("superseded") if "reason" in df.columns \
        else pd.Series(False, index=df.index)
    current = df[~superseded]
    cold = current["cold_cache"] if "cold_cache" in current.columns else pd.Series(dtype=object)
    unproven = int(cold.isna().sum()) if len(cold) else 0
    facts = {
        "rounds": _rounds(plan, measures, adaptive),
        "repeats": int(plan.get("repeats", 1)),
        "cold_cache": {"records": int(len(current)), "unproven": unproven,
                       "allowed": bool(gates.get("allow_unproven_cold_cache")),
                       "cross_check": coldcheck.cross_check(current)},
    }
    load = _load(measures)
    if load:
        facts["load"] = load
    pin = _pinning(measures)
    if pin:
        facts["pinning"] = pin
    return facts
