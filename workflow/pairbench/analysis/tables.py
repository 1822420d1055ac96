"""``tables/measurements.csv``: one row per steady record, joined with its validation verdicts.

The statistics read this table (docs/contracts.md §2). A row is ``selected`` only when its record
passed every gate (``ok``), its cold cache is proven (``cold_cache`` true; a null gate counts only
with ``gates.allow_unproven_cold_cache``), it passed every configured validation case, and no
validation retry measured it again (``retry`` is 0 for a visit's own records, N for retry N's);
``reason`` says, in a short publishable label, why a row was not selected (the full reasons stay in
the artifacts and report). ``repeat`` numbers a visit's steady requests at one condition (1 = first).
``condition`` is the condition id, followed by one column per condition factor
(:mod:`pairbench.core.conditions`); one column per metric of :data:`pairbench.core.metrics.METRICS`
of the scope the run measures: a steady run's rows are its requests (``request`` metrics), a load
run's are its level records (``level`` metrics; a level that failed its validity is not selected,
``reason`` naming the checks), with one more fact, ``engine_failed`` (:func:`engine_failed`).
"""

from __future__ import annotations

import pandas as pd

from pairbench.analysis.loadlevel import CLIENT_CHECKS, started_busy
from pairbench.core.conditions import FACTORS, factor_columns, parse_id
from pairbench.core.metrics import METRICS, NAMES
from pairbench.core.naming import measure_key

# The row key, the record facts, then one column per metric of the registry (in its order) and the
# native counters. The factor columns (one per condition factor the run has) follow ``condition``.
KEY_COLUMNS = ["round", "arm", "condition"]
FACT_COLUMNS = ["repeat", "visit_index", "attempt", "retry", "ok", "cold_cache", "selected", "reason"]
COUNT_COLUMNS = ["prompt_tokens", "completion_tokens", "tokens_cached"]
METRIC_COLUMNS = list(METRICS)


LEVEL_FACT_COLUMNS = ["engine_failed"]


def columns(factors: list[str], scopes=("request",)) -> list[str]:
    """The measurements table's columns for a run with these condition *factors*, measuring metrics
    of *scopes* (``request``: steady records; ``level``: a load run's level records)."""
    facts = [*FACT_COLUMNS, *(LEVEL_FACT_COLUMNS if "level" in scopes else [])]
    return [*KEY_COLUMNS, *factors, *facts, *(m for m in METRIC_COLUMNS if METRICS[m].scope in scopes),
            *COUNT_COLUMNS]


def engine_failed(rec: dict) -> bool:
    """Whether a level record shows the engine failing measured requests under load, and nothing that
    makes the level not the engine's: its validity failed ``errors`` (a measured request, not only a
    warm-up one, timed out, was dropped or got an HTTP error), no check said the client set the pace,
    it started on a server shown idle, and no gate caught the engine misreporting. Such a level is the
    SLO failing there (its attainment counts each failed request as not good), which the SLO capacity
    reads (:func:`pairbench.analysis.loadstats.capacity_rows`) although the level is not selected.
    Failures that follow from the errors (too few completed requests, the load not held, output cases
    on empty outputs) do not change that."""
    if rec.get("kind") != "level":
        return False
    failed = set((rec.get("validity") or {}).get("failed") or [])
    m = rec["metrics"]
    return ("errors" in failed and not failed & CLIENT_CHECKS and m["n_measured"] > m["n_ok"]
            and not started_busy(rec["idle"]) and all(g is not False for g in rec["gates"].values()))


REASON_MAX = 64


UNPROVEN = "gate cold_cache unproven"


def short_reason(record: dict, validation: dict | None) -> str:
    """A short label (letters, digits, ``_ :+-``), e.g. ``gate prompt_tokens + case done_marker fail``."""
    parts = []
    if not record["ok"]:
        failed = [g for g, passed in record["gates"].items() if not passed]
        invalid = (record.get("validity") or {}).get("failed") or []
        if failed:
            parts.append("gate " + " ".join(failed))
        if invalid:  # a load level the client paced, or that failed requests
            parts.append("validity " + " ".join(invalid))
        if not failed and not invalid:
            parts.append("flagged")
    if validation is not None and not validation["selected"]:
        for case, v in validation["verdicts"].items():
            if v["verdict"] not in ("pass", "skipped"):
                parts.append(f"case {case} {v['verdict']}")
    text = " + ".join(parts)
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def record_repeat(rec: dict) -> int:
    return int(rec.get("repeat", 1))


def measurements_frame(measures: list[dict], validations: dict[tuple[str, int], dict],
                       allow_unproven_cold_cache: bool = False) -> pd.DataFrame:
    """Rows for every steady record of every visit and of every validation retry.

    *validations* maps (visit id, retry) to the validate body (``pairbench.core.naming.validation_key``).
    A record that a later retry measured again is kept, never selected, with the reason
    ``superseded by retry N``: only the latest measurement of a (round, arm, condition) may count. A
    record whose cold-cache gate is null is selected only with *allow_unproven_cold_cache*.
    """
    latest: dict[tuple, int] = {}
    for m in measures:
        for rec in m["records"]:
            key = (rec["round"], rec["arm"], rec["condition"])
            latest[key] = max(latest.get(key, 0), measure_key(m)[1])
    factors = [f.name for f in FACTORS if any(f.name in rec for m in measures for rec in m["records"])]
    kinds = {rec.get("kind", "steady") for m in measures for rec in m["records"]}
    scopes = tuple(s for s, k in (("request", "steady"), ("level", "level")) if k in kinds) or ("request",)
    rows = []
    for m in measures:
        retry = measure_key(m)[1]
        val = validations.get(measure_key(m))
        by_cell = {(r["condition"], record_repeat(r)): r for r in val["records"]} if val else {}
        for rec in m["records"]:
            v = by_cell.get((rec["condition"], record_repeat(rec)))
            newer = latest[(rec["round"], rec["arm"], rec["condition"])]
            cold = rec["gates"].get("cold_cache")
            proven = cold is True or (cold is None and allow_unproven_cold_cache)
            selected = bool(rec["ok"] and proven and v is not None and v["selected"] and newer == retry)
            if selected:
                reason = ""
            elif newer > retry:
                reason = f"superseded by retry {newer}"
            else:
                reason = short_reason(rec, v)
                if rec["ok"] and not proven:
                    reason = UNPROVEN + (f" + {reason}" if reason else "")
                reason = (reason or "not validated")[:REASON_MAX]
            rows.append({
                "round": rec["round"], "arm": rec["arm"], "condition": rec["condition"],
                **{f: rec.get(f) for f in factors}, "repeat": record_repeat(rec),
                "visit_index": rec["visit_index"], "attempt": rec["attempt"], "retry": retry, "ok": rec["ok"],
                "cold_cache": cold, "selected": selected, "reason": reason,
                **({"engine_failed": engine_failed(rec)} if "level" in scopes else {}),
                **{name: metric.value(rec) for name, metric in METRICS.items() if metric.scope in scopes},
                **{c: rec[c] for c in COUNT_COLUMNS},
            })
    df = pd.DataFrame(rows, columns=columns(factors, scopes))
    order = {c: i for i, c in enumerate(sorted({r["condition"] for r in rows}, key=parse_id))}
    df["_order"] = df["condition"].map(order)
    df = df.sort_values(["visit_index", "repeat", "_order", "retry"], kind="stable").drop(columns="_order")
    return df.reset_index(drop=True)


def timing_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm × condition: median client vs engine decode and prefill tok/s, and how far they disagree.

    Over gated records, each (round, arm, condition) once: a record a validation retry re-measured
    (reason ``superseded by retry N``) is left out, its retry counts.
    """
    if NAMES.decode_tok_s not in df.columns:  # a load run: its rows are levels, with no per-request timings
        return pd.DataFrame(columns=["arm", "condition"])
    superseded = (df["reason"].astype("string").fillna("").str.startswith("superseded") if "reason" in df.columns
                  else pd.Series(False, index=df.index))
    ok = df[df["ok"].astype(bool) & ~superseded]
    rows = []
    order = {c: i for i, c in enumerate(sorted(set(ok["condition"]), key=parse_id))}
    for (arm, _, cond), g in ok.assign(_order=ok["condition"].map(order)).groupby(["arm", "_order", "condition"],
                                                                                  sort=True):
        row = {"arm": arm, "condition": cond}
        for kind in ("decode", "prefill"):
            client = pd.to_numeric(g[f"{kind}_tok_s"], errors="coerce").median()
            engine = pd.to_numeric(g[f"engine_{kind}_tok_s"], errors="coerce").median()
            row[f"client_{kind}_tok_s"] = client
            row[f"engine_{kind}_tok_s"] = engine
            row[f"{kind}_disagreement"] = (client / engine - 1.0) if engine and engine == engine else None
        rows.append(row)
    return pd.DataFrame(rows)


# Each summary table: its leading key columns (the condition's factor columns follow ``condition``),
# then its value columns.
PAIRED_COLUMNS = ["candidate", "condition", "metric", "role", "n_pairs", "n_dropped_pairs", "median_ratio", "hl_ratio",
                  "ci_low", "ci_high", "ci_level", "half_width", "detectable_change", "rounds_needed", "p_value",
                  "min_attainable_p", "claim_p", "family_rank", "median_change", "trimmed_mean_change",
                  "higher_is_better", "verdict"]
MEMORY_COLUMNS = ["candidate", "condition", "metric", "baseline_value", "candidate_value", "n_baseline", "n_candidate",
                  "exact", "ratio", "ci_low", "ci_high", "ci_level", "verdict"]
SUMMARY_COLUMNS = ["candidate", "arm", "condition", "metric", "n", "n_visits", "median", "min", "max", "trimmed_mean",
                   "trim_per_end", "n_missing", "n_outliers"]
RATIOS_COLUMNS = ["candidate", "condition", "metric", "round", "baseline_value", "candidate_value", "ratio", "valid"]
TABLES = {"summary": SUMMARY_COLUMNS, "paired": PAIRED_COLUMNS, "ratios": RATIOS_COLUMNS, "memory": MEMORY_COLUMNS}


def with_factors(cols: list[str], factors: list[str]) -> list[str]:
    """*cols* with the factor columns inserted after ``condition``."""
    i = cols.index("condition") + 1
    return [*cols[:i], *factors, *cols[i:]]


def summary_tables(summary: dict) -> dict[str, pd.DataFrame]:
    """Flat tables for ``tables/*.csv``, one block of rows per candidate (``candidate`` the arm
    compared with the baseline, in the summary's order): numeric columns plus the allowlisted
    categorical columns ``candidate``, ``arm``, ``condition``, ``metric``, ``role`` and ``verdict``
    (no free text, so they are safe to publish), and after ``condition`` one numeric column per
    condition factor.

    - ``summary``: one row per candidate × arm × condition × metric (requests; ``n_visits`` the
      rounds they span); the baseline's rows repeat under each candidate (the same figures);
    - ``paired``: one row per candidate × condition × metric (primary and secondary; ``verdict``
      empty for secondary);
    - ``ratios``: one row per candidate × condition × metric × round (per-round paired ratios of
      visit summaries; ``baseline_value`` and ``candidate_value`` the two visit summaries);
    - ``memory``: one row per candidate × condition × memory metric (exact ratio, or the tested
      interval; ``baseline_value`` and ``candidate_value`` the two medians).
    """
    factors = factor_columns(summary.get("conditions", []))
    frames = [_pair_tables(cand, summary["comparisons"][cand]) for cand in summary["candidates"]]
    out = {name: pd.DataFrame(rows, columns=with_factors(cols, factors))
           for name, cols in TABLES.items() for rows in [[r for f in frames for r in f[name]]]}
    out["paired"]["rounds_needed"] = out["paired"]["rounds_needed"].astype("Int64")
    out["paired"]["family_rank"] = out["paired"]["family_rank"].astype("Int64")
    return out


def _pair_tables(cand: str, pair: dict) -> dict[str, list[dict]]:
    """The four tables' rows of one candidate's pair body."""
    # explicit orders (conditions as the plan lists them, metrics as the params list them): a
    # summary read back from JSON has its keys sorted as text, and these tables must not depend on
    # where it came from
    conds = pair["conditions"]
    prm = pair["params"]
    order = [*prm.get("primary", []), *prm.get("secondary", []), *prm.get("memory", [])] or list(pair["metrics"])

    def ordered(table: dict):
        for cond in conds:
            by_metric = table.get(cond["id"], {})
            for metric in (m for m in order if m in by_metric):
                yield {"condition": cond["id"], **{k: v for k, v in cond.items() if k != "id"}}, metric, by_metric[metric]

    rows = []
    for arm in (pair["baseline"], pair["candidate"]):
        for key, metric, d in ordered(pair["arms"].get(arm, {})):
            rows.append({"candidate": cand, "arm": arm, **key, "metric": metric,
                         **{k: d[k] for k in SUMMARY_COLUMNS[4:]}})
    paired, ratios, memory = [], [], []
    for key, metric, p in ordered(pair["paired"]):
        paired.append({"candidate": cand, **key, "metric": metric, **{k: p[k] for k in PAIRED_COLUMNS[3:]}})
        for q in p["pairs"]:
            ratios.append({"candidate": cand, **key, "metric": metric, "round": q["round"],
                           "baseline_value": q["baseline"], "candidate_value": q["candidate"],
                           "ratio": q["ratio"], "valid": q["valid"]})
    for key, metric, m in ordered(pair.get("memory", {})):
        t = m["test"] or {}
        memory.append({"candidate": cand, **key, "metric": metric, "baseline_value": m["baseline"],
                       "candidate_value": m["candidate"],
                       **{k: m[k] for k in ("n_baseline", "n_candidate", "exact", "ratio")},
                       "ci_low": t.get("ci_low"), "ci_high": t.get("ci_high"), "ci_level": t.get("ci_level"),
                       "verdict": m["verdict"]})
    return {"summary": rows, "paired": paired, "ratios": ratios, "memory": memory}
