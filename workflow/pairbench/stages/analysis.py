"""Stage 6: the measurements table, the statistics and their flat tables, and the plots."""

from __future__ import annotations

import pandas as pd

from pairbench.analysis import crosscheck as pb_crosscheck
from pairbench.analysis import plots as pb_plots
from pairbench.analysis import stats as pb_stats
from pairbench.analysis import tables as pb_tables
from pairbench.core.artifacts import atomic_write_text, read_artifact, sha256_file, write_artifact
from pairbench.validate import retries


def read_validations(paths: list[str]) -> dict[tuple[str, int], dict]:
    """Validate artifacts by (visit id, retry), in *paths* order."""
    out = {}
    for p in paths:
        v = read_artifact(p, "validate")
        out[retries.validation_key(v)] = v
    return out


def stats_stage(*, summary: str, measurements: str, summary_csv: str, paired_csv: str, ratios_csv: str,
                timing_csv: str, plan: str, measures: list[str], validations: list[str], stats: dict) -> None:
    """measurements.csv from the visits and their verdicts, then the summary and its flat tables."""
    plan_body = read_artifact(plan, "plan")
    measure_bodies = [read_artifact(p, "measure") for p in measures]
    validation_bodies = read_validations(validations)
    df = pb_tables.measurements_frame(measure_bodies, validation_bodies)
    atomic_write_text(measurements, df.to_csv(index=False))
    body = pb_stats.summarize(df, baseline=plan_body["baseline"], candidate=plan_body["candidate"],
                              metrics=stats["metrics"], trim=stats["trim"], alpha=stats["alpha"],
                              noise=stats["noise"], seed=plan_body["seed"])
    body["inputs"] = {"plan": sha256_file(plan),
                      **{f"measure.{retries.label(*retries.measure_key(m))}": sha256_file(p)
                         for m, p in zip(measure_bodies, measures)},
                      **{f"validate.{retries.label(*key)}": sha256_file(p)
                         for key, p in zip(validation_bodies, validations)}}
    write_artifact(summary, "summary", body)
    flat = pb_tables.summary_tables(body)
    atomic_write_text(summary_csv, flat["summary"].to_csv(index=False))
    atomic_write_text(paired_csv, flat["paired"].to_csv(index=False))
    atomic_write_text(ratios_csv, flat["ratios"].to_csv(index=False))
    atomic_write_text(timing_csv, pb_tables.timing_agreement(df).to_csv(index=False))


def plots_stage(*, ratios: str, drift: str, summary: str, measurements: str) -> None:
    pb_plots.plot_ratios(read_artifact(summary, "summary"), ratios)
    pb_plots.plot_drift(pd.read_csv(measurements), drift)


def crosscheck_compare_stage(*, comparison: str, summary: str, plan: str, crosschecks: list[str]) -> None:
    """The engine's own benchmark against pairbench's verdicts (pairbench.analysis.crosscheck)."""
    plan_body = read_artifact(plan, "plan")
    by_arm = {b["arm"]: (b, p) for b, p in ((read_artifact(p, "crosscheck"), p) for p in crosschecks)}
    base, cand = plan_body["baseline"], plan_body["candidate"]
    body = pb_crosscheck.compare(read_artifact(summary, "summary"), by_arm[base][0], by_arm[cand][0],
                                 output_tokens=plan_body["output_tokens"])
    body["inputs"] = {"summary": sha256_file(summary),
                      **{f"crosscheck.{a}": sha256_file(p) for a, (_, p) in sorted(by_arm.items())}}
    write_artifact(comparison, "crosscheck_summary", body)
