"""The plan in a person's words, printed before anything runs (``snakemake``, a dry run too) and by
``python -m pairbench plan <config>``: what is compared, under which conditions, how many rounds and
visits, whether external engines may run, and about how long it takes.

    pairbench plan 'default' -> results/default/ (config: config/config.yaml)
      arm baseline (baseline): embedded engine, source engine/, no patches
      arm candidate (candidate): embedded engine, source engine/, patch config/patches/int8-kv.patch
      conditions (2): in256-out64, in1024-out64; model smollm2-135m
      rounds: 8, then blocks of 2 until every primary interval is within +-2%, at most 18 (order abba)
      visits: 16 to 36, 1 steady request(s) per condition each
      external engines: none (nothing outside this repository is built or launched)
      time: about 3.2 to 5.5 min (~80 s + ~7 s a visit: ...); where visits are slower, at most ~9.3 min (rounds.max_minutes 8)
        plus the cost channel after the visits: 2 arm(s) x in256-out64 under callgrind, decode counted (...)

The estimate is a stated fixed cost plus one stated cost per visit (:data:`FIXED_S`,
:data:`VISIT_S`), the default config's as measured; other engines, models and lengths cost
otherwise, and a compiled engine's build and cross-check are added as lines of their own.
"""

from __future__ import annotations

from pairbench.core import conditions as pb_conditions
from pairbench.core.config import baseline_arm, candidate_arms, normalized
from pairbench.core.plan import adaptive, rounds_bounds
from pairbench.core.slo import BOUNDS
from pairbench.engines.profiles import arm_engine, is_external, load_profile

# The default config's cost on this project's 2-core machine at load ~1 (docs/perf.md, "What a run
# costs"): 28 visits took 4 min 38 s and 36 visits 5 min 35 s in all, so ~7 s a visit plus ~80 s for
# everything else (plan, source, fixtures, warmups, statistics, report, audit).
VISIT_S = 7
FIXED_S = 80
COST = "~80 s + ~7 s a visit: the default config's cost on a 2-core CPU, docs/perf.md"
# Engines whose visits were measured otherwise: (fastest, slowest) seconds a visit, and where.
VISIT_S_BY_ENGINE = {
    # config/llama-cpp.yaml's run (docs/engines.md, "The run"): 20-36 s a visit at load 4-8
    "llama-server": ((20, 36), "llama-server's, measured at load 4-8 on 2 cores, docs/engines.md"),
}
# What a compiled engine adds (docs/engines.md, "The build" and "The run"): llama.cpp's CMake build of
# llama-server and llama-bench, and 3 rounds of llama-bench.
CMAKE_BUILD = "a CMake build per arm (llama.cpp: 497-991 s with a cold ccache, 39-104 s warm)"
CROSSCHECK = "{tool} after the visits, {rounds} rounds (llama-bench's 3 took ~5 min at load 4-8)"
# The cost channel (docs/cost.md, "Cost of the channel"): one arm's simulated request at a 256-token
# prompt, 8 decode tokens, caches simulated, on this project's 2-core AMD host: the embedded engine
# 87-97 s (decode counted); llama.cpp's llama-bench 419 s (decode) and 676-705 s (prefill and decode):
# valgrind emulates every lane of its FMA kernels for the prompt the decode needs.
COST_CHANNEL = ("the cost channel after the visits: {arms} arm(s) x {conds} under callgrind, {phases} counted "
                "({estimate}, more as the prompt grows: docs/cost.md)")
COST_ESTIMATE = {"embedded": "~90 s an arm at a 256-token prompt",
                 "llama-server": "~7 min an arm at a 256-token prompt, ~11.5 min with prefill counted"}


def _source(src) -> str:
    if src is None:
        return "the installed package"
    if isinstance(src, dict):
        return f"git {src['git']} @ {src.get('ref') or src.get('tag')}" if "git" in src else f"{src['path']}/"
    return f"{src}/"


def _arm_line(name: str, arm: dict, role: str) -> str:
    patches = arm["patches"]
    what = (f"patch{'es' if len(patches) > 1 else ''} {', '.join(patches)}" if patches else "no patches")
    extra = [f"threads {arm['threads']}"] if arm["threads"] else []
    extra += [f"args {' '.join(arm['args'])}"] if arm["args"] else []
    extra += [f"env {' '.join(f'{k}={v}' for k, v in sorted(arm['env'].items()))}"] if arm["env"] else []
    extra += ["own build command"] if arm["build"] else []
    extra += ["own launch command"] if arm["launch"] else []
    return (f"  arm {name} ({role}): {arm_engine(arm)} engine, source {_source(arm['source'])}, {what}"
            + "".join(f", {e}" for e in extra))


def _rounds_line(cfg: dict) -> str:
    a = adaptive(cfg)
    if a is None:
        return f"  rounds: {rounds_bounds(cfg)[0]} (fixed; order {cfg['order']})"
    if a["min"] == a["max"]:
        return f"  rounds: {a['min']} (adaptive with min = max; order {cfg['order']})"
    return (f"  rounds: {a['min']}, then blocks of {a['block']} until every primary interval is within "
            f"+-{a['target_halfwidth']:.0%}, at most {a['max']} (order {cfg['order']})")


def _span(lo: float, hi: float, unit: str = "") -> str:
    return f"{lo:g}{unit}" if lo == hi else f"{lo:g} to {hi:g}{unit}"


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"



def _external_line(cfg: dict) -> str:
    ext = [n for n, a in cfg["arms"].items() if is_external(a)]
    if not ext:
        return "  external engines: none (nothing outside this repository is built or launched)"
    engines = sorted({arm_engine(cfg["arms"][n]) for n in ext})
    head = f"  external engines: {', '.join(engines)} in arm(s) {', '.join(ext)}: "
    if cfg["allow_external"]:
        return head + "allowed (allow_external: true)"
    return head + ("NOT allowed: the run stops at its first engine job; review this plan, then add "
                   "--config allow_external=true")


def _time_line(cfg: dict, lo_visits: int, hi_visits: int) -> str:
    """The estimate: the fixed cost plus the visits at the slowest measured engine's cost per visit."""
    measured = [VISIT_S_BY_ENGINE[e] for e in sorted({arm_engine(a) for a in cfg["arms"].values()})
                if e in VISIT_S_BY_ENGINE]
    if measured:
        (fast, slow), why = max(measured, key=lambda m: m[0][1])
        cost = f"~{FIXED_S} s + {fast}-{slow} s a visit: {why}"
    else:
        (fast, slow), cost = (VISIT_S, VISIT_S), COST
    lo_t, hi_t = _minutes(FIXED_S + lo_visits * fast), _minutes(FIXED_S + hi_visits * slow)
    if lo_t == hi_t:
        span = lo_t
    else:
        span = f"{lo_t.split()[0]} to {hi_t}" if lo_t.split()[1] == hi_t.split()[1] else f"{lo_t} to {hi_t}"
    line = f"  time: about {span} ({cost})"
    budget = (adaptive(cfg) or {}).get("max_minutes")
    if budget:  # the rounds stop by the clock, so a slower host meets the budget, not the visit estimate
        line += f"; where visits are slower, at most ~{_minutes(FIXED_S + budget * 60)} (rounds.max_minutes {budget:g})"
    return line


def _twins(cfg: dict) -> list[str]:
    base = baseline_arm(cfg)
    return [c for c in candidate_arms(cfg) if cfg["arms"][c] == cfg["arms"][base]]


def _extras(cfg: dict) -> list[str]:
    """What a compiled engine or a cross-check adds to the time (profiles say which arms have them)."""
    profiles = {n: load_profile(arm_engine(a)) for n, a in cfg["arms"].items()}
    out = []
    if any(p.build_spec.cmake and not cfg["arms"][n]["build"] for n, p in profiles.items()):
        out.append(CMAKE_BUILD)
    base = profiles[baseline_arm(cfg)].crosscheck_spec
    if cfg["crosscheck"]["rounds"] > 0 and base and any(profiles[c].crosscheck_spec for c in candidate_arms(cfg)):
        out.append(CROSSCHECK.format(tool=base.tool, rounds=cfg["crosscheck"]["rounds"]))
    cost = cfg["cost"]
    if cost["enabled"] and not cfg.get("load"):
        chosen = pb_conditions.selected(pb_conditions.conditions(cfg), cost["conditions"])
        estimate = COST_ESTIMATE.get(arm_engine(cfg["arms"][baseline_arm(cfg)]), "its time not measured for this engine")
        out.append(COST_CHANNEL.format(arms=len(cfg["arms"]), conds=", ".join(pb_conditions.ids(chosen)),
                                       phases=" and ".join(cost["phases"]), estimate=estimate))
    return out


def _load_lines(load: dict, lo: int, hi: int, levels: int) -> list[str]:
    """A load run's visits: every level each, its requests, the SLO; its time is its own (no estimate)."""
    loop = "closed loop" if load["concurrency"] else "open loop, Poisson" if load["burstiness"] == 1 else "open loop"
    slo = ", ".join(f"{k} <= {load['slo'][k]:g}" for k in BOUNDS if load["slo"][k] is not None)
    n = load["warmup"] + load["requests"]
    return [f"  visits: {_span(lo, hi)}, each every level in its round's order ({loop}), {load['warmup']} warm-up + "
            f"{load['requests']} measured requests a level ({n * levels} a visit)",
            f"  SLO: {slo} for {load['slo']['attainment']:.0%} of requests" if slo else
            "  SLO: none (no goodput, no capacity)",
            "  time: a load visit's cost is the engine's under load (config/load.yaml's run: docs/load.md)"]


def plan_summary(config: dict, where: str = "") -> str:
    """The plan of a checked config (schema defaults filled or not), in about ten lines."""
    cfg = normalized(config)
    base, cands = baseline_arm(cfg), candidate_arms(cfg)
    lines = [f"pairbench plan '{cfg['label']}' -> results/{cfg['label']}/" + (f" (config: {where})" if where else "")]
    for name, arm in cfg["arms"].items():
        role = "baseline" if name == base else ("candidate" if name in cands else "measured, not compared")
        lines.append(_arm_line(name, arm, role))
    conds = [c.id for c in pb_conditions.conditions(cfg)]
    lines.append(f"  conditions ({len(conds)}): {', '.join(conds)}; model {cfg['model']}")
    lines.append(_rounds_line(cfg))
    lo, hi, _ = rounds_bounds(cfg)
    k = len(cfg["arms"])
    load = cfg.get("load")
    if load is None:
        lines.append(f"  visits: {_span(lo * k, hi * k)}, {cfg['repeats']} steady request(s) per condition each")
    else:
        lines += _load_lines(load, lo * k, hi * k, len(conds))
    lines.append(_external_line(cfg))
    if load is None:
        lines.append(_time_line(cfg, lo * k, hi * k))
    lines += [f"    plus {e}" for e in _extras(cfg)]
    twins = _twins(cfg)
    if twins and twins == cands:
        lines.append("  A/A: every candidate is identical to the baseline (engine, source, patches, flags): "
                     "no verdict should read faster or slower")
    elif twins:
        lines.append(f"  A/A: {', '.join(twins)} identical to the baseline (engine, source, patches, flags)")
    return "\n".join(lines)
