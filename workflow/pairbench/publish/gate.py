"""The gate: a run's verdicts and a policy turned into one CI decision, ``gate.json``, and an exit status.

A CI job asks one question of a run: did the change make the engine slower? The statistics already
answer it per condition and metric with an interval (``stats/summary.json``); the gate reads those
intervals under the config's ``gate:`` policy and decides once (asv ``continuous`` fails on a
significant slowdown beyond a factor; Bencher on a threshold). Policy:

- ``metrics``: the gated metrics (null: every primary, that is tested, metric of the run);
- ``conditions``: the gated condition ids (null: every condition of the run);
- ``fail_slower_than``: the smallest slowdown that fails, a fraction (null: the run's ``stats.noise``).
  It may not be below ``stats.noise``: the run's intervals are judged, and corrected for
  multiplicity, against that threshold, so a regression the gate calls is always a ``slower``
  verdict of the run;
- ``inconclusive``: ``pass`` (the default) or ``fail``: what a cell that could not rule out such a
  slowdown does;
- ``cost_metrics``: the cost channel's metrics (:data:`pairbench.core.metrics.COST_METRICS`) whose
  verdicts decide too; ``[]`` (the default): they are shown beside the wall-clock ones, never decide.

The cost channel (``stats/cost.json``, docs/cost.md), where the run has one, is in ``gate.json`` as
``cost`` (:func:`cost_record`): its rows at the gated conditions beside the wall-clock verdicts. It
decides nothing unless the policy names its metrics, because a count is a model of the machine
(it cannot see memory bandwidth, threads or the ISA paths valgrind cannot run). A gated cost cell is
exact: a **regression** when its ratio lies above ``1 + fail_slower_than``, **inconclusive** when the
channel is blind to the change (``not exercised``) or did not count it (``unavailable``: an arm not
counted, a condition not counted), else **pass**. Gated or not, the reason names the cost channel's
slower rows, its ``not exercised`` rows and the arms it did not count, so none reads as a pass unsaid.

Each gated cell (candidate x condition x metric) is read from its interval, the metric's
orientation deciding which side is slower (a lower tok/s, a higher ms):

- **regression**: the interval lies wholly on the slower side beyond ``1 -/+ fail_slower_than``;
- **inconclusive**: it reaches beyond that bound, but not wholly: a slowdown that large is not ruled out;
- **pass**: it rules out a slowdown that large (the run's verdict says whether faster or equivalent).

The decision, and its exit status: ``invalid`` (3) when the run cannot be judged
(:func:`run_problems`: no gated metric, a gated cell without pairs, records excluded or unpaired,
rounds missing); else ``regression`` (1) when any cell is one; else ``inconclusive`` (2) when a
cell is and the policy fails it; else ``pass`` (0), saying what it could not rule out. One line of
``reason`` says why. The views of this record (:mod:`pairbench.publish.gateviews`) compute nothing
it lacks; ``verify`` recomputes it from the bundle's measurements (:func:`gate_problems`; the cost
cells from ``stats/cost.json`` where the run folder is at hand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pairbench.analysis import cost as pb_cost
from pairbench.analysis.verdicts import SPEED_WORDS, read_ratio
from pairbench.core.metrics import COST_METRICS

EXIT = {"pass": 0, "regression": 1, "inconclusive": 2, "invalid": 3}
INCONCLUSIVE = ("pass", "fail")
REPORT = "publish/README.md"  # the full report, relative to the run folder
HOST_FACTS = ("cpu_model", "cpu_count_logical", "cpu_arch", "memory_total_bytes", "os_family", "os_distribution",
              "gpu_count")
CELL_NUMBERS = ("hl_ratio", "ci_low", "ci_high", "ci_level", "n_pairs", "rounds_needed", "detectable_change")
# What a cost cell carries of its stats/cost.json row (pairbench.analysis.cost)
COST_CELL = ("candidate", "condition", "metric", "verdict", "ratio", "baseline_per_tok", "candidate_per_tok",
             "wall_metric", "wall_verdict", "agreement")
UNAVAILABLE = "unavailable"  # a gated cost cell the channel did not count
POLICY_KEYS = ("metrics", "conditions", "fail_slower_than", "inconclusive", "cost_metrics")
REL_TOL = 1e-9


class GateError(Exception):
    """A gate policy that cannot be read; the message names the key."""


@dataclass(frozen=True)
class Policy:
    """The config's ``gate:`` block (None anywhere: the run's own choice, see the module doc)."""

    metrics: tuple[str, ...] | None = None
    conditions: tuple[str, ...] | None = None
    fail_slower_than: float | None = None
    inconclusive: str = "pass"
    cost_metrics: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, gate: dict | None) -> "Policy":
        gate = dict(gate or {})
        unknown = sorted(set(gate) - set(POLICY_KEYS))
        if unknown:
            raise GateError(f"gate.{unknown[0]}: not a gate key ({', '.join(POLICY_KEYS)})")
        inconclusive = gate.get("inconclusive") or "pass"
        if inconclusive not in INCONCLUSIVE:
            raise GateError(f"gate.inconclusive: {inconclusive!r} is not pass or fail")
        threshold = gate.get("fail_slower_than")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not 0 <= threshold < 1):
            raise GateError(f"gate.fail_slower_than: {threshold!r} is not a fraction in [0, 1), e.g. 0.02")
        cost = gate.get("cost_metrics") or []
        if not isinstance(cost, list) or any(m not in COST_METRICS for m in cost) or len(set(cost)) != len(cost):
            raise GateError(f"gate.cost_metrics: {cost!r} is not a list of distinct cost metrics "
                            f"({', '.join(COST_METRICS)}), or [] for none")
        return cls(metrics=_names(gate, "metrics"), conditions=_names(gate, "conditions"),
                   fail_slower_than=None if threshold is None else float(threshold), inconclusive=inconclusive,
                   cost_metrics=tuple(cost))

    def resolved(self, summary: dict) -> dict:
        """The policy as it applies to *summary* (every null made explicit): what ``gate.json`` records."""
        params = summary["params"]
        return {"metrics": list(self.metrics) if self.metrics is not None else list(params["primary"]),
                "conditions": list(self.conditions) if self.conditions is not None else None,
                "fail_slower_than": (self.fail_slower_than if self.fail_slower_than is not None
                                     else float(params["noise"])),
                "inconclusive": self.inconclusive, "cost_metrics": list(self.cost_metrics)}


def _names(gate: dict, key: str) -> tuple[str, ...] | None:
    value = gate.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise GateError(f"gate.{key}: give a non-empty list of names, or null for all of the run's")
    return tuple(value)


def condition_ids(summary: dict) -> list[str]:
    return [c["id"] for c in summary.get("conditions", [])]


def gated_conditions(summary: dict, policy: dict) -> list[str]:
    conds = condition_ids(summary)
    return conds if policy["conditions"] is None else [c for c in conds if c in policy["conditions"]]


# --- is the run one the gate can judge? ------------------------------------------------------------

def policy_problems(summary: dict, policy: dict) -> list[str]:
    """What the policy asks that the run cannot answer."""
    params, problems = summary["params"], []
    primary = list(params["primary"])
    if not policy["metrics"]:
        problems.append("the summary has no gated metric: the run tested no primary metric (stats.metrics)")
    for m in policy["metrics"]:
        if m not in primary:
            problems.append(f"gate.metrics: {m} is not a tested metric of this run (its primary metrics: "
                            f"{', '.join(primary) or 'none'})")
    for c in policy["conditions"] or []:
        if c not in condition_ids(summary):
            problems.append(f"gate.conditions: {c} is not a condition of this run ({', '.join(condition_ids(summary))})")
    if policy["conditions"] is not None and not gated_conditions(summary, policy):
        problems.append("gate.conditions: no condition of this run is gated")
    if policy["fail_slower_than"] < float(params["noise"]) - 1e-12:
        problems.append(f"gate.fail_slower_than: {policy['fail_slower_than']:g} is below the run's stats.noise "
                        f"{float(params['noise']):g}: the run's intervals make no claim that small (lower stats.noise "
                        "and run again)")
    return problems


def run_problems(summary: dict, policy: dict) -> list[str]:
    """Why the run cannot be judged under *policy* (empty: it can): the policy's own problems, then
    per candidate the gated cells' records: excluded (a failed gate or validation case), unpaired,
    invalid or missing pairs; and rounds a fixed-rounds run planned but did not measure."""
    problems = policy_problems(summary, policy)
    if problems:
        return problems
    conds = set(gated_conditions(summary, policy))
    rounds = (summary.get("run") or {}).get("rounds") or {}
    if rounds and not rounds.get("adaptive") and rounds.get("run", 0) < rounds.get("planned", 0):
        problems.append(f"missing records: {rounds['run']} of {rounds['planned']} planned rounds were measured")
    for cand in summary["candidates"]:
        pair = summary["comparisons"][cand]
        arms = (pair["baseline"], cand)
        disc = pair["disclosures"]
        bad = [e for e in disc["excluded"] if e["arm"] in arms and e["condition"] in conds
               and not str(e["reason"]).startswith("superseded")]
        if bad:
            e = bad[0]
            problems.append(f"{len(bad)} record(s) of {' and '.join(sorted({b['arm'] for b in bad}))} failed a gate or "
                            f"a validation case and were excluded (first: {e['arm']} round {e['round']} at "
                            f"{e['condition']}: {e['reason']})")
        lone = [u for u in disc["unpaired"] if u["condition"] in conds]
        if lone:
            u = lone[0]
            problems.append(f"missing records: {len(lone)} round(s) have one arm only (first: {u['arm']} round "
                            f"{u['round']} at {u['condition']})")
        for cond in sorted(conds, key=condition_ids(summary).index):
            for metric in policy["metrics"]:
                cell = pair["paired"].get(cond, {}).get(metric)
                where = f"{cand} {metric} at {cond}"
                if cell is None:
                    problems.append(f"missing records: the summary has no comparison of {where}")
                elif cell["n_pairs"] == 0:
                    problems.append(f"missing records: {where} has no valid pair")
                elif cell["n_invalid_pairs"]:
                    problems.append(f"missing records: {where} has {cell['n_invalid_pairs']} pair(s) with a missing "
                                    "or non-positive value")
    return problems


# --- one cell --------------------------------------------------------------------------------------

def slowdown_bound(cell: dict) -> float | None:
    """The largest slowdown the interval allows, a fraction (0.07 = 7% slower at its slower end);
    None when the interval is unbounded."""
    if cell["ci_low"] is None or cell["ci_high"] is None:
        return None
    return 1.0 - cell["ci_low"] if cell["higher_is_better"] else cell["ci_high"] - 1.0


def judge_cell(cell: dict, threshold: float) -> tuple[str, str]:
    """``(outcome, rule)`` of one paired cell under the threshold (see the module doc), each end of its
    interval read by the one verdict rule (:func:`pairbench.analysis.verdicts.read_ratio`) against
    the band 1 ± *threshold*: the end nearer to "no change" beyond it on the slower side is a
    regression, the farther end alone an inconclusive cell."""
    low, high, up = cell["ci_low"], cell["ci_high"], cell["higher_is_better"]
    bound = f"1 - {threshold:g}" if up else f"1 + {threshold:g}"
    if low is None or high is None:
        return "inconclusive", f"no interval is bounded with {cell['n_pairs']} pairs: a slowdown is not ruled out"
    near, far = (high, low) if up else (low, high)
    side = "below" if up else "above"
    if _slower(near, threshold, up):
        return "regression", f"fail_slower_than: the interval lies wholly {side} {bound}"
    if _slower(far, threshold, up):
        return "inconclusive", f"the interval reaches {side} {bound}: a slowdown that large is not ruled out"
    return "pass", f"the interval rules out a slowdown beyond {bound}"


def _slower(ratio: float, threshold: float, higher_is_better: bool) -> bool:
    return read_ratio(ratio, noise=threshold, higher_is_better=higher_is_better).verdict == SPEED_WORDS["worse"]


def cells(summary: dict, policy: dict) -> list[dict]:
    """Every gated cell, in candidate, condition and metric order, judged."""
    out = []
    for cand in summary["candidates"]:
        pair = summary["comparisons"][cand]
        for cond in gated_conditions(summary, policy):
            for metric in policy["metrics"]:
                p = pair["paired"][cond][metric]
                outcome, rule = judge_cell(p, policy["fail_slower_than"])
                out.append({"candidate": cand, "condition": cond, "metric": metric,
                            "unit": pair["metrics"][metric]["unit"], "higher_is_better": p["higher_is_better"],
                            "verdict": p["verdict"], "outcome": outcome, "rule": rule,
                            "slowdown_bound": slowdown_bound(p), **{k: p[k] for k in CELL_NUMBERS}})
    return out


# --- the cost channel ------------------------------------------------------------------------------

def judge_cost(cell: dict, threshold: float) -> tuple[str, str]:
    """``(outcome, rule)`` of one gated cost cell: its ratio is exact (a count has no sampling error),
    so it is read, by the one verdict rule, against the band 1 + *threshold* alone; a cell the channel
    cannot see the change in (``not exercised``) or did not count (``unavailable``) rules nothing out."""
    if cell["verdict"] == UNAVAILABLE:
        return "inconclusive", f"the cost channel did not count it: {cell['why']}"
    if cell["verdict"] == "not exercised":
        return "inconclusive", "the change runs nothing the simulator counts, so no slowdown is ruled out"
    if _slower(cell["ratio"], threshold, False):
        return "regression", f"gate.cost_metrics: the count per token is above 1 + {threshold:g}"
    return "pass", f"the count per token is not above 1 + {threshold:g}"


def _missing_cost_cell(cost: dict, summary: dict, cand: str, cond: str, metric: str) -> dict:
    """A gated cost cell that ``stats/cost.json`` has no row for: an arm not counted, or a condition
    the channel did not count (config ``cost.conditions``, ``cost.phases``)."""
    arms = cost["arms"]
    lost = [f"{a} not counted ({arms[a]['reason']})" for a in (summary["baseline"], cand)
            if (arms.get(a) or {}).get("status") != "counted"]
    wall, cell = pb_cost.wall_cell(summary, cand, cond, COST_METRICS[metric].question)
    paired = cell or {}
    return {"candidate": cand, "condition": cond, "metric": metric, "verdict": UNAVAILABLE, "ratio": None,
            "baseline_per_tok": None, "candidate_per_tok": None, "wall_metric": wall,
            "wall_verdict": paired.get("verdict"), "agreement": "undecided",
            "why": "; ".join(lost) or "the channel counted no such row (cost.conditions, cost.phases)"}


def cost_record(cost: dict | None, summary: dict, policy: dict) -> dict | None:
    """``gate.json``'s ``cost``: the cost channel's verdicts (*cost*: the ``stats/cost.json`` body) at the
    gated conditions beside the wall-clock ones, each cell ``gated`` when its metric is one of
    ``gate.cost_metrics`` (then judged: :func:`judge_cost`; else ``outcome`` null, shown only), a gated
    cell the channel did not count added as ``unavailable``; and each arm's status. None: no channel."""
    if cost is None:
        return None
    conds = gated_conditions(summary, policy)
    gated = policy["cost_metrics"]
    rows = {(r["candidate"], r["condition"], r["metric"]): r for r in cost["rows"] if r["condition"] in conds}
    cells = [{**{k: r[k] for k in COST_CELL}, "why": None} for r in rows.values()]
    cells += [_missing_cost_cell(cost, summary, cand, cond, m) for cand in summary["candidates"] for cond in conds
              for m in gated if (cand, cond, m) not in rows]
    for c in cells:
        outcome, rule = judge_cost(c, policy["fail_slower_than"]) if c["metric"] in gated else (None, "shown, not gated")
        c.update(gated=c["metric"] in gated, outcome=outcome, rule=rule)
    return {"cells": cells, "arms": {a: {"status": b["status"], "reason": b["reason"]} for a, b in cost["arms"].items()}}


def cost_body(record: dict | None) -> dict | None:
    """The part of a ``stats/cost.json`` body that :func:`cost_record` reads, back from a record
    (``verify`` of a bundle alone: the cost verdicts themselves are checked against their inputs in
    the run folder, :mod:`pairbench.publish.costcheck`)."""
    if record is None:
        return None
    return {"arms": record["arms"], "rows": [{k: c[k] for k in COST_CELL} for c in record["cells"]
                                              if c["verdict"] != UNAVAILABLE]}


def _cost_where(c: dict) -> str:
    ratio = "" if c["ratio"] is None else f" ({c['ratio']:.4f}x)"
    return f"{c['candidate']} {c['metric']} at {c['condition']}{ratio}"


def cost_note(record: dict | None) -> str:
    """What the reason adds about the cost channel: its slower rows that do not decide, and, gated or
    not, what it could not judge (not exercised, arms not counted), so that none of these reads as part
    of a "no regression" claim unsaid. Empty when the run has no channel or nothing to say."""
    if record is None:
        return ""
    cells = record["cells"]
    parts = []
    slower = [c for c in cells if not c["gated"] and c["verdict"] == "slower"]
    if slower:
        parts.append(f"the cost channel (shown, not gated: gate.cost_metrics) calls {_cost_where(slower[0])} "
                     f"slower{_more(slower)}")
    blind = [c for c in cells if c["verdict"] == "not exercised"]
    if blind:
        parts.append(f"the cost channel cannot see the change in {_cost_where(blind[0])}{_more(blind)} "
                     "(not exercised)")
    lost = [f"{a} ({b['reason']})" for a, b in record["arms"].items() if b["status"] != "counted"]
    if lost:
        parts.append(f"the cost channel did not count {', '.join(lost)}")
    return "".join(f"; {p}" for p in parts)


# --- the decision ----------------------------------------------------------------------------------

def interval_text(c: dict) -> str:
    if c["ci_low"] is None:
        return f"{_ratio(c['hl_ratio'])} with no bounded interval"
    return f"{_ratio(c['hl_ratio'])} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.3f}x"


def _where(c: dict) -> str:
    return f"{c['candidate']} {c['metric']} at {c['condition']}"


def _more(items: list) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def decision(cell_list: list[dict], policy: dict, cost: dict | None = None) -> tuple[str, str]:
    """``(decision, reason)`` from judged cells (a run without problems) and the cost record
    (:func:`cost_record`), whose gated cells decide beside the wall-clock ones; the reason ends with
    :func:`cost_note`."""
    verdict, reason = _decision(cell_list, [c for c in (cost or {}).get("cells", []) if c["gated"]], policy)
    return verdict, reason + cost_note(cost)


def _inconclusive_words(c: dict) -> str:
    if "n_pairs" not in c:  # a cost cell
        return f"the cost channel's {_cost_where(c)} is {c['verdict']}: {c['rule']}"
    need = f"; about {c['rounds_needed']} rounds would resolve it" if c["rounds_needed"] else ""
    return f"{_where(c)} is {interval_text(c)} over {c['n_pairs']} rounds{need}"


def _decision(cell_list: list[dict], cost_cells: list[dict], policy: dict) -> tuple[str, str]:
    t = f"{policy['fail_slower_than']:.2%}".replace(".00%", "%")
    reg = [c for c in cell_list if c["outcome"] == "regression"]
    cost_reg = [c for c in cost_cells if c["outcome"] == "regression"]
    inc = [c for c in (*cell_list, *cost_cells) if c["outcome"] == "inconclusive"]
    n = len(cell_list) + len(cost_cells)
    if reg:
        c = reg[0]
        return "regression", (f"a slowdown beyond {t}: {_where(c)} is {interval_text(c)}, over {c['n_pairs']} "
                              f"rounds{_more(reg)}")
    if cost_reg:
        c = cost_reg[0]
        return "regression", (f"a slowdown beyond {t} in the cost channel (gate.cost_metrics): {c['candidate']} "
                              f"{c['metric']} at {c['condition']} counts {c['ratio']:.4f}x the baseline's per token "
                              f"(wall time: {c['wall_verdict'] or 'not compared'}){_more(cost_reg)}")
    if inc:
        what = f"{len(inc)} of {n} gated cells could not rule out a slowdown beyond {t}: {_inconclusive_words(inc[0])}"
        if policy["inconclusive"] == "fail":
            return "inconclusive", f"{what}; the policy fails an inconclusive result"
        return "pass", f"no slowdown beyond {t} shown, but {what}"
    return "pass", f"all {n} gated cells rule out a slowdown beyond {t}"


def arms_facts(plan: dict, sources: dict) -> dict:
    """Per arm: its role, engine and what was measured (a git source's ref and shas; patches by name)."""
    out = {}
    for name, arm in plan["arms"].items():
        src = sources[name]
        git = src.get("git")
        kind = "git" if git else ("installed" if src["source"] is None else "path")
        out[name] = {"role": "baseline" if name == plan["baseline"] else "candidate", "engine": arm["engine"],
                     "source": kind, "ref": git["ref"] if git else None, "commit": git["commit"] if git else None,
                     "tree": git["tree"] if git else None, "version": src["version"],
                     "patches": [p["path"].rsplit("/", 1)[-1] for p in src["patches"]],
                     "tree_sha256": src["patched"]["tree_sha256"]}
    return out


def host_facts(environment: dict) -> dict:
    """The public facts of the measuring host, as ``environment.json`` publishes them."""
    return {k: environment.get(k) for k in HOST_FACTS}


def decide(summary: dict, gate: dict | None, *, label: str, arms: dict, host: dict, inputs: dict,
           cost: dict | None = None) -> dict:
    """The ``gate.json`` body: the policy as applied, every gated cell judged, the cost channel's
    cells (*cost*: the ``stats/cost.json`` body, when the run has one: :func:`cost_record`), the
    decision, its exit status and its reason, with the arms' shas (:func:`arms_facts`) and the host
    (:func:`host_facts`)."""
    policy = Policy.from_config(gate).resolved(summary)
    problems = run_problems(summary, policy)
    if policy["cost_metrics"] and cost is None:
        problems.append(f"gate.cost_metrics: {', '.join(policy['cost_metrics'])} gated, but the run has no cost "
                        "channel (config cost.enabled, a single-stream run: docs/cost.md)")
    judged = [] if problems else cells(summary, policy)
    record = None if problems else cost_record(cost, summary, policy)
    if problems:
        verdict, reason = "invalid", f"the run is not valid: {problems[0]}{_more(problems)}"
    else:
        verdict, reason = decision(judged, policy, record)
    rounds = (summary.get("run") or {}).get("rounds") or {}
    return {"label": label, "policy": policy, "decision": verdict, "exit_code": EXIT[verdict], "reason": reason,
            "problems": problems, "baseline": summary["baseline"], "candidates": list(summary["candidates"]),
            "cells": judged, "cost": record, "arms": arms, "host": host, "report": REPORT,
            "stats": {k: summary["params"][k] for k in ("alpha", "noise", "multiplicity")},
            "rounds": {"planned": rounds.get("planned"), "run": rounds.get("run"),
                       "adaptive": rounds.get("adaptive"),
                       "stopped_by": (rounds.get("budget") or {}).get("stopped_by")},
            "inputs": inputs}


# --- verify: the published gate.json against the bundle's own measurements ------------------------

def gate_problems(published: dict, summary: dict, cost: dict | None = None) -> list[str]:
    """Problems with a published ``gate.json`` against *summary* (recomputed from the bundle's
    measurements): the decision, its reason and every cell must be what the recorded policy gives.
    *cost*: the run's ``stats/cost.json`` body; without it (a bundle alone) the record's own cost
    cells are taken as the channel's verdicts (:func:`cost_body`), and their judging is checked."""
    try:
        want = decide(summary, _as_config(published["policy"]), label=published["label"], arms=published["arms"],
                      host=published["host"], inputs=published["inputs"],
                      cost=cost if cost is not None else cost_body(published.get("cost")))
    except (GateError, KeyError, TypeError) as exc:
        return [f"gate.json: cannot be recomputed: {exc}"]
    problems = []
    for key in ("decision", "exit_code", "reason", "problems", "policy", "baseline", "candidates"):
        if published.get(key) != want[key]:
            problems.append(f"gate.json: {key} is {published.get(key)!r}, the measurements give {want[key]!r}")
    problems += _cost_record_problems(published.get("cost"), want["cost"])
    got_cells = published.get("cells") or []
    if len(got_cells) != len(want["cells"]):
        return problems + [f"gate.json: {len(got_cells)} cells, the measurements give {len(want['cells'])}"]
    for i, (got, exp) in enumerate(zip(got_cells, want["cells"])):
        for key, value in exp.items():
            if not _same(got.get(key), value):
                problems.append(f"gate.json: cells[{i}] ({_where(exp)}): {key} is {got.get(key)!r}, the measurements "
                                f"give {value!r}")
    return problems


def _cost_record_problems(got: dict | None, want: dict | None) -> list[str]:
    if (got is None) != (want is None) or (want is not None and (got["arms"] != want["arms"]
                                                                 or len(got["cells"]) != len(want["cells"]))):
        return [f"gate.json: cost is {got!r}, the cost channel's verdicts give {want!r}"]
    problems = []
    for i, (g, exp) in enumerate(zip((got or {}).get("cells", []), (want or {}).get("cells", []))):
        problems += [f"gate.json: cost.cells[{i}] ({exp['candidate']} {exp['metric']} at {exp['condition']}): {key} is "
                     f"{g.get(key)!r}, the cost channel's verdicts give {value!r}"
                     for key, value in exp.items() if not _same(g.get(key), value)]
    return problems


def _as_config(policy: dict) -> dict:
    return {k: policy[k] for k in POLICY_KEYS if k in policy}


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b
