"""``tables/measurements.csv``: one row per steady record, joined with its validation verdicts.

The statistics read this table (docs/contracts.md §2). A row is ``selected`` only when its record
passed every gate (``ok``) *and* every configured validation case, and no validation retry measured
it again (``retry`` is 0 for a visit's own records, N for retry N's); ``reason`` says, in a short
publishable label, why a row was not selected (the full reasons stay in the artifacts and report).
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["round", "arm", "length", "visit_index", "attempt", "retry", "ok", "selected", "reason", "ttft_ms", "e2e_ms",
           "prefill_tok_s", "decode_tok_s", "engine_prefill_tok_s", "engine_decode_tok_s", "prompt_tokens",
           "completion_tokens", "tokens_cached", "kv_bytes", "peak_rss_bytes"]
REASON_MAX = 64


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


def measurements_frame(measures: list[dict], validations: dict[tuple[str, int], dict]) -> pd.DataFrame:
    """Rows for every steady record of every visit and of every validation retry.

    *validations* maps (visit id, retry) to the validate body (``pairbench.validate.retries.validation_key``).
    A record that a later retry measured again is kept, never selected, with the reason
    ``superseded by retry N``: only the latest measurement of a (round, arm, length) may count.
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
        by_length = {r["length"]: r for r in val["records"]} if val else {}
        for rec in m["records"]:
            v = by_length.get(rec["length"])
            newer = latest[(rec["round"], rec["arm"], rec["length"])]
            selected = bool(rec["ok"] and v is not None and v["selected"] and newer == retry)
            if selected:
                reason = ""
            elif newer > retry:
                reason = f"superseded by retry {newer}"
            else:
                reason = short_reason(rec, v) or "not validated"
            eng = rec["engine"] or {}
            rows.append({
                "round": rec["round"], "arm": rec["arm"], "length": rec["length"],
                "visit_index": rec["visit_index"], "attempt": rec["attempt"], "retry": retry, "ok": rec["ok"],
                "selected": selected, "reason": reason,
                "ttft_ms": rec["ttft_ms"], "e2e_ms": rec["e2e_ms"], "prefill_tok_s": rec["prefill_tok_s"],
                "decode_tok_s": rec["decode_tok_s"], "engine_prefill_tok_s": eng.get("prefill_tok_s"),
                "engine_decode_tok_s": eng.get("decode_tok_s"), "prompt_tokens": rec["prompt_tokens"],
                "completion_tokens": rec["completion_tokens"], "tokens_cached": rec["tokens_cached"],
                "kv_bytes": rec["kv_bytes"], "peak_rss_bytes": rec["peak_rss_bytes"],
            })
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["visit_index", "length", "retry"], kind="stable").reset_index(drop=True)


def timing_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm × length: median client vs engine decode and prefill tok/s, and how far they disagree.

    Over gated records, each (round, arm, length) once: a record a validation retry re-measured
    (reason ``superseded by retry N``) is left out, its retry counts.
    """
    superseded = (df["reason"].fillna("").astype(str).str.startswith("superseded") if "reason" in df.columns
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


def summary_tables(summary: dict) -> dict[str, pd.DataFrame]:
    """Flat tables for ``tables/*.csv``: numeric columns plus the allowlisted categorical columns
    ``arm``, ``length``, ``metric`` and ``verdict`` (no free text, so they are safe to publish).

    - ``summary``: one row per arm × length × metric;
    - ``paired``: one row per length × metric;
    - ``ratios``: one row per length × metric × round (the per-round paired ratios).
    """
    rows = []
    for arm, by_len in summary["arms"].items():
        for length, by_metric in by_len.items():
            for metric, d in by_metric.items():
                rows.append({"arm": arm, "length": int(length), "metric": metric,
                             **{k: d[k] for k in ("n", "median", "min", "max", "trimmed_mean",
                                                   "trim_per_end", "n_missing", "n_outliers")}})
    paired, ratios = [], []
    for length, by_metric in summary["paired"].items():
        for metric, p in by_metric.items():
            paired.append({"length": int(length), "metric": metric,
                           **{k: p[k] for k in ("n_pairs", "median_ratio", "hl_ratio", "ci_low",
                                                 "ci_high", "p_value", "min_attainable_p",
                                                 "median_change", "trimmed_mean_change")},
                           "higher_is_better": p["higher_is_better"], "verdict": p["verdict"]})
            for pair in p["pairs"]:
                ratios.append({"length": int(length), "metric": metric, "round": pair["round"],
                               "baseline": pair["baseline"], "candidate": pair["candidate"],
                               "ratio": pair["ratio"], "valid": pair["valid"]})
    return {
        "summary": pd.DataFrame(rows, columns=["arm", "length", "metric", "n", "median", "min", "max",
                                               "trimmed_mean", "trim_per_end", "n_missing",
                                               "n_outliers"]),
        "paired": pd.DataFrame(paired, columns=["length", "metric", "n_pairs", "median_ratio",
                                                "hl_ratio", "ci_low", "ci_high", "p_value",
                                                "min_attainable_p", "median_change",
                                                "trimmed_mean_change", "higher_is_better", "verdict"]),
        "ratios": pd.DataFrame(ratios, columns=["length", "metric", "round", "baseline", "candidate",
                                                "ratio", "valid"]),
    }
