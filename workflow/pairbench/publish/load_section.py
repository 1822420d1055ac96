"""The report's "## Load" section, in plain language, from ``stats/summary.json`` alone.

A load run's verdicts per level are the statistics section's (a level is a condition); this section
says what they mean along each curve (where the candidate helps, hurts or changes nothing), the SLO
capacity comparison in words (with censoring, and the levels that would bracket a capacity the run
did not), the SLO and prefix disclosures, and per level and arm the facts that say whether a level
was the engine's: how many of its records were valid, the load achieved, the schedule lag and the
client's CPU. ``python -m pairbench verify`` regenerates it from the bundle's measurements and
recorded parameters and checks the README holds it verbatim. What only the measure artifacts know
(the idle wait, the cache state, queueing beyond the slots) is :func:`run_lines`, outside it.
"""

from __future__ import annotations

import statistics

from pairbench.core.conditions import BY_NAME, parse_id
from pairbench.core.metrics import ACHIEVED_LOAD, METRICS, NAMES
from pairbench.core.slo import BOUND_WORDS, BOUNDS

HEADING = "## Load"


def _num(x: float) -> str:
    """A level as the config gives it (``8``, ``0.5``), an interpolated capacity to 3 decimals' worth."""
    return f"{x:g}" if float(x).is_integer() else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _unit(factor: str, x: float) -> str:
    return f"{_num(x)} stream{'s' if x != 1 else ''}" if factor == "concurrency" else f"{_num(x)} requests/s"


def _list(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _slo_words(slo: dict) -> str:
    bounds = [f"{BOUND_WORDS[k]} ≤ {slo[k]:g} ms" for k in BOUNDS if slo.get(k) is not None]
    if not bounds:
        return "SLO: none given (no goodput, no capacity)."
    return (f"SLO: {_list(bounds)}; it holds at a level when at least {slo['attainment']:.0%} of the level's "
            "measured requests meet every bound (vLLM's goodput rule; a failed request never does).")


def curve_lines(summary: dict, factor: str) -> list[str]:
    """Per candidate and primary metric: where along the load the verdicts say faster, slower,
    equivalent or inconclusive, with the range of the estimated changes."""
    out = []
    for cand in summary["candidates"]:
        pair = summary["comparisons"][cand]
        for metric in summary["params"]["primary"]:
            by: dict[str, list[tuple[float, float | None]]] = {}
            for c in pair["conditions"]:
                p = pair["paired"].get(c["id"], {}).get(metric)
                cond = parse_id(c["id"])
                if p is None or cond.load is None:
                    continue
                by.setdefault(p["verdict"], []).append((float(cond.load[1]), p["hl_ratio"]))
            parts = []
            for verdict in ("faster", "slower", "equivalent", "inconclusive"):
                pts = sorted(by.get(verdict, []))
                if not pts:
                    continue
                where = _list([_unit(factor, x) for x, _ in pts])
                changes = [r - 1 for _, r in pts if r is not None]
                span = ""
                if verdict in ("faster", "slower") and changes:
                    lo, hi = min(changes), max(changes)
                    span = f" ({lo:+.1%})" if lo == hi else f" ({lo:+.1%} to {hi:+.1%})"
                parts.append(f"**{verdict}** at {where}{span}")
            if parts:
                out.append(f"- `{cand}`, {METRICS[metric].label} (`{metric}`): {'; '.join(parts)}.")
    return out


def _per_arm(rounds: list[dict], side: str, factor: str) -> str:
    caps = [r[side] for r in rounds]
    points = [c["capacity"] for c in caps if c["censored"] is None]
    above = sum(c["censored"] == "above" for c in caps)
    below = sum(c["censored"] == "below" for c in caps)
    text = (f"median {_unit(factor, statistics.median(points))} over {len(points)} round(s) that crossed the SLO"
            if points else "no round crossed the SLO inside the levels")
    if above:
        top = max(c["capacity"] for c in caps if c["censored"] == "above")
        text += f"; at least {_unit(factor, top)} in {above} round(s) (the SLO held at every level)"
    if below:
        low = min(c["capacity"] for c in caps if c["censored"] == "below")
        text += f"; below {_unit(factor, low)} in {below} round(s) (it failed already at the lowest level)"
    if any(c["non_monotone"] for c in caps):
        text += "; the curve held the SLO again above a failing level in some round (the first crossing counts)"
    return text


def capacity_lines(summary: dict, load: dict) -> list[str]:
    """The capacity comparison of every candidate and curve, in words."""
    cap, factor = load["capacity"], load["factor"]
    out = [f"Capacity is the highest load at which the SLO holds, per arm and round, interpolated between the "
           f"two levels around its crossing and never extrapolated, from each round's own visit (a level where "
           f"the engine failed requests counts, as the SLO failing there; one the client paced does not, nor a "
           f"validation retry's); the paired ratio candidate/baseline has a "
           f"Hodges–Lehmann interval inverting the exact Wilcoxon signed-rank test, a censored round entering at "
           f"its worst case; the {cap['family_size']} capacity comparison(s) are a Holm family of their own.", ""]
    for cand in summary["candidates"]:
        for group, e in cap["comparisons"].get(cand, {}).items():
            out.append(capacity_sentence(cand, group, e, factor, summary["baseline"]))
    return out + [""]


def capacity_sentence(cand: str, group: str, e: dict, factor: str, baseline: str) -> str:
    v = e["verdict"]
    head = f"- `{cand}` on `{group}`: **{v}**"
    if not e["n_pairs"]:
        return f"{head}: {e['reason']}."
    lo, hi = e.get("ci_low"), e.get("ci_high")
    ci = (f"{e['ci_level']:.2%} interval {lo:.3f}–" + ("unbounded" if hi is None else f"{hi:.3f}")) if lo is not None \
        else f"no {e['ci_level']:.2%} interval is bounded with {e['n_pairs']} rounds"
    if e.get("hl_ratio") is not None:
        est = f"ratio {e['hl_ratio']:.3f}"
    else:
        est = f"ratio between {e['hl_ratio_low']:.3f} and " + (
            "unbounded" if e["hl_ratio_high"] is None else f"{e['hl_ratio_high']:.3f}")
    if v == "more":
        words = (f"serves {e['hl_ratio'] - 1:.1%} more load under the SLO" if e.get("hl_ratio") is not None else
                 f"serves at least {lo - 1:.1%} more load under the SLO")
    elif v == "less":
        words = (f"serves {1 - e['hl_ratio']:.1%} less load under the SLO" if e.get("hl_ratio") is not None else
                 f"serves at least {1 - hi:.1%} less load under the SLO")
    elif v == "equivalent":
        words = "serves the same load under the SLO, within the threshold"
    else:
        words = e["reason"]
    line = f"{head}: {words} ({est}, {ci}; n = {e['n_pairs']} rounds, {e['n_censored']} censored)."
    line += (f" Per arm: `{baseline}` {_per_arm(e['rounds'], 'baseline', factor)}; `{cand}` "
             f"{_per_arm(e['rounds'], 'candidate', factor)}.")
    br = e["bracketing"]
    if br["above"] or br["below"]:
        levels = [*br["below"], *br["above"]]
        line += f" Add {_list([_unit(factor, x) for x in levels])} to bracket the capacity the levels did not."
    if br.get("note"):
        line += f" Note: {br['note']}."
    return line


def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def level_table(summary: dict, load: dict) -> list[str]:
    """Per level and arm: valid records, achieved load, p99 schedule lag, client CPU, exclusions."""
    achieved = ACHIEVED_LOAD[load["factor"]]
    rows = ["| level | arm | valid | achieved load (median) | p99 lag ms (max) | client CPU share (median, max) | excluded |",
            "|---|---|---:|---:|---:|---:|---|"]
    for c in summary["conditions"]:
        for arm, f in load["facts"].get(c["id"], {}).items():
            excluded = "; ".join(f"{n}× {r}" for r, n in sorted(f["excluded"].items())) or "–"
            rows.append(f"| `{c['id']}` | `{arm}` | {f['selected']}/{f['levels']} | {_fmt(f[achieved]['median'], '.3g')} | "
                        f"{_fmt(f[NAMES.lag_p99_ms]['max'], '.1f')} | {_fmt(f[NAMES.client_cpu_share]['median'], '.3f')}, "
                        f"{_fmt(f[NAMES.client_cpu_share]['max'], '.3f')} | {excluded} |")
    return rows + [""]


def load_section(summary: dict) -> str:
    """The Load section of a load run's report ("" for a single-stream run)."""
    load = summary.get("load")
    if not load:
        return ""
    factor = load["factor"]
    levels = [parse_id(c["id"]).load[1] for c in summary["conditions"] if parse_id(c["id"]).load]
    words = BY_NAME[factor].phrase.split("{}")[1].strip()
    out = [HEADING, "",
           f"A load run: every visit measured each level ({'closed loop' if factor == 'concurrency' else 'open loop'}, "
           f"{_list(sorted({f'{x:g}' for x in levels}, key=float))} {words}) on one server launch, in an order "
           "counterbalanced across rounds (forward in one block of the visit order, reversed in the next); a level is a condition, so the verdicts above "
           "are per level. " + _slo_words(load["slo"]),
           "",
           ("Prompts: every request had a prompt of its own, starting with its own salt, so no request could "
            "reuse another's prefix." if load["prefix"] == "distinct" else
            "Prompts: **shared prefix**: every request of a level sent the same prompt (load.prefix: shared), so an "
            "engine with a prefix cache could reuse it; read the figures as a shared-prefix workload."), ""]
    curve = curve_lines(summary, factor)
    if curve:
        out += ["### Along the curve", "", *curve, ""]
    if load["capacity"] is not None:
        out += ["### SLO capacity", "", *capacity_lines(summary, load)]
    out += ["### Levels", "",
            "A level counts only when every request completed, the client kept the pace (p99 schedule lag, its "
            "CPU share of a core) and the achieved load was the target's; the others are excluded, listed here "
            "and never drawn as the engine's curve.", "", *level_table(summary, load)]
    return "\n".join(out).rstrip() + "\n"
