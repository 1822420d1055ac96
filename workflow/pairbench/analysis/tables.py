"""``tables/measurements.csv``: one row per steady record, joined with its validation verdicts.

The statistics read this table (docs/contracts.md §2). A row is ``selected`` only when its record
passed every gate (``ok``), its cold cache is proven (``cold_cache`` true; a null gate counts only
with ``gates.allow_unproven_cold_cache``), it passed every configured validation case, and no
validation retry measured it again (``retry`` is 0 for a visit's own records, N for retry N's);
``reason`` says, in a short publishable label, why a row was not selected (the full reasons stay in
the artifacts and report). ``repeat`` numbers a visit's steady requests at one length (1 = first).
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["round", "arm", "length", "repeat", "visit_index", "attempt", "retry", "ok", "cold_cache", "selected", "reason",
           "ttft_ms", "e2e_ms",
           "prefill_tok_s", "decode_tok_s", "engine_prefill_tok_s", "engine_decode_tok_s", "prompt_tokens",
           "completion_tokens", "tokens_cached", "kv_bytes", "peak_rss_bytes"]
REASON_MAX = 64


UNPROVEN = "gate cold_cache unproven"


def short_reason(record: dict, validation: dict | None) -> str:
    """A short label (letters, digits, ``_ :+-``), e.g. ``gate prompt_tokens + case done_marker fail``."""
    parts = []
    if not record["ok"]:
        failed = [g for g, passed in record["gates"].items() if not passed]
        if failed:
            parts.append("gate " + " ".join(failed))
        else:
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

    *validations* maps (visit id, retry) to the validate body (``pairbench.validate.retries.validation_key``).
    A record that a later retry measured again is kept, never selected, with the reason
    ``superseded by retry N``: only the latest measurement of a (round, arm, length) may count. A
    record whose cold-cache gate is null is selected only with *allow_unproven_cold_cache*.
    """
    from pairbench.validate.retries import measure_key

    latest: dict[tuple, int] = {}
    for m in measures:
        for rec in m["records"]:
            key = (rec["round"], rec["arm"], rec["length"])
            latest[key] = max(latest.get(key, 0), measure_key(m)[1])
    rows = []
    for m in measures:
        retry = measure_key(m)[1]
        val = validations.get(measure_key(m))
        by_cell = {(r["length"], record_repeat(r)): r for r in val["records"]} if val else {}
        for rec in m["records"]:
            v = by_cell.get((rec["length"], record_repeat(rec)))
            newer = latest[(rec["round"], rec["arm"], rec["length"])]
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
            eng = rec["engine"] or {}
            rows.append({
                "round": rec["round"], "arm": rec["arm"], "length": rec["length"], "repeat": record_repeat(rec),
                "visit_index": rec["visit_index"], "attempt": rec["attempt"], "retry": retry, "ok": rec["ok"],
                "cold_cache": cold,
                "selected": selected, "reason": reason,
                "ttft_ms": rec["ttft_ms"], "e2e_ms": rec["e2e_ms"], "prefill_tok_s": rec["prefill_tok_s"],
                "decode_tok_s": rec["decode_tok_s"], "engine_prefill_tok_s": eng.get("prefill_tok_s"),
                "engine_decode_tok_s": eng.get("decode_tok_s"), "prompt_tokens": rec["prompt_tokens"],
                "completion_tokens": rec["completion_tokens"], "tokens_cached": rec["tokens_cached"],
                "kv_bytes": rec["kv_bytes"], "peak_rss_bytes": rec["peak_rss_bytes"],
            })
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["visit_index", "repeat", "length", "retry"], kind="stable").reset_index(drop=True)


def timing_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm × length: median client vs engine decode and prefill tok/s, and how far they disagree.

    Over gated records, each (round, arm, length) once: a record a validation retry re-measured
    (reason ``superseded by retry N``) is left out, its retry counts.
    """
    superseded = (df["reason"].astype("string").fillna("").str.startswith("superseded") if "reason" in df.columns
                  else pd.Series(False, index=df.index))
    ok = df[df["ok"].astype(bool) & ~superseded]
    rows = []
    for (arm, length), g in ok.groupby(["arm", "length"], sort=True):
        row = {"arm": arm, "length": int(length)}
        for kind in ("decode", "prefill"):
            client = pd.to_numeric(g[f"{kind}_tok_s"], errors="coerce").median()
            engine = pd.to_numeric(g[f"engine_{kind}_tok_s"], errors="coerce").median()
            row[f"client_{kind}_tok_s"] = client
            row[f"engine_{kind}_tok_s"] = engine
            row[f"{kind}_disagreement"] = (client / engine - 1.0) if engine and engine == engine else None
        rows.append(row)
    return pd.DataFrame(rows)


PAIRED_COLUMNS = ["candidate", "length", "metric", "role", "n_pairs", "n_dropped_pairs", "median_ratio", "hl_ratio",
                  "ci_low", "ci_high", "ci_level", "half_width", "detectable_change", "rounds_needed", "p_value",
                  "min_attainable_p", "claim_p", "family_rank", "median_change", "trimmed_mean_change",
                  "higher_is_better", "verdict"]
MEMORY_COLUMNS = ["candidate", "length", "metric", "baseline_value", "candidate_value", "n_baseline", "n_candidate", "exact",
                  "ratio", "ci_low", "ci_high", "ci_level", "verdict"]
SUMMARY_COLUMNS = ["candidate", "arm", "length", "metric", "n", "n_visits", "median", "min", "max", "trimmed_mean",
                   "trim_per_end", "n_missing", "n_outliers"]
RATIOS_COLUMNS = ["candidate", "length", "metric", "round", "baseline_value", "candidate_value", "ratio", "valid"]


def summary_tables(summary: dict) -> dict[str, pd.DataFrame]:
    """Flat tables for ``tables/*.csv``, one block of rows per candidate (``candidate`` the arm
    compared with the baseline, in the summary's order): numeric columns plus the allowlisted
    categorical columns ``candidate``, ``arm``, ``length``, ``metric``, ``role`` and ``verdict`` (no
    free text, so they are safe to publish).

    - ``summary``: one row per candidate × arm × length × metric (requests; ``n_visits`` the rounds
      they span); the baseline's rows repeat under each candidate (the same figures);
    - ``paired``: one row per candidate × length × metric (primary and secondary; ``verdict`` empty
      for secondary);
    - ``ratios``: one row per candidate × length × metric × round (per-round paired ratios of visit
      summaries; ``baseline_value`` and ``candidate_value`` the two visit summaries);
    - ``memory``: one row per candidate × length × memory metric (exact ratio, or the tested interval;
      ``baseline_value`` and ``candidate_value`` the two medians).
    """
    frames = [_pair_tables(cand, summary["comparisons"][cand]) for cand in summary["candidates"]]
    out = {name: pd.concat([f[name] for f in frames], ignore_index=True) if frames else
           pd.DataFrame(columns=cols)
           for name, cols in (("summary", SUMMARY_COLUMNS), ("paired", PAIRED_COLUMNS),
                              ("ratios", RATIOS_COLUMNS), ("memory", MEMORY_COLUMNS))}
    out["paired"]["rounds_needed"] = out["paired"]["rounds_needed"].astype("Int64")
    out["paired"]["family_rank"] = out["paired"]["family_rank"].astype("Int64")
    return out


def _pair_tables(cand: str, pair: dict) -> dict[str, pd.DataFrame]:
    """The four tables' rows of one candidate's pair body."""
    # explicit orders (lengths numeric, metrics as the params list them): a summary read back from
    # JSON has its keys sorted as text, and these tables must not depend on where it came from
    lengths = [str(n) for n in pair["lengths"]]
    prm = pair["params"]
    order = [*prm.get("primary", []), *prm.get("secondary", []), *prm.get("memory", [])] or list(pair["metrics"])

    def ordered(table: dict):
        for length in lengths:
            by_metric = table.get(length, {})
            for metric in (m for m in order if m in by_metric):
                yield length, metric, by_metric[metric]

    rows = []
    for arm in (pair["baseline"], pair["candidate"]):
        for length, metric, d in ordered(pair["arms"].get(arm, {})):
            rows.append({"candidate": cand, "arm": arm, "length": int(length), "metric": metric,
                         **{k: d[k] for k in SUMMARY_COLUMNS[4:]}})
    paired, ratios, memory = [], [], []
    for length, metric, p in ordered(pair["paired"]):
        paired.append({"candidate": cand, "length": int(length), "metric": metric,
                       **{k: p[k] for k in PAIRED_COLUMNS[3:]}})
        for q in p["pairs"]:
            ratios.append({"candidate": cand, "length": int(length), "metric": metric, "round": q["round"],
                           "baseline_value": q["baseline"], "candidate_value": q["candidate"],
                           "ratio": q["ratio"], "valid": q["valid"]})
    for length, metric, m in ordered(pair.get("memory", {})):
        t = m["test"] or {}
        memory.append({"candidate": cand, "length": int(length), "metric": metric, "baseline_value": m["baseline"],
                       "candidate_value": m["candidate"],
                       **{k: m[k] for k in ("n_baseline", "n_candidate", "exact", "ratio")},
                       "ci_low": t.get("ci_low"), "ci_high": t.get("ci_high"), "ci_level": t.get("ci_level"),
                       "verdict": m["verdict"]})
    return {"summary": pd.DataFrame(rows, columns=SUMMARY_COLUMNS),
            "paired": pd.DataFrame(paired, columns=PAIRED_COLUMNS),
            "ratios": pd.DataFrame(ratios, columns=RATIOS_COLUMNS),
            "memory": pd.DataFrame(memory, columns=MEMORY_COLUMNS)}
