"""The report's "## Statistics" section, in plain language, from ``stats/summary.json`` alone.

Every verdict was computed once, in :mod:`pairbench.analysis.stats`; this module only words it.
Every sentence that states a property of the run (rounds, repeats, multiplicity, exclusions, the
cold-cache policy, external load, how the run stopped) is computed from the summary, which the
statistics stage computed from the records. ``python -m pairbench verify`` regenerates this
section from the bundle's ``tables/measurements.csv`` and recorded parameters and checks the
README holds it verbatim.
"""

from __future__ import annotations

from pairbench.core.conditions import label as condition_label
from pairbench.core.metrics import METRICS


def _pct(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else f"{x * 100:{spec}}%"


def _change_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.2f}%"


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "n/a" if x is None else format(x, spec)


def _bytes(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def _interval(p: dict) -> str:
    if p["ci_low"] is None:
        return f"no {p['ci_level']:.2%} interval is bounded with {p['n_pairs']} pairs"
    return (f"{p['ci_level']:.2%} interval {_fmt(p['ci_low'], '.4f')}–{_fmt(p['ci_high'], '.4f')}, "
            f"half-width ±{_pct(p['half_width'])}")


def _at(summary: dict, cond: str) -> str:
    """``at <condition's words>`` of a condition id (*summary*: a pair body or the whole summary)."""
    return f"at {condition_label(next(c for c in summary['conditions'] if c['id'] == cond))}"


def verdict_sentence(summary: dict, cond: str, metric: str, p: dict, candidate: str = "the candidate") -> str:
    """One line per tested comparison, the verdict first (*summary*: a pair body or the whole summary)."""
    noise = summary["params"]["noise"]
    what = f"{METRICS[metric].label} (`{metric}`) {_at(summary, cond)}"
    est = (f"ratio {_fmt(p['hl_ratio'], '.4f')} ({_interval(p)}; n = {p['n_pairs']} pairs, "
           f"Wilcoxon p = {_fmt(p['p_value'], '.3g')})")
    v = p["verdict"]
    if v in ("faster", "slower"):
        change = p["hl_ratio"] - 1.0
        direction = "higher" if change > 0 else "lower"
        who = candidate if candidate == "the candidate" else f"`{candidate}`"
        return (f"- **{v}**: {what} is {abs(change) * 100:.1f}% {direction} for {who}: {est}; "
                f"the interval lies wholly beyond 1 ± {noise:g}.")
    if v == "equivalent":
        return f"- **equivalent**: {what}: no change larger than {noise:.1%}: {est}."
    more = []
    if p["detectable_change"] is not None:
        more.append(f"this run would detect a change of about {_pct(p['detectable_change'])} or more "
                    "(about 80% of the time)")
    if p["rounds_needed"] is not None:
        n = p["rounds_needed"]
        more.append(f"about {n} pairs would likely resolve it" if n <= 1000 else
                    "the estimate lies so near the threshold that no practical number of pairs would resolve it "
                    f"(about {n:,})")
    return (f"- **inconclusive**: {what}: {est}; {p['reason']}" + ("; " + "; ".join(more) if more else "") + ".")


def memory_sentence(summary: dict, cond: str, metric: str, m: dict) -> str:
    """One line per memory comparison of a pair body (*summary*)."""
    what = f"{METRICS[metric].label} (`{metric}`) {_at(summary, cond)}"
    if m["ratio"] is None:
        return f"- {what}: {m['reason']}."
    nums = (f"`{summary['candidate']}` {_bytes(m['candidate'])} against `{summary['baseline']}` "
            f"{_bytes(m['baseline'])}")
    if m["exact"]:
        return (f"- **{m['verdict']}**: {what}: {nums}, exactly {m['ratio']:.4f}× "
                f"({m['ratio'] - 1:+.1%}); the same in every selected record of each arm, so no test.")
    t = m["test"]
    return f"- **{m['verdict']}**: {what}: {nums} (medians); ratio {m['ratio']:.4f} ({_interval(t)})."


def _conditions(summary: dict) -> list[str]:
    """Condition ids in plan order (a summary read back from JSON has its keys sorted as text)."""
    return [c["id"] for c in summary["conditions"]]


def _ordered(summary: dict, section: str, roles: tuple[str, ...]) -> list[tuple[str, str, dict]]:
    """(condition, metric, entry) of *section* in plan order, metrics in the order the params list them."""
    prm = summary["params"]
    names = [m for role in roles for m in prm[role]]
    table = summary.get(section, {})
    return [(c, m, table[c][m]) for c in _conditions(summary) if c in table for m in names if m in table[c]]


def _pairs(summary: dict) -> list[tuple[str, dict]]:
    """(candidate, pair body) in the summary's order."""
    return [(c, summary["comparisons"][c]) for c in summary["candidates"]]


def _family_line(summary: dict) -> str:
    prm = summary["params"]
    m, method = prm["family_size"], prm["multiplicity"]
    tested = [p for _, pair in _pairs(summary) for _, _, p in _ordered(pair, "paired", ("primary",))]
    if method == "none" or m <= 1:
        return (f"Multiplicity: not corrected ({'one comparison' if m == 1 else 'stats.multiplicity: none'}); "
                f"each of the {m} tested comparisons is at level {1 - prm['alpha']:.0%}.")
    levels = sorted({round(p["ci_level"], 6) for p in tested})
    name = "Holm's step-down procedure" if method == "holm" else "Bonferroni"
    k = len(summary["candidates"])
    span = (f"{k} candidates × primary metrics × conditions, one family" if k > 1
            else "primary metrics × conditions")
    return (f"Multiplicity: {name} across the {m} primary comparisons ({span}), "
            f"family-wise error ≤ {prm['alpha']:g}; each interval is stated at the level it was judged at "
            f"({', '.join(f'{lv:.2%}' for lv in levels)}).")


def verdict_table(summary: dict) -> list[str]:
    """One markdown table of every candidate's tested comparisons, the verdict first."""
    out = ["| candidate | condition | metric | verdict | ratio | interval (level) | pairs |",
           "|---|---|---|---|---:|---|---:|"]
    for cand, pair in _pairs(summary):
        for cond, metric, p in _ordered(pair, "paired", ("primary",)):
            ci = ("unbounded" if p["ci_low"] is None else
                  f"{_fmt(p['ci_low'], '.4f')}–{_fmt(p['ci_high'], '.4f')} ({p['ci_level']:.2%})")
            out.append(f"| `{cand}` | `{cond}` | `{metric}` | **{p['verdict']}** | {_fmt(p['hl_ratio'], '.4f')} | "
                       f"{ci} | {p['n_pairs']} |")
    return out


def budget_line(b: dict, target: float | None) -> str:
    """The time budget: what the rounds took, what it bought, what a next run would need."""
    halves = [h["half_width"] for h in b["half_widths"]]
    bought = ("no primary interval was bounded" if not halves or any(h is None for h in halves) else
              f"half-widths of ±{min(halves):.1%} to ±{max(halves):.1%}")
    spent = ("no budget" if b["max_minutes"] is None else f"budget {b['max_minutes']:g} min")
    used = "" if b["used_minutes"] is None else f"; the rounds took {b['used_minutes']:.1f} min"
    stop = f", stopped by the {b['stopped_by']}" if b.get("stopped_by") else ""
    line = f"- Time: {spent}{used}{stop}; they bought {bought} (at level {1 - b['width_level']:.2%})"
    if target is not None and b.get("rounds_for_target") is not None:
        line += (f"; for ±{target:.1%} a next run would need about {b['rounds_for_target']} rounds"
                 + ("" if b.get("minutes_for_target") is None else
                    f" (about {b['minutes_for_target']:.0f} min at this run's pace)"))
    return line + "."


def run_lines(summary: dict) -> list[str]:
    """What the pipeline stamped about the run (summary["run"]), each a computed sentence."""
    run = summary.get("run")
    if not run:
        return []
    out = []
    r = run.get("rounds")
    if r:
        if r.get("adaptive"):
            out.append(f"- Rounds: adaptive, {r['min']} to {r['max']} in blocks of {r['block']} "
                       f"(target half-width ±{r['target_halfwidth']:.1%} for every primary comparison); "
                       f"{r['run']} run; {r['stop_reason']}.")
        else:
            out.append(f"- Rounds: {r['run']} of {r['planned']} planned (fixed).")
        if r.get("budget"):
            out.append(budget_line(r["budget"], r.get("target_halfwidth")))
    rep = run.get("repeats")
    if rep and not summary.get("load"):  # a load run's unit is a visit's level, said above
        out.append(f"- Repeats: {rep} steady request(s) per condition per visit; the paired unit is the "
                   f"visit's median.")
    cc = run.get("cold_cache")
    if cc:
        if cc["unproven"]:
            how = ("included, because the config opts in (`gates.allow_unproven_cold_cache: true`)"
                   if cc["allowed"] else "excluded (`gates.allow_unproven_cold_cache` is false)")
            out.append(f"- Cold cache: {cc['unproven']} of {cc['records']} records have no server-side proof "
                       f"of a cold cache; they are {how}.")
        else:
            out.append(f"- Cold cache: proven by the engine's own counters for all {cc['records']} records.")
        for f in cc.get("cross_check", []):
            out.append(f"- Cold-cache cross-check ({f['arm']}): {f['detail']}")
    load = run.get("load")
    if load:
        if load["flagged"]:
            out.append(f"- External load: {len(load['flagged'])} of {load['visits']} visits started with a "
                       f"1-minute load average more than {load['threshold']:g} above this run's own (1): "
                       f"{', '.join(load['flagged'])}. They are kept (pairing protects the comparison) and "
                       "disclosed here.")
        elif load.get("visits"):
            out.append(f"- External load: none flagged in {load['visits']} visits (1-minute load average "
                       f"{load['min']:.2f}–{load['max']:.2f}).")
        waits = load.get("waits")
        if waits:
            out.append(f"- Quiet guard: {len(waits['waited'])} of {load['visits']} visits waited for the machine to "
                       f"quiet ({waits['waited_s']:.0f} s in all, at most {waits['max_wait_s']:g} s each)"
                       + (f"; {len(waits['timed_out'])} ran out of time and were measured anyway, flagged: "
                          f"{', '.join(waits['timed_out'])}" if waits["timed_out"] else "") + ".")
    pin = run.get("pinning")
    if pin:
        out.append(f"- CPU pinning: {pin}.")
    return out


def statistics_section(summary: dict) -> str:
    """The statistics section of the report, in plain language, followed by the disclosures."""
    base, cands = summary["baseline"], summary["candidates"]
    pairs = _pairs(summary)
    first = pairs[0][1]
    prm = summary["params"]
    many = len(cands) > 1
    out = ["## Statistics", ""]
    rep = max(pair["counts"].get("max_repeats", 1) for _, pair in pairs)
    unit = ("a visit's median over its repeats (at most " f"{rep} per condition)") if rep > 1 else "a visit's one request"
    if summary.get("load"):
        unit = "a visit's level: its figures over the level's measured requests"
    who = (f"Candidates {', '.join(f'`{c}`' for c in cands)}, each" if many else f"Candidate `{cands[0]}`")
    out.append(
        f"{who} against baseline `{base}`, paired by round; the paired unit is {unit}. "
        f"Ratios are candidate/baseline; for throughput (tok/s) higher is faster, for times (ms) lower is "
        f"faster. The estimate is the Hodges–Lehmann estimate of the log ratios, back-transformed; its "
        f"interval inverts the exact Wilcoxon signed-rank test, so the two cannot disagree. Verdicts, with "
        f"threshold {prm['noise']:g}: **faster**/**slower** when the interval lies wholly beyond 1 ± "
        f"{prm['noise']:g}, **equivalent** when wholly inside, **inconclusive** otherwise.")
    out.append("")
    out.append("Conditions: " + "; ".join(f"`{c['id']}` ({condition_label(c)})" for c in summary["conditions"]) + ".")
    out.append("")
    out.append(f"Tested (primary): {', '.join(f'`{m}`' for m in prm['primary'])}. "
               + (f"Shown, not tested (secondary): {', '.join(f'`{m}`' for m in prm['secondary'])}. "
                  if prm["secondary"] else "") + _family_line(summary))
    out.append("")
    runl = run_lines(summary)
    if runl:
        out += ["### The run", "", *runl, ""]
    out.append("### Verdicts")
    out.append("")
    if any(_ordered(pair, "paired", ("primary",)) for _, pair in pairs):
        out += [*verdict_table(summary), ""]
    else:
        out += ["No comparison had paired samples.", ""]
    for cand, pair in pairs:
        primary = _ordered(pair, "paired", ("primary",))
        if many and primary:
            out += [f"#### `{cand}`", ""]
        for cond, metric, p in primary:
            out.append(verdict_sentence(summary, cond, metric, p, cand))
        if primary:
            out.append("")
    for cand, pair in pairs:
        secondary = _ordered(pair, "paired", ("secondary",))
        if secondary:
            whose = f" (`{cand}`)" if many else ""
            out.append(f"Shown, not tested{whose} (each also answered by a primary metric above, or a sum of them):")
            out.append("")
            for cond, metric, p in secondary:
                out.append(f"- {METRICS[metric].label} (`{metric}`) {_at(summary, cond)}: ratio "
                           f"{_fmt(p['hl_ratio'], '.4f')} ({_interval(p)}).")
            out.append("")
    mem = [(pair, e) for _, pair in pairs for e in _ordered(pair, "memory", ("memory",))]
    if mem:
        out.append("### Memory")
        out.append("")
        for pair, (cond, metric, e) in mem:
            out.append(memory_sentence(pair, cond, metric, e))
        out.append("")
    out.append("### Per arm")
    out.append("")
    out.append("| arm | condition | metric | n | median | min | max | trimmed mean (drop/end) |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|")
    order = [*prm["primary"], *prm["secondary"], *prm["memory"]]
    for arm, pair in ((base, first), *((c, p) for c, p in pairs)):
        for cond in _conditions(pair):
            by_metric = pair["arms"][arm].get(cond, {})
            for metric in (m for m in order if m in by_metric):
                d = by_metric[metric]
                out.append(f"| {arm} | {cond} | {metric} | {d['n']} | {_fmt(d['median'])} | "
                           f"{_fmt(d['min'])} | {_fmt(d['max'])} | {_fmt(d['trimmed_mean'])} "
                           f"({d['trim_per_end']}) |")
    out.append("")
    out += disclosure_lines(summary)
    return "\n".join(out) + "\n"


def disclosure_lines(summary: dict) -> list[str]:
    """The disclosures: what every pair shares (rows, exclusions, retries: the one table) once; slow
    samples once per arm; what is a pair's own (disagreements, unpaired cells, dropped pairs) per
    candidate."""
    pairs = _pairs(summary)
    first = pairs[0][1]
    prm = summary["params"]
    slow_z = first["params"]["slow_z"]
    many = len(pairs) > 1
    out = ["### Disclosures", ""]
    slow = list({tuple(sorted(s.items())): s for _, pair in pairs for s in pair["disclosures"]["slow_samples"]}.values())
    if slow:
        out.append(f"Outlying samples (|robust z| > {slow_z:g}, z from the median absolute "
                   f"deviation), flagged and **retained** in every statistic above:")
        for s in slow:
            out.append(f"- {s['side']} sample: `{s['arm']}` {s['metric']} {_at(summary, s['condition'])}, "
                       f"round {s['round']}: {_fmt(s['value'])} (z={s['robust_z']:+.1f})")
    else:
        out.append(f"No outlying samples (|robust z| > {slow_z:g}).")
    out.append("")
    disagreements = [(c, d) for c, pair in pairs for d in pair["disclosures"]["median_trimmed_disagreements"]]
    if disagreements:
        out.append("The full-N median and the trimmed mean tell different stories here (sign, or "
                   f"more than {prm['noise'] * 100:g} percentage points apart); read the per-round ratios:")
        for c, d in disagreements:
            whose = f"`{c}`: " if many else ""
            out.append(f"- {whose}{d['metric']} {_at(summary, d['condition'])}: median change "
                       f"{_change_pct(d['median_change'])} against trimmed-mean change "
                       f"{_change_pct(d['trimmed_mean_change'])}"
                       + (" (opposite signs)" if d["sign_differs"] else ""))
    else:
        out.append("The full-N medians and trimmed means agree everywhere.")
    out.append("")
    counts = first["counts"]
    unpaired = sum(pair["counts"]["unpaired"] for _, pair in pairs)
    dropped = sum(pair["counts"].get("dropped_pairs", 0) for _, pair in pairs)
    kind = "level" if summary.get("load") else "steady"
    out.append(f"Records: {counts['rows']} {kind} rows, {counts['selected']} selected, "
               f"{counts['excluded']} excluded, {counts['retries']} retries, "
               f"{unpaired} unpaired, {dropped} pairs dropped.")
    disc = first["disclosures"]
    for e in disc["excluded"]:
        att = f", attempt {e['attempt']}" if e["attempt"] is not None else ""
        out.append(f"- excluded: `{e['arm']}` round {e['round']}, `{e['condition']}`{att}: "
                   f"{e['reason']}")
    for r in disc["retries"]:
        state = "used" if r["selected"] else "not used"
        what = []
        if r.get("retry"):
            what.append(f"validation retry {r['retry']}")
        if r["attempt"] > 1:
            what.append(f"attempt {r['attempt']} after an engine fault")
        out.append(f"- retry: `{r['arm']}` round {r['round']}, `{r['condition']}`, {' and '.join(what)} ({state})")
    for c, pair in pairs:
        partner = f"`{c}` against `{summary['baseline']}`" if many else "the other arm"
        for u in pair["disclosures"]["unpaired"]:
            out.append(f"- unpaired (partial visit): `{u['arm']}` round {u['round']}, `{u['condition']}` "
                       f"has no partner in {partner}; it counts in the per-arm figures only")
        for d in pair["disclosures"].get("dropped_pairs", []):
            whose = f" of `{c}`" if many else ""
            out.append(f"- pair dropped{whose}: round {d['round']}, `{d['condition']}`: the `{d['arm']}` cell was "
                       "re-measured by a validation retry after every visit, not next to its partner; it counts "
                       "in the per-arm figures only")
    if disc["other_arms"]:
        out.append(f"- rows of other arms ignored: {', '.join(disc['other_arms'])}")
    return out
