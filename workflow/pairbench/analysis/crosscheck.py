"""Do the engine's own benchmark and pairbench agree? The cross-check comparison, computed once.

Inputs: ``stats/summary.json`` (pairbench's paired comparisons) and ``crosscheck/<arm>.json``
(:mod:`pairbench.measure.toolbench`) for the baseline and one candidate: the first candidate whose
engine names the tool (``common.smk: crosscheck_arms``); the others are not cross-checked. For
every planned length, two rows:

- **prefill**: llama-bench's ``pp<length>`` against pairbench's ``engine_prefill_tok_s`` (the
  server's own prompt timing, the closest thing to what llama-bench times), else ``prefill_tok_s``;
- **decode**: ``tg<output_tokens>`` at depth ``<length>`` against ``engine_decode_tok_s``, else
  ``decode_tok_s``.

Per row, ``tool_ratio`` = the median over the tool's rounds of candidate / baseline (paired by
round: the two arms ran back to back), and two judgements:

- ``direction``: the tool's ratio classified with the run's own noise threshold (``faster`` above
  1 + noise, ``slower`` below 1 - noise, else ``equivalent``), against pairbench's verdict. Where
  pairbench makes a claim (``faster``, ``slower`` or ``equivalent``: its interval wholly beyond or
  wholly inside 1 ± noise), the tool must show the same: ``agree``, else ``disagree``. Where
  pairbench is ``inconclusive`` (or the metric is secondary, untested): ``undecided``, since
  pairbench made no claim the tool could contradict;
- ``size``: ``within CI`` when the tool's ratio lies inside pairbench's bootstrap CI of the
  ratio, else ``outside CI``; ``size_gap`` = tool ratio / pairbench's Hodges-Lehmann ratio - 1.

With a few rounds the tool's ratio carries no interval of its own: it is a point that
pairbench's interval either contains or not. ``exercise`` is the short form of the candidate's exercise
record (:func:`pairbench.measure.exercise.status`): whether its patch ran at all. The body is the ``crosscheck_summary``
artifact; it holds numbers and short labels only, so it is published as ``tables/crosscheck.json``.
"""

from __future__ import annotations

import statistics

from pairbench.analysis import verdicts
from pairbench.core.metrics import TOOL_COUNTERPARTS
from pairbench.measure.exercise import status as exercise_status

PAIRS = {"prefill": ("pp", TOOL_COUNTERPARTS["prefill"]), "decode": ("tg", TOOL_COUNTERPARTS["decode"])}


def _tool_test(tests: list[dict], kind: str, length: int, output_tokens: int) -> dict | None:
    for t in tests:
        if kind == "pp" and t["kind"] == "pp" and t["n_prompt"] == length and t["n_depth"] == 0:
            return t
        if kind == "tg" and t["kind"] == "tg" and t["n_gen"] == output_tokens and t["n_depth"] == length:
            return t
    return None


def classify(ratio: float | None, noise: float) -> str | None:
    """The tool's ratio (tok/s: higher is faster) read as pairbench reads an exact ratio
    (:func:`pairbench.analysis.verdicts.read_ratio`); None without a ratio."""
    return None if ratio is None else verdicts.read_ratio(ratio, noise=noise).verdict


def compare(summary: dict, baseline: dict, candidate: dict) -> dict:
    """The ``crosscheck_summary`` body (without ``inputs``) from the summary and the cross-checks of
    the baseline and one candidate (``candidate["arm"]``, compared with its own pair body). The tool
    knows prompt and generated tokens, so each condition is matched by its input and output tokens."""
    pair = summary["comparisons"][candidate["arm"]]
    noise = float(summary["params"]["noise"])
    rows = []
    for cond in pair["conditions"]:
        cells = pair["paired"].get(cond["id"], {})
        for quantity, (kind, metrics) in PAIRS.items():
            metric = next((m for m in metrics if m in cells), None)
            b = _tool_test(baseline["tests"], kind, cond["input_tokens"], cond["output_tokens"])
            c = _tool_test(candidate["tests"], kind, cond["input_tokens"], cond["output_tokens"])
            if metric is None or b is None or c is None:
                continue
            cell = cells[metric]
            pairs = [cs / bs for bs, cs in zip(b["samples_tok_s"], c["samples_tok_s"]) if bs > 0]
            ratio = statistics.median(pairs) if pairs else None
            tool_dir = classify(ratio, noise)
            verdict = cell["verdict"]
            if verdict in ("faster", "slower", "equivalent") and tool_dir is not None:
                direction = "agree" if tool_dir == verdict else "disagree"
            else:
                direction = "undecided"
            lo, hi, hl = cell["ci_low"], cell["ci_high"], cell["hl_ratio"]
            size = None if ratio is None or lo is None or hi is None else ("within CI" if lo <= ratio <= hi else "outside CI")
            rows.append({
                "condition": cond["id"], "quantity": quantity, "test": b["test"], "n_depth": b["n_depth"],
                "metric": metric, "baseline_tok_s": b["avg_tok_s"], "candidate_tok_s": c["avg_tok_s"],
                "baseline_stddev_tok_s": b["stddev_tok_s"], "candidate_stddev_tok_s": c["stddev_tok_s"],
                "tool_ratio": ratio, "tool_direction": tool_dir,
                "pairbench_ratio": hl, "pairbench_ci_low": lo, "pairbench_ci_high": hi, "verdict": verdict,
                "direction": direction, "size": size,
                "size_gap": None if ratio is None or not hl else ratio / hl - 1,
            })
    counts = {k: sum(1 for r in rows if r["direction"] == k) for k in ("agree", "disagree", "undecided")}
    return {"baseline": summary["baseline"], "candidate": candidate["arm"], "tool": baseline["tool"],
            "noise": noise, "rounds": baseline["rounds"], "rows": rows,
            "exercise": exercise_status(candidate.get("exercise")),
            "direction_counts": counts,
            "size_within_ci": sum(1 for r in rows if r["size"] == "within CI")}


def statement(body: dict) -> str:
    """One sentence for the report: do the tool and pairbench agree, on direction and on size."""
    rows = body["rows"]
    if not rows:
        return f"{body['tool']} produced no test matching the planned conditions; nothing to compare."
    n = len(rows)
    c = body["direction_counts"]
    parts = [f"{body['tool']} and pairbench agree on the direction of the effect in {c['agree']} of {n} "
             f"comparisons"]
    if c["disagree"]:
        parts.append(f"disagree in {c['disagree']}")
    if c["undecided"]:
        parts.append(f"{c['undecided']} undecided (pairbench was inconclusive there, or the metric is not tested)")
    size = (f"{body['tool']}'s ratio lies inside pairbench's confidence interval in "
            f"{body['size_within_ci']} of {n}")
    return "; ".join(parts) + ". " + size + "."
