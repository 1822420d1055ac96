"""The report: ``publish/README.md``, in plain language, from the run's artifacts.

Sections: what was compared (arms, source versions, patches, native engine strings, model), how it
was measured (plan, visit order, gates), what passed (gates and validation, with every excluded
record and its reason), the statistics (:func:`pairbench.publish.stats_section.statistics_section`, from ``stats/summary.json``), client against
engine timings and how far they disagree, and — on their own — warmup and first-request
diagnostics, which never enter the statistics.

The text holds no paths, host names or raw outputs; the publish stage scrubs it and runs the leak
gate over it anyway.
"""

from __future__ import annotations

import math

import pandas as pd

from pairbench.core import naming
from pairbench.core.metrics import NAMES
from pairbench.core.conditions import label as condition_label, parse_id
from pairbench.publish.engine_section import engine_section
from pairbench.publish.load_section import load_section
from pairbench.publish.stats_section import statistics_section
from pairbench.validate import retries
from pairbench.validate.sandbox import LAYERS

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


def compared_section(plan: dict, sources: dict, builds: dict, measures: list[dict] | None = None) -> list[str]:
    rows = []
    for arm in plan["arms"]:
        s, b = sources[arm], builds[arm]
        patches = ", ".join(f"`{p['path'].split('/')[-1]}`" for p in s["patches"]) or "none"
        role = "baseline" if arm == plan["baseline"] else ("candidate" if arm in plan["candidates"] else "other")
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
    records = [r for m in (measures or []) for r in m["records"]]
    exact_in = sum(1 for r in records if r["gates"].get("prompt_tokens") is True)
    exact_out = sum(1 for r in records if r["gates"].get("completion_tokens") is True)
    outs = sorted({c["output_tokens"] for c in plan["conditions"]})
    out.append(f"Model `{plan['model']['name']}`. Every steady request asked for its condition's output tokens "
               f"({', '.join(map(str, outs))}), greedy, end-of-sequence ignored, prefix cache off; by the engines' "
               f"own counts {exact_in} of {len(records)} steady records had exactly the planned input tokens "
               f"(native tokens, chat template included) and {exact_out} of {len(records)} generated exactly the "
               "planned output tokens.")
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


def plan_section(plan: dict, fixtures: dict, measures: list[dict] | None = None) -> list[str]:
    run_rounds = {m["visit"]["round"] for m in measures} if measures else None
    rounds: dict[int, list[str]] = {}
    for v in plan["visits"]:
        if run_rounds is None or v["round"] in run_rounds:
            rounds.setdefault(v["round"], []).append(v["arm"])
    order = " | ".join(" → ".join(arms) for _, arms in sorted(rounds.items()))
    out = ["## How it was measured", ""]
    repeats = int(plan.get("repeats", 1))
    planned = (f"{len(rounds)} paired rounds run of {plan['rounds']} planned" if len(rounds) != plan["rounds"]
               else f"{plan['rounds']} paired rounds")
    conds = "; ".join(f"`{c['id']}` ({condition_label(c)})" for c in plan["conditions"])
    out.append(f"- Conditions: {conds}; {planned}; seed {plan['seed']}.")
    per = "one steady streamed request per condition" if repeats == 1 else (
        f"{repeats} steady streamed requests per condition (every condition in turn, then again)")
    if plan.get("load"):
        ld = plan["load"]
        per = (f"then every load level in its round's order (forward in one block of the visit order, reversed in the next), each "
               f"{ld['warmup']} warm-up and {ld['requests']} measured streamed requests on an idle server")
    out.append(f"- Visit order (`{plan['order']}`, fixed in plan.json before anything ran): {order}. Each visit "
               f"launches the arm's server, sends one first request (a diagnostic, not a sample), {per}, then "
               "stops it.")
    salts = [q["salt"] for fx in fixtures.values() for r in fx["rounds"] for q in r.get("requests") or [r]]
    rounds_n = len({r["round"] for fx in fixtures.values() for r in fx["rounds"]})
    distinct = len(set(salts)) == len(salts)
    out.append(f"- Each prompt starts with a salt of its round and condition{' (and request)' if plan.get('load') else ''} "
               f"({len(set(salts))} distinct salts over "
               f"{rounds_n} rounds × {len(fixtures)} conditions{'' if distinct else ', NOT one per prompt'}), so no "
               "request can reuse another's prefix, while both arms of a round see identical tokens.")
    for n, fx in fixtures.items():
        out.append(f"- Fixture `{n}`: task `{fx['task']}`, token ids identical on "
                   f"{', '.join(f'`{a}`' for a in fx['checked_by'])} for all {len(fx['rounds'])} rounds.")
    out.append(f"- Config sha256 `{plan['config_sha256'][:16]}…`.")
    out.append("")
    return out


def gates_section(measures: list[dict], validations: dict[tuple[str, int], dict], df: pd.DataFrame) -> list[str]:
    """Gates, case verdicts per arm x condition, every excluded record with its reasons, every retry.

    *validations* maps (visit id, retry) to the validate body (``pairbench.core.naming.validation_key``).
    """
    out = ["## Gates and validation", ""]
    records = [r for m in measures for r in m["records"]]
    flagged = [r for r in records if not r["ok"]]
    unproven = [r for r in records if r["ok"] and r["gates"].get("cold_cache") is None]
    out.append(f"{len(records)} steady records; {len(records) - len(flagged) - len(unproven)} passed every gate "
               "(prompt tokens and completion tokens as planned, cold cache proven); "
               f"{len(flagged)} failed a gate and are excluded from the statistics"
               + (f"; {len(unproven)} passed the others but have no proof of a cold cache (see the statistics "
                  "section for whether they count)" if unproven else "") + ".")
    out.append("")
    rows = []
    order = {c: i for i, c in enumerate(sorted(set(df["condition"]), key=parse_id))}
    for (arm, _, cond), g in df.assign(_o=df["condition"].map(order)).groupby(["arm", "_o", "condition"], sort=True):
        cases: dict[str, dict[str, int]] = {}
        for m in measures:
            v = validations.get(naming.measure_key(m))
            if not v or m["visit"]["arm"] != arm:
                continue
            for rec in v["records"]:
                if rec["condition"] != cond:
                    continue
                for case, verdict in rec["verdicts"].items():
                    cases.setdefault(case, {}).setdefault(verdict["verdict"], 0)
                    cases[case][verdict["verdict"]] += 1
        verdicts = "; ".join(f"{c}: " + ", ".join(f"{k} {n}" for k, n in sorted(v.items()))
                             for c, v in sorted(cases.items())) or "–"
        rows.append([f"`{arm}`", f"`{cond}`", f"{int(g['selected'].sum())}/{len(g)}", verdicts])
    out += _table(["arm", "condition", "selected/total", "case verdicts"], rows)
    out += isolation_lines(validations)
    if "retry" in df.columns and (pd.to_numeric(df["retry"], errors="coerce") > 0).any():
        out += ["selected/total counts every measurement, a retried record's superseded original included; "
                "case verdicts likewise.", ""]
    excluded = []
    for m in measures:
        v = validations.get(naming.measure_key(m))
        vby = {(r["condition"], r.get("repeat", 1)): r for r in v["records"]} if v else {}
        for r in m["records"]:
            reasons = list(r["flags"]) + list((vby.get((r["condition"], r.get("repeat", 1))) or {})
                                              .get("excluded_because", []))
            if reasons:
                excluded.append(f"- {naming.label(*naming.measure_key(m))} `{r['condition']}` (attempt {r['attempt']}): "
                                + "; ".join(reasons))
    if excluded:
        out += ["Excluded records and why:", "", *excluded, ""]
    return out + retries_section(measures, df)


def isolation_lines(validations: dict[tuple[str, int], dict]) -> list[str]:
    """Which of the sandbox's isolation layers (``pairbench.validate.sandbox.LAYERS``) were missing
    from the ``python_function`` runs, naming each layer and how many records lacked it."""
    runs = unrecorded = 0
    missing: dict[str, int] = {}
    for body in validations.values():
        for rec in body["records"]:
            verdict = rec["verdicts"].get("python_function") or {}
            if "isolation" not in verdict:
                unrecorded += "duration_s" in verdict  # the sandbox ran, but an older pairbench kept no layers
                continue
            runs += 1
            for layer in verdict["isolation"]["missing"]:
                missing[layer] = missing.get(layer, 0) + 1
    if not runs and not unrecorded:
        return []
    if missing:
        parts = "; ".join(f"`{layer}` for {missing[layer]} of {runs}" for layer in LAYERS if layer in missing)
        line = (f"Sandbox isolation: NOT every layer applied to the records whose function ran in the sandbox: "
                f"missing {parts}.")
        if "mountns" in missing:
            line += (" Without `mountns` the model's code could read this machine's files (a sandbox of an "
                     "older pairbench); the verdict is still decided outside the sandbox.")
        elif "landlock-fs" in missing:
            line += (" Without `landlock-fs` the model's code saw only the sandbox's read-only view of the "
                     "system's and Python's files (`mountns`); the verdict is decided outside the sandbox.")
    else:
        line = (f"Sandbox isolation: all {len(LAYERS)} layers ({', '.join(LAYERS)}) applied to each of the "
                f"{runs} records whose function ran in the sandbox; the verdict is decided outside it.")
    if unrecorded:
        line += f" {unrecorded} sandboxed record(s) do not record their layers (validated by an older pairbench)."
    return [line + " (docs/validation.md)", ""]


def retries_section(measures: list[dict], df: pd.DataFrame) -> list[str]:
    """Every retry, with its reason and what became of it: engine-fault re-attempts of a job
    (``attempt`` > 1) and validation retries (``measure/<visit>.retry<N>.json``)."""
    faults = [m for m in measures if m["attempt"] > 1]
    partial = [m for m in measures if naming.retry_number(m) > 0]
    kinds = {}  # per retry (a partial visit), whatever number of conditions it re-measured
    for m in partial:
        k = retries.kind_of(sorted({kind for r in m["retry_reasons"] for kind in r["kinds"]}))
        kinds[k] = kinds.get(k, 0) + 1
    head = (f"Retries: {len(faults) + len(partial)} disclosed: {len(faults)} engine-fault re-attempt(s) of a "
            f"measurement job and {len(partial)} partial-visit validation retry(ies)")
    if kinds:
        head += " (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
    if not faults and not partial:
        head = "Retries: none (no engine fault re-attempted a measurement job; no record earned a validation retry)"
    out = ["### Retries", "", head + ".", ""]
    rows = {(int(r.round), str(r.arm), str(r.condition), int(r.retry)): r for r in df.itertuples()} \
        if "retry" in df.columns else {}
    for m in faults:
        out.append(f"- {naming.label(*naming.measure_key(m))}: attempt {m['attempt']}: an engine fault failed "
                   f"the earlier attempt(s) of this job (their server logs are kept under private/logs/); "
                   "the records of this attempt are the ones reported.")
    for m in partial:
        n, vid = naming.retry_number(m), m["visit"]["id"]
        for r in m["retry_reasons"]:
            row = rows.get((m["visit"]["round"], m["visit"]["arm"], r["condition"], n))
            if row is None:
                outcome = "its new record is not in the measurements table"
            elif bool(row.selected):
                outcome = "its new record passed and is the one used"
            elif str(row.reason).startswith("superseded"):
                outcome = f"its new record was excluded too and then {row.reason}"
            else:
                outcome = "its new record was excluded too"
            before = "the visit's own measurement" if n == 1 else f"retry {n - 1}"
            out.append(f"- {vid} retry {n}, `{r['condition']}` (partial visit, {retries.kind_of(r['kinds'])}): "
                       f"{before} was excluded: {r['reason']}. Re-measured after every visit; {outcome}; the "
                       f"earlier record is kept, superseded.")
    return out + [""]


def timing_section(agreement: pd.DataFrame) -> list[str]:
    out = ["## Client against engine timings", "",
           "Client timings come from the arrival of streamed tokens (decode = (tokens − 1) / (last − first "
           "token); prefill = prompt tokens / time to first token, which includes HTTP and scheduling). "
           "Engine timings are its own `timings`. Medians over gated records:", ""]
    rows = [[f"`{r.arm}`", f"`{r.condition}`", _f(r.client_decode_tok_s), _f(r.engine_decode_tok_s),
             _pct(r.decode_disagreement), _f(r.client_prefill_tok_s), _f(r.engine_prefill_tok_s),
             _pct(r.prefill_disagreement)] for r in agreement.itertuples()]
    out += _table(["arm", "condition", "client decode tok/s", "engine decode tok/s", "disagreement",
                   "client prefill tok/s", "engine prefill tok/s", "disagreement"], rows)
    return out


def load_run_lines(measures: list[dict]) -> list[str]:
    """What only the measure artifacts of a load run know: the idle wait before each level, how the
    prefix cache was kept out, and the levels whose streams outnumbered an arm's slots."""
    levels = [r for m in measures for r in m["records"] if r.get("kind") == "level"]
    if not levels:
        return []
    verified = [r for r in levels if r["idle"]["verified"]]
    out = ["### How each level was run", ""]
    waited = max((r["idle"]["waited_s"] for r in levels), default=0.0)
    hows = sorted({r["idle"]["how"] for r in levels if not r["idle"]["verified"]})
    out.append(f"- Idle server: verified before {len(verified)} of {len(levels)} levels (the longest wait "
               f"{waited:.2f} s)" + (f"; not verified before the others: {'; '.join(hows)}" if hows else "") + ".")
    for (arm, how, detail) in sorted({(r["arm"], r["cache"]["how"], r["cache"]["detail"]) for r in levels}):
        what = {"request": "off in every request", "launch": "off by a launch flag",
                "unproven": "NOT provably off under concurrency"}[how]
        out.append(f"- Prefix cache of `{arm}`: {what}: {detail}")
    unproven = sum(r["gate_failures"].get("cold_cache_unproven", 0) for r in levels)
    cold = sum(r["gate_failures"].get("cold_cache", 0) for r in levels)
    out.append(f"- Cold cache per request, from the engine's own per-request counts: {cold} request(s) reused a "
               f"prefix, {unproven} could not be shown cold, over every request of every level.")
    queued = sorted({(r["arm"], r["condition"], r["slots"]) for r in levels if r["queued"]})
    if queued:
        out.append("- Queued beyond the slots (load.allow_queueing): " + "; ".join(
            f"`{a}` at `{c}` ({s} slot{'s' if s != 1 else ''})" for a, c, s in queued)
                   + ": the requests beyond the slots waited in the server's queue, inside their TTFT.")
    return out + [""]


def diagnostics_section(warmups: dict, measures: list[dict]) -> list[str]:
    out = ["## Warmup and first requests (diagnostics, never in the statistics)", ""]
    rows = [[f"`{arm}`", _f(w["server"]["ready_s"], ".2f"), _f(w["first_request"][NAMES.ttft_ms]),
             "ok" if w["smoke_ok"] else "FAILED: " + "; ".join(w["problems"])] for arm, w in warmups.items()]
    out += _table(["arm", "launch to healthy (s)", "first request TTFT (ms)", "smoke check"], rows)
    rows = [[naming.label(*naming.measure_key(m)), _f(m["server"]["ready_s"], ".2f"), _f(m["first_request"][NAMES.ttft_ms]),
             _f(m["duration_s"], ".1f")] for m in measures]
    out += _table(["visit", "launch to healthy (s)", "first request TTFT (ms)", "visit (s)"], rows)
    return out


def build_section(plan: dict, builds: dict) -> list[str]:
    """How the arms were built, where there is more to say than a version: a compiled engine's
    compiler, flags, targets, time and compiler-cache use; a Python engine's install into each arm's
    own environment."""
    compiled = [a for a in plan["arms"] if builds[a].get("toolchain")]
    installed = [a for a in plan["arms"] if builds[a].get("environment")]
    if not compiled and not installed:
        return []
    out = ["## How it was built", ""]
    if compiled:
        out += _compiled(compiled, builds)
    if installed:
        out += _installed(installed, builds)
    return out


def _installed(arms: list[str], builds: dict) -> list[str]:
    """Each installed arm: what its environment reports, and that it imports the arm's own tree."""
    rows = []
    for arm in arms:
        env = builds[arm]["environment"]
        steps = {st["step"]: st["duration_s"] for st in builds[arm]["steps"]}
        rows.append([f"`{arm}`", f"`{env['package']}` {env['version']}", f"Python {env['python_version']}",
                     "its tree (editable)" if env["imports_from"] == "tree" else "its environment",
                     _f(steps.get("install"), ".1f"), env["tree_sha256"][:12]])
    out = _table(["arm", "installed", "interpreter", "imports the engine from", "install (s)", "source tree sha256"],
                 rows)
    out.append("Each of these arms was installed from its own exported, patched tree into a virtual environment of "
               "its own, and its server ran from there; after the install, the environment was asked where it imports "
               "the engine from.")
    out.append("")
    return out


def _compiled(arms: list[str], builds: dict) -> list[str]:
    rows = []
    for arm in arms:
        b, tc = builds[arm], builds[arm]["toolchain"]
        cc = tc["ccache"]
        steps = {st["step"]: st["duration_s"] for st in b["steps"]}
        cache = "not used" if cc is None else (
            f"{cc['hits']} hits / {cc['misses']} misses of {cc['calls']} compiles"
            + (f" ({cc['hit_rate'] * 100:.0f}%)" if cc["hit_rate"] is not None else " (nothing to compile)"))
        cxx = tc["cxx_compiler"] or {}
        rows.append([f"`{arm}`", f"{cxx.get('id', '?')} {cxx.get('version', '?')}", ", ".join(f"`{t}`" for t in tc["targets"]),
                     _f(steps.get("configure"), ".1f"), _f(steps.get("compile"), ".1f"), cache])
    out = _table(["arm", "C++ compiler", "targets", "configure (s)", "compile (s)", "ccache"], rows)
    tc = builds[arms[0]]["toolchain"]
    same = all(builds[a]["toolchain"]["flags"] == tc["flags"] for a in arms)
    out.append(f"CMake ({tc['generator']}, {tc['cmake']}), `-j {tc['jobs']}`, flags"
               + (" (both arms): " if same else f" of `{arms[0]}`: ") + " ".join(f"`{f}`" for f in tc["flags"]) + ".")
    if cxx.get("version_line"):
        out.append(f"Compiler: `{cxx['version_line']}`.")
    out.append("")
    return out


def crosscheck_section(body: dict | None) -> list[str]:
    """The engine's own benchmark beside pairbench's verdicts (stats/crosscheck.json), and whether they agree."""
    if body is None:
        return []
    from pairbench.analysis.crosscheck import statement

    tool = body["tool"]
    out = [f"## Cross-check: {tool}", "",
           f"`{tool}` was built from each arm's own patched tree and run after every visit, in "
           f"{body['rounds']} rounds alternating the arms (ABBA), one run per test and arm per round, with "
           f"the arms' threads; its ratio is the median of the per-round ratios. Prefill rows "
           f"compare its `pp<input tokens>` (one batch, empty context) with the server's own prompt timing; decode "
           f"rows compare `tg<output tokens>` after a context of `<input tokens>` with the server's decode timing. "
           f"With a few rounds its ratio has no interval: it either lies inside pairbench's "
           f"confidence interval or not. Direction uses the run's noise threshold (±{body['noise'] * 100:g}%).", ""]
    rows = [[f"`{r['condition']}`", r["quantity"], f"`{r['test']}`" + (f" @ d{r['n_depth']}" if r["n_depth"] else ""),
             f"{_f(r['baseline_tok_s'])} ± {_f(r['baseline_stddev_tok_s'])}",
             f"{_f(r['candidate_tok_s'])} ± {_f(r['candidate_stddev_tok_s'])}",
             _f(r["tool_ratio"], ".3f"), f"{_f(r['pairbench_ratio'], '.3f')} [{_f(r['pairbench_ci_low'], '.3f')}, "
             f"{_f(r['pairbench_ci_high'], '.3f')}]", r["verdict"], r["direction"], r["size"] or "–"]
            for r in body["rows"]]
    out += _table(["condition", "quantity", f"{tool} test", f"{body['baseline']} tok/s", f"{body['candidate']} tok/s",
                   f"{tool} ratio", "pairbench ratio [CI]", "pairbench verdict", "direction", "size"], rows)
    out += [f"**{statement(body)}**", ""]
    return out


def exercise_section(body: dict | None) -> list[str]:
    """Whether the cross-checked candidate's patch ran at all (pairbench.measure.exercise), stated before
    the verdicts: a patch none of whose changed code ran can only ever read "equivalent"."""
    ex = (body or {}).get("exercise")
    if not ex:
        return []
    cand, tool = body["candidate"], body["tool"]
    names = ", ".join(f"`{f}`" for f in ex["functions"]) or "none"
    probe = (f"The probe compared the compiled code of both arms' builds function by function (addresses "
             f"and assert line numbers aside), then ran the cross-check's commands once under gdb with a "
             f"breakpoint on each changed function `{tool}` contains.")
    if ex["exercised"] is False:
        why = ("the patch leaves every compiled function identical to the baseline's" if ex["changed"] == 0 else
               f"the patch changes {ex['changed']} compiled function{'s' if ex['changed'] != 1 else ''} ({names}) "
               f"and none of them ran under `{tool}` at the plan's lengths, output tokens and threads")
        return [f"## Not exercised: `{cand}`'s patch never ran", "",
                f"**Every verdict of `{cand}` below compares two builds that executed the same code: an "
                f"\"equivalent\" there says nothing about the change.** Here {why}. {probe}", ""]
    if ex["exercised"] is None:
        return [f"## Exercise of `{cand}`'s patch: {ex['status']}", "",
                f"Whether the patch ran could not be told ({ex['changed']} changed functions, {ex['probed']} "
                f"probed, none ran: {names}; the full record is in `crosscheck/{cand}.json`). {probe}", ""]
    return [f"## Exercise of `{cand}`'s patch", "",
            f"The patch ran: {ex['hit']} of its {ex['changed']} changed compiled functions ran under `{tool}` "
            f"({names}). {probe}", ""]


def cost_section(body: dict | None) -> list[str]:
    """The cost channel's verdicts beside wall time's (stats/cost.json), what it cannot see, and the
    arms it could not count, with why."""
    if body is None:
        return []
    from pairbench.analysis.cost import statement
    from pairbench.core.metrics import COST_METRICS

    out = ["## Cost channel: simulated instructions and cycles", "",
           "Each arm's engine served one fixed request per condition (its round-1 prompt) under valgrind's "
           "callgrind, on one thread, counting only the request's own steps (docs/cost.md). A count has no "
           "sampling error, so its ratio is exact and reads against the same threshold "
           f"(±{body['noise'] * 100:g}%) and vocabulary as wall time. It is a model of the machine: it cannot see "
           "memory bandwidth or real cache behaviour (the caches are simulated, a RAM access weighs 35 "
           "cycles), threads and barriers (one thread), or the ISA paths valgrind cannot run (AVX-512: the "
           "engines run their AVX2 paths). A change that only touches those reads *not exercised*, never "
           "*equivalent*. Where the two channels disagree, each is right about what it measures: wall time "
           "about this host, the count about the work asked of the CPU.", ""]
    for arm, a in body["arms"].items():
        if a["status"] == "counted":
            out.append(f"- `{arm}` ({a['engine']}): counted by {a['tool_version']} in {a['duration_s']:.0f} s.")
        else:
            out.append(f"- `{arm}` ({a['engine']}): **not counted** ({a['reason']}): {a['message']}")
    out.append("")
    rows = [[f"`{r['candidate']}`", f"`{r['condition']}`", COST_METRICS[r["metric"]].label,
             _f(r["baseline_per_tok"], ",.0f"), _f(r["candidate_per_tok"], ",.0f"), _f(r["ratio"], ".4f"),
             r["verdict"], f"`{r['wall_metric']}` {r['wall_verdict'] or '–'} ({_f(r['wall_ratio'], '.3f')})",
             r["agreement"]] for r in body["rows"]]
    if rows:
        out += _table(["candidate", "condition", "cost metric", f"{body['baseline']} per token", "candidate per token",
                       "ratio", "cost verdict", "wall-clock verdict (ratio)", "agreement"], rows)
    out += [f"**{statement(body)}**", ""]
    return out


def render(*, plan: dict, sources: dict, builds: dict, fixtures: dict, warmups: dict, measures: list[dict],
           validations: dict, df: pd.DataFrame, agreement: pd.DataFrame, summary: dict,
           files: list[str], crosscheck: dict | None = None, cost: dict | None = None) -> str:
    """The whole README.md report."""
    title = f"# pairbench: {', '.join(f'`{c}`' for c in plan['candidates'])} against `{plan['baseline']}`"
    lines = [title, "", f"Leak gate: {LEAK_GATE_MARKER}", ""]
    lines += compared_section(plan, sources, builds, measures)
    lines += build_section(plan, builds)
    lines += engine_section(plan, warmups)
    lines += plan_section(plan, fixtures, measures)
    lines += gates_section(measures, validations, df)
    lines += exercise_section(crosscheck)
    lines += [statistics_section(summary).rstrip(), ""]
    if summary.get("load"):  # a load run: the curve, the capacity, the levels (verify checks it too)
        lines += [load_section(summary).rstrip(), "", *load_run_lines(measures)]
    lines += crosscheck_section(crosscheck)
    lines += cost_section(cost)
    if not summary.get("load"):  # a load run's levels have no per-request engine timings to compare
        lines += timing_section(agreement)
    lines += diagnostics_section(warmups, measures)
    lines += ["## Files", "", *[f"- `{f}`" for f in sorted(files)], "- `MANIFEST.json`: sha256 of every file", ""]
    return "\n".join(lines)
