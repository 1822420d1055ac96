"""Stage 6: the measurements table, the statistics and their flat tables, and the plots."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pandas as pd

from pairbench.core import naming
from pairbench.analysis import cost as pb_cost
from pairbench.analysis import crosscheck as pb_crosscheck
from pairbench.analysis import adaptive as pb_adaptive
from pairbench.analysis import loadstats as pb_loadstats
from pairbench.analysis.loadlevel import judged
from pairbench.analysis import plots as pb_plots
from pairbench.analysis import runfacts as pb_runfacts
from pairbench.analysis import stats as pb_stats
from pairbench.analysis import tables as pb_tables
from pairbench.core.artifacts import atomic_write_text, read_artifact, sha256_file, write_artifact
from pairbench.core.layout import Layout


def read_validations(paths: list[str]) -> dict[tuple[str, int], dict]:
    """Validate artifacts by (visit id, retry), in *paths* order."""
    out = {}
    for p in paths:
        v = read_artifact(p, "validate")
        out[naming.validation_key(v)] = v
    return out


@dataclass(frozen=True)
class StatsOptions:
    """What the statistics stage reads of the config: its ``stats`` section and the gate the
    statistics decide (``gates.allow_unproven_cold_cache``). The stats rule passes
    ``options={"stats": ..., "gates": ...}`` (:meth:`from_rule`)."""

    metrics: tuple[str, ...]
    secondary: tuple[str, ...]
    memory: tuple[str, ...]
    multiplicity: str
    trim: int | None
    alpha: float
    noise: float
    allow_unproven_cold_cache: bool = False

    @classmethod
    def from_rule(cls, params: dict) -> "StatsOptions":
        stats, gates = params["stats"], params.get("gates") or {}
        return cls(metrics=tuple(stats["metrics"]), secondary=tuple(stats["secondary"]), memory=tuple(stats["memory"]),
                   multiplicity=stats["multiplicity"], trim=stats["trim"], alpha=stats["alpha"], noise=stats["noise"],
                   allow_unproven_cold_cache=bool(gates.get("allow_unproven_cold_cache", False)))

    def summarize_kwargs(self) -> dict:
        """The keyword arguments of :func:`pairbench.analysis.stats.summarize_all` (the bundle records
        them in stats_params.json, and ``verify`` recomputes with them)."""
        return {"metrics": list(self.metrics), "secondary": list(self.secondary), "memory": list(self.memory),
                "multiplicity": self.multiplicity, "trim": self.trim, "alpha": self.alpha, "noise": self.noise}


def load_params(plan: dict) -> dict | None:
    """What the statistics need of a load run's plan (the bundle's stats_params.json records it):
    its load factor (closed or open loop), the SLO, the prompts' prefix. None for a single-stream run."""
    load = plan.get("load")
    return {k: load[k] for k in ("factor", "slo", "prefix")} if load else None


def stats_stage(layout: Layout, options: StatsOptions, *, measures: list[str], validations: list[str],
                adapt: list[str] = ()) -> None:
    """measurements.csv from the visits (*measures*, *validations*: the chain the run used, retries
    included) and their verdicts, then the summary and its flat tables (a load run's capacity tables
    too), each where *layout* says; *adapt* are the adaptive decisions the run consulted.

    The summary is computed from measurements.csv *as written* (read back), so that ``python -m
    pairbench verify`` recomputes exactly the published numbers from the bundle's copy of it.
    """
    plan_body = read_artifact(layout.plan, "plan")
    measure_bodies = [judged(read_artifact(p, "measure"), plan_body) for p in measures]  # load levels: metrics
    validation_bodies = read_validations(validations)
    df = pb_tables.measurements_frame(measure_bodies, validation_bodies,
                                      allow_unproven_cold_cache=options.allow_unproven_cold_cache)
    atomic_write_text(layout.table("measurements"), df.to_csv(index=False))
    df = pd.read_csv(layout.table("measurements"))
    body = pb_stats.summarize_all(df, baseline=plan_body["baseline"], candidates=plan_body["candidates"],
                                  seed=plan_body["seed"], load=load_params(plan_body), **options.summarize_kwargs())
    decisions = [read_artifact(p, "adapt") for p in adapt]
    gates = {"allow_unproven_cold_cache": options.allow_unproven_cold_cache}
    body["run"] = pb_runfacts.run_facts(plan_body, measure_bodies, df, gates, adaptive=stop_facts(plan_body, decisions))
    body["inputs"] = {"plan": sha256_file(layout.plan), **{f"adapt.r{d['rounds']:02d}": sha256_file(p)
                                                           for d, p in zip(decisions, adapt)},
                      **{f"measure.{naming.label(*naming.measure_key(m))}": sha256_file(p)
                         for m, p in zip(measure_bodies, measures)},
                      **{f"validate.{naming.label(*key)}": sha256_file(p)
                         for key, p in zip(validation_bodies, validations)}}
    write_artifact(layout.summary, "summary", body)
    tables = {**pb_tables.summary_tables(body), "timing_agreement": pb_tables.timing_agreement(df)}
    if plan_body.get("load"):
        tables.update(pb_loadstats.capacity_tables(body))
    for name, table in tables.items():
        atomic_write_text(layout.table(name), table.to_csv(index=False))


def stop_facts(plan: dict, decisions: list[dict]) -> dict | None:
    """Why an adaptive run stopped, from the decisions it consulted (None for fixed rounds)."""
    a = plan.get("adaptive")
    if not a:
        return None
    if decisions and decisions[-1]["decision"] == "stop":
        return {"stop_reason": decisions[-1]["reason"], "budget": pb_adaptive.report_facts(decisions[-1])}
    if not decisions:
        return {"stop_reason": f"rounds.min equals rounds.max ({a['max']}): nothing to decide"}
    return {"stop_reason": f"stopped at the maximum of {a['max']} rounds; the last decision: {decisions[-1]['reason']}"}


def adapt_stage(*, adapt: str, plan: str, measures: list[str], validations: list[str], stats: dict,
                gates: dict | None = None, max_minutes: float | None = None) -> None:
    """Whether to measure another block of rounds (pairbench.analysis.adaptive), from each visit's own
    measurement and validation so far, within the rounds' time budget *max_minutes* (a parameter,
    not part of the plan)."""
    gates = {"allow_unproven_cold_cache": False, **(gates or {})}
    plan_body = read_artifact(plan, "plan")
    measure_bodies = [judged(read_artifact(p, "measure"), plan_body) for p in measures]  # load levels: metrics
    df = pb_tables.measurements_frame(measure_bodies, read_validations(validations),
                                      allow_unproven_cold_cache=gates["allow_unproven_cold_cache"])
    rounds_done = max(m["visit"]["round"] for m in measure_bodies)
    diffs = pb_adaptive.differences(df, baseline=plan_body["baseline"], candidates=plan_body["candidates"],
                                    metrics=stats["metrics"])
    body = pb_adaptive.decide(diffs, alpha=stats["alpha"], multiplicity=stats["multiplicity"],
                              rounds_done=rounds_done, adaptive={**plan_body["adaptive"], "max_minutes": max_minutes},
                              clock=pb_adaptive.visit_clock(measure_bodies, now_unix=time.time()))
    body["inputs"] = {"plan": sha256_file(plan), **{f"measure.{m['visit']['id']}": sha256_file(p)
                                                    for m, p in zip(measure_bodies, measures)},
                      **{f"validate.{naming.label(*naming.validation_key(v))}": sha256_file(p)
                         for v, p in zip((read_artifact(p, "validate") for p in validations), validations)}}
    write_artifact(adapt, "adapt", body)
    logging.getLogger("pairbench.progress").info("[adapt] %s", body["reason"])


def plots_stage(*, ratios: str, drift: str, summary: str, measurements: str, load: str | None = None) -> None:
    body = read_artifact(summary, "summary")
    df = pd.read_csv(measurements)
    pb_plots.plot_ratios(body, ratios)
    pb_plots.plot_drift(df, drift, tuple(body["params"]["primary"]))
    if load:
        pb_plots.plot_load(body, df, load)


def crosscheck_compare_stage(*, comparison: str, summary: str, plan: str, crosschecks: list[str]) -> None:
    """The engine's own benchmark against pairbench's verdicts (pairbench.analysis.crosscheck), for
    the one candidate the rule cross-checks (common.smk: crosscheck_arms): the arm beside the baseline."""
    plan_body = read_artifact(plan, "plan")
    by_arm = {b["arm"]: (b, p) for b, p in ((read_artifact(p, "crosscheck"), p) for p in crosschecks)}
    base = plan_body["baseline"]
    cand = next(a for a in by_arm if a != base)
    body = pb_crosscheck.compare(read_artifact(summary, "summary"), by_arm[base][0], by_arm[cand][0])
    body["inputs"] = {"summary": sha256_file(summary),
                      **{f"crosscheck.{a}": sha256_file(p) for a, (_, p) in sorted(by_arm.items())}}
    write_artifact(comparison, "crosscheck_summary", body)


def cost_compare_stage(*, comparison: str, summary: str, plan: str, costs: list[str], builds: list[str]) -> None:
    """The cost channel's verdicts beside the wall-clock ones (pairbench.analysis.cost.summarize, which
    ``verify`` recomputes), for every candidate; an arm not counted is carried with its reason."""
    plan_body = read_artifact(plan, "plan")
    bodies = {b["arm"]: (b, p) for b, p in ((read_artifact(p, "cost"), p) for p in costs)}
    built = {b["arm"]: (b, p) for b, p in ((read_artifact(p, "build"), p) for p in builds)}
    body = pb_cost.summarize(plan_body, read_artifact(summary, "summary"), {a: b for a, (b, _) in bodies.items()},
                             {a: b for a, (b, _) in built.items()})
    body["inputs"] = {"plan": sha256_file(plan), "summary": sha256_file(summary),
                      **{f"cost.{a}": sha256_file(p) for a, (_, p) in sorted(bodies.items())},
                      **{f"build.{a}": sha256_file(p) for a, (_, p) in sorted(built.items())}}
    for r in body["rows"]:
        logging.getLogger("pairbench").info("%s %s %s: %.4fx %s (wall time: %s)", r["candidate"], r["condition"], r["metric"], r["ratio"],
                 r["verdict"], r["wall_verdict"])
    write_artifact(comparison, "cost_summary", body)
