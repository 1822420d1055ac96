"""The report: ``publish/README.md``, in plain language, from the run's artifacts.

Sections: what was compared (arms, source versions, patches, native engine strings, model), how it
was measured (plan, visit order, gates), what passed (gates and validation, with every excluded
record and its reason), the statistics (``pairbench.stats.report_markdown``), client against
engine timings and how far they disagree, and — on their own — warmup and first-request
diagnostics, which never enter the statistics.

The text holds no paths, host names or raw outputs; the publish stage scrubs it and runs the leak
gate over it anyway.
"""

from __future__ import annotations

import math

import pandas as pd

LEAK_GATE_MARKER = "<!-- pairbench:leak-gate -->"


def _f(x, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def _pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


def compared_section(plan: dict, sources: dict, builds: dict) -> list[str]:
    rows = []
    for arm in plan["arms"]:
        s, b = sources[arm], builds[arm]
        patches = ", ".join(f"`{p['path'].split('/')[-1]}`" for p in s["patches"]) or "none"
        role = "baseline" if arm == plan["baseline"] else ("candidate" if arm == plan["candidate"] else "other")
        src = s["source"]
        if isinstance(src, dict):  # a git tag: the repository's name only, never its path or URL
            where = f"`{src['git'].rstrip('/').split('/')[-1].removesuffix('.git')}` @ {s['version']}"
            where += f" ({s['git']['commit'][:12]})" if s.get("git") else ""
        elif src is None:
            where = "installed package"
        else:
            where = f"`{src.split('/')[-1]}` @ {s['version']}"
        rows.append([f"`{arm}` ({role})", where, patches, f"`{b['native_version']}`", s["patched"]["tree_sha256"][:12]])
    out = ["## What was compared", ""]
    out += _table(["arm", "source @ version", "patches", "native engine", "source tree sha256"], rows)
    out.append(f"Model `{plan['model']['name']}`; every steady request had exactly the stated input length "
               f"(native tokens, chat template included) and generated exactly {plan['output_tokens']} tokens "
               "(greedy, end-of-sequence ignored, prefix cache off).")
    out.append("")
    for arm in plan["arms"]:  # engines other than the embedded one: how the cold cache was shown
        e = builds[arm].get("engine")
        if not e:
            continue
        strength = {"strong": "proven per request", "weak": "shown per request only by the absence of a "
                    "cached-token count (weak)", "none": "NOT proven: this engine gives no server-side evidence"}
        out.append(f"- `{arm}` runs engine `{e['engine']}`; cold cache {strength[e['cold_cache_proof']]}. "
                   f"{e.get('cold_cache_how', '')}")
    if any(builds[a].get("engine") for a in plan["arms"]):
        out.append("")
    return out


def plan_section(plan: dict, fixtures: dict) -> list[str]:
    rounds: dict[int, list[str]] = {}
    for v in plan["visits"]:
        rounds.setdefault(v["round"], []).append(v["arm"])
    order = " | ".join(" → ".join(arms) for _, arms in sorted(rounds.items()))
    out = ["## How it was measured", ""]
    out.append(f"- Input lengths: {', '.join(str(n) for n in plan['lengths'])} tokens; output: "
               f"{plan['output_tokens']} tokens; {plan['rounds']} paired rounds; seed {plan['seed']}.")
    out.append(f"- Visit order (`{plan['order']}`, fixed in plan.json before anything ran): {order}. Each visit "
               "launches the arm's server, sends one first request (a diagnostic, not a sample), one steady "
               "streamed request per length, then stops it.")
    out.append("- Each round's prompts start with a per-round salt, so no round can reuse an earlier round's "
               "prefix, while both arms of a round see identical tokens.")
    for n, fx in sorted(fixtures.items()):
        out.append(f"- Fixture {n}: task `{fx['task']}`, token ids identical on "
                   f"{', '.join(f'`{a}`' for a in fx['checked_by'])} for all {len(fx['rounds'])} rounds.")
    out.append(f"- Config sha256 `{plan['config_sha256'][:16]}…`.")
    out.append("")
    return out


def gates_section(measures: list[dict], validations: dict[str, dict], df: pd.DataFrame) -> list[str]:
    out = ["## Gates and validation", ""]
    records = [r for m in measures for r in m["records"]]
    flagged = [r for r in records if not r["ok"]]
    out.append(f"{len(records)} steady records; {len(records) - len(flagged)} passed every gate "
               "(prompt tokens = length, completion tokens = output length, cold cache); "
               f"{len(flagged)} flagged and excluded from the statistics.")
    out.append("")
    rows = []
    for (arm, length), g in df.groupby(["arm", "length"], sort=True):
        cases: dict[str, dict[str, int]] = {}
        for m in measures:
            v = validations.get(m["visit"]["id"])
            if not v or m["visit"]["arm"] != arm:
                continue
            for rec in v["records"]:
                if rec["length"] != length:
                    continue
                for case, verdict in rec["verdicts"].items():
                    cases.setdefault(case, {}).setdefault(verdict["verdict"], 0)
                    cases[case][verdict["verdict"]] += 1
        verdicts = "; ".join(f"{c}: " + ", ".join(f"{k} {n}" for k, n in sorted(v.items()))
                             for c, v in sorted(cases.items())) or "–"
        rows.append([f"`{arm}`", int(length), f"{int(g['selected'].sum())}/{len(g)}", verdicts])
    out += _table(["arm", "length", "selected/total", "case verdicts"], rows)
    excluded = []
    for m in measures:
        v = validations.get(m["visit"]["id"])
        vby = {r["length"]: r for r in v["records"]} if v else {}
        for r in m["records"]:
            reasons = list(r["flags"]) + list((vby.get(r["length"]) or {}).get("excluded_because", []))
            if reasons:
                excluded.append(f"- {m['visit']['id']} length {r['length']} (attempt {r['attempt']}): "
                                + "; ".join(reasons))
    if excluded:
        out += ["Excluded records and why:", "", *excluded, ""]
    retries = [m for m in measures if m["attempt"] > 0]
    out.append(f"Retries: {len(retries)}." + ("" if not retries else " " + ", ".join(
        f"{m['visit']['id']} attempt {m['attempt']}" for m in retries)))
    out.append("")
    return out


def timing_section(agreement: pd.DataFrame) -> list[str]:
    out = ["## Client against engine timings", "",
           "Client timings come from the arrival of streamed tokens (decode = (tokens − 1) / (last − first "
           "token); prefill = prompt tokens / time to first token, which includes HTTP and scheduling). "
           "Engine timings are its own `timings`. Medians over gated records:", ""]
    rows = [[f"`{r.arm}`", int(r.length), _f(r.client_decode_tok_s), _f(r.engine_decode_tok_s),
             _pct(r.decode_disagreement), _f(r.client_prefill_tok_s), _f(r.engine_prefill_tok_s),
             _pct(r.prefill_disagreement)] for r in agreement.itertuples()]
    out += _table(["arm", "length", "client decode tok/s", "engine decode tok/s", "disagreement",
                   "client prefill tok/s", "engine prefill tok/s", "disagreement"], rows)
    return out


def diagnostics_section(warmups: dict, measures: list[dict]) -> list[str]:
    out = ["## Warmup and first requests (diagnostics, never in the statistics)", ""]
    rows = [[f"`{arm}`", _f(w["server"]["ready_s"], ".2f"), _f(w["first_request"]["ttft_ms"]),
             "ok" if w["smoke_ok"] else "FAILED: " + "; ".join(w["problems"])] for arm, w in warmups.items()]
    out += _table(["arm", "launch to healthy (s)", "first request TTFT (ms)", "smoke check"], rows)
    rows = [[m["visit"]["id"], _f(m["server"]["ready_s"], ".2f"), _f(m["first_request"]["ttft_ms"]),
             _f(m["duration_s"], ".1f")] for m in measures]
    out += _table(["visit", "launch to healthy (s)", "first request TTFT (ms)", "visit (s)"], rows)
    return out


def render(*, plan: dict, sources: dict, builds: dict, fixtures: dict, warmups: dict, measures: list[dict],
           validations: dict, df: pd.DataFrame, agreement: pd.DataFrame, stats_markdown: str,
           files: list[str]) -> str:
    """The whole README.md report."""
    title = f"# pairbench: `{plan['candidate']}` against `{plan['baseline']}`"
    lines = [title, "", f"Leak gate: {LEAK_GATE_MARKER}", ""]
    lines += compared_section(plan, sources, builds)
    lines += plan_section(plan, fixtures)
    lines += gates_section(measures, validations, df)
    lines += [stats_markdown.rstrip(), ""]
    lines += timing_section(agreement)
    lines += diagnostics_section(warmups, measures)
    lines += ["## Files", "", *[f"- `{f}`" for f in sorted(files)], "- `MANIFEST.json`: sha256 of every file", ""]
    return "\n".join(lines)
