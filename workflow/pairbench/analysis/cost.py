"""The cost channel's verdicts, beside the wall-clock ones: computed once, here.

Inputs: ``cost/<arm>.json`` of every arm (:mod:`pairbench.measure.cost`: instructions and estimated
cycles per token, one fixed request per condition under callgrind) and ``stats/summary.json`` (the
wall-clock comparisons). Per candidate, condition and cost metric
(:data:`pairbench.core.metrics.COST_METRICS`), one row:

- ``ratio`` = candidate / baseline of the counts per token. A count has no sampling error (the A/A
  pair counts the same instructions: docs/cost.md, "Determinism"), so the ratio is a point and its
  verdict is :func:`pairbench.analysis.verdicts.read_ratio`'s, with the run's noise threshold and the
  speed vocabulary (fewer instructions: ``faster``): the one verdict rule;
- except that identical instruction counts between arms that differ (their trees or launch flags)
  read **not exercised**, never ``equivalent``: the candidate's change ran no instruction the channel
  counts (an AVX-512 kernel, a thread count, a barrier: what it cannot see);
- beside it, the wall-clock verdict of the same question and condition (``decode_tok_s`` for decode,
  ``prefill_tok_s`` for prefill, or the engine's own figures where the run tests those instead:
  :func:`wall_cell`, :data:`pairbench.core.metrics.COST_COUNTERPARTS`) and
  ``agreement``: ``agree`` where both make the same claim, ``disagree`` where both make a claim and
  the claims differ, else ``undecided`` (wall time inconclusive or untested, the channel not
  exercised).

An arm the channel could not count (no valgrind, an instruction valgrind does not know, its time
limit, an engine it cannot run) gives no rows; its reason is in ``arms`` and the report prints it.
The wall-clock verdicts never depend on this channel. The body is the ``cost_summary`` artifact: numbers
and short labels only, so it is published as ``tables/cost.json``.
"""

from __future__ import annotations

from pairbench.analysis import verdicts
from pairbench.core.metrics import COST_COUNTERPARTS, COST_METRICS, cost_metric

NOT_EXERCISED = "not exercised"
CLAIMS = ("faster", "slower", "equivalent")


def _by_key(body: dict) -> dict[tuple[str, str], float | None]:
    return {(r["condition"], m): v for r in body["rows"] for m, v in r["metrics"].items()}


def _instructions_identical(base: dict, cand: dict, condition: str, phase: str) -> bool:
    b = next((r for r in base["rows"] if (r["condition"], r["phase"]) == (condition, phase)), None)
    c = next((r for r in cand["rows"] if (r["condition"], r["phase"]) == (condition, phase)), None)
    return b is not None and c is not None and b["events"]["Ir"] == c["events"]["Ir"]


def _counting(body: dict) -> str | None:
    """How an arm's llama-bench was counted (``wrapped``, ``toggle-collect``; None for the embedded
    engine): callgrind's simulated caches start cold at every call in one mode and stay warm in the
    other, so estimated cycles compare only within one mode."""
    return (body.get("facts") or {}).get("counting")


def judge(ratio: float, *, noise: float, identical: bool, same_arms: bool) -> verdicts.Judgement:
    """The cost verdict of one exact ratio (lower counts are better). *identical*: the instruction
    counts are equal; *same_arms*: the two arms run the same tree with the same launch flags (an A/A)."""
    if identical and not same_arms:
        return verdicts.Judgement(NOT_EXERCISED, "the arms differ, yet count the same instructions: the change "
                                                 "runs nothing the simulator counts")
    return verdicts.read_ratio(ratio, noise=noise, higher_is_better=False)


def wall_cell(summary: dict, candidate: str, condition: str, phase: str) -> tuple[str, dict | None]:
    """The wall-clock comparison a cost metric of *phase* sits beside: ``(metric, its paired cell)``,
    the first of :data:`COST_COUNTERPARTS` the run tests (a primary metric has a verdict: the client's
    ``decode_tok_s``, or the engine's own ``engine_decode_tok_s`` where a config tests that instead),
    else the first the run has, else the first name and None."""
    paired = summary["comparisons"][candidate]["paired"].get(condition, {})
    names = COST_COUNTERPARTS[phase]
    tested = [m for m in names if (paired.get(m) or {}).get("verdict") is not None]
    present = [m for m in names if paired.get(m) is not None]
    metric = (tested or present or list(names))[0]
    return metric, paired.get(metric)


def agreement(cost_verdict: str, wall_verdict: str | None) -> str:
    """``agree``, ``disagree`` or ``undecided`` (either side makes no claim)."""
    if wall_verdict not in CLAIMS or cost_verdict not in CLAIMS:
        return "undecided"
    return "agree" if wall_verdict == cost_verdict else "disagree"


def same_arm(configs: dict, builds: dict, base: str, cand: str) -> bool:
    """Whether *cand* runs *base*'s patched tree with its launch settings (an A/A pair): their build
    artifacts' ``patched_tree_sha256`` and their arms' engine, args, env, threads and launch."""
    keys = ("engine", "args", "env", "threads", "launch")
    return (builds[base]["patched_tree_sha256"] == builds[cand]["patched_tree_sha256"]
            and all(configs[base].get(k) == configs[cand].get(k) for k in keys))


def compare(summary: dict, costs: dict[str, dict], *, same: dict[str, bool]) -> dict:
    """The ``cost_summary`` body (without ``inputs``) from the summary and every arm's ``cost`` body
    (*costs*, by arm). *same*: per candidate, whether it is the baseline's tree with its launch flags."""
    base = summary["baseline"]
    noise = float(summary["params"]["noise"])
    arms = {a: {k: b[k] for k in ("status", "reason", "message", "source", "tool_version", "duration_s", "engine")}
            for a, b in sorted(costs.items())}
    rows = []
    b_body = costs.get(base)
    for cand in summary["comparisons"]:
        c_body = costs.get(cand)
        if b_body is None or c_body is None or b_body["status"] != "counted" or c_body["status"] != "counted":
            continue
        b_vals, c_vals = _by_key(b_body), _by_key(c_body)
        two_ways = _counting(b_body) != _counting(c_body)
        for (cond, metric), bv in b_vals.items():
            cv = c_vals.get((cond, metric))
            if bv is None or cv is None or bv <= 0:
                continue
            phase = COST_METRICS[metric].question
            ratio = cv / bv
            j = judge(ratio, noise=noise, identical=_instructions_identical(b_body, c_body, cond, phase),
                      same_arms=same.get(cand, False))
            if two_ways and metric == cost_metric(phase, "cycles"):
                # instructions count alike either way; the simulated caches do not (measure.cost)
                j = verdicts.Judgement("inconclusive", f"the arms were counted differently ({_counting(b_body)} "
                                                       f"against {_counting(c_body)}): their simulated caches "
                                                       "are not comparable, their instructions are")
            wall_metric, cell = wall_cell(summary, cand, cond, phase)
            wall_verdict, wall_ratio = (None, None) if cell is None else (cell["verdict"], cell.get("hl_ratio"))
            rows.append({"candidate": cand, "condition": cond, "phase": phase, "metric": metric,
                         "baseline_per_tok": bv, "candidate_per_tok": cv, "ratio": ratio, "verdict": j.verdict,
                         "reason": j.reason, "wall_metric": wall_metric, "wall_verdict": wall_verdict,
                         "wall_ratio": wall_ratio, "agreement": agreement(j.verdict, wall_verdict)})
    counts = {k: sum(1 for r in rows if r["agreement"] == k) for k in ("agree", "disagree", "undecided")}
    return {"baseline": base, "noise": noise, "arms": arms, "rows": rows, "agreement_counts": counts}


def summarize(plan: dict, summary: dict, costs: dict[str, dict], builds: dict[str, dict]) -> dict:
    """The ``cost_summary`` body (without ``inputs``) of a run: its *plan* (baseline, candidates and
    each arm's engine, args, env, threads and launch), its wall-clock *summary*, every arm's ``cost``
    body and ``build`` body (by arm). Rule ``cost_compare`` writes it and ``verify`` recomputes it
    (:mod:`pairbench.publish.costcheck`): one function, so the two cannot differ."""
    base = plan["baseline"]
    same = {c: same_arm(plan["arms"], builds, base, c) for c in plan["candidates"]}
    return compare(summary, costs, same=same)


def statement(body: dict) -> str:
    """One sentence for the report: what the channel counted, and whether it agrees with wall time."""
    skipped = [f"`{a}` ({b['reason']}: {b['message']})" for a, b in body["arms"].items() if b["status"] != "counted"]
    if not body["rows"]:
        return "The cost channel counted nothing to compare" + (f": not counted {'; '.join(skipped)}." if skipped else ".")
    c = body["agreement_counts"]
    n = len(body["rows"])
    parts = [f"The cost channel and wall time make the same claim in {c['agree']} of {n} rows"]
    if c["disagree"]:
        parts.append(f"opposite or different claims in {c['disagree']} (each measures something else: below)")
    if c["undecided"]:
        parts.append(f"{c['undecided']} undecided (one side makes no claim)")
    return "; ".join(parts) + "." + (f" Not counted: {'; '.join(skipped)}." if skipped else "")
