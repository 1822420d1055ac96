"""The report's "Engine facts" section: what each arm's engine actually ran, side by side.

Two arms should differ only by their patches. What else can make them differ is decided when the
engine loads: the native kernels' instruction-set path, which native fast paths stand in for the
Python model, the thread counts, the KV cache's dtype, the kernels' source, torch. The warmup records
the facts the server reports (``warmup/<arm>.json``: ``engine_facts``, and ``fast_paths``, what the
harness launched it with: :mod:`pairbench.engines.fastpaths`). This section shows them per arm, says
which fast paths were off and why, and names every difference between arms in a fact that no patch
of engine code decides (the host, the launch, the installed torch).
"""

from __future__ import annotations

from pairbench.engines import fastpaths

# Facts no patch decides: a difference between arms here is the run's, not the patch's.
NOT_FROM_PATCHES = ("kernel path (ISA)", "threads (prefill / decode)", "torch")


def _fast_path(fact: dict, launched_off: set, name: str) -> str:
    if fact.get("on"):
        return "on"
    if name in launched_off:
        return "off (for the comparison: another arm's code differs)"
    if fact.get("differs"):
        return f"off (this arm's code differs: {', '.join(fact['differs'])})"
    return "off"


def _column(facts: dict, launch: dict | None) -> dict[str, str]:
    native = facts.get("native") or {}
    isa = (f"{native.get('isa')} ({native.get('isa_source')})" if native.get("available")
           else "none: portable path")
    threads = facts.get("threads") or {}
    out = {"kernel path (ISA)": isa, "threads (prefill / decode)": f"{threads.get('prefill')} / {threads.get('decode')}",
           "weights": str(facts.get("linear")), "KV cache": str(facts.get("kv_dtype")),
           "kernels source sha256": str(native.get("kernels_sha256") or "–")[:12], "torch": str(facts.get("torch")),
           "fused_decode setting": (launch or {}).get("mode") or (facts.get("fast_paths") or {}).get("mode", "–")}
    launched_off = set((launch or {}).get("off") or [])
    for name, fact in sorted(((facts.get("fast_paths") or {}).items())):
        if isinstance(fact, dict):
            out[f"fast path `{name}`"] = _fast_path(fact, launched_off, name)
    return out


def engine_section(plan: dict, warmups: dict) -> list[str]:
    """The section, or nothing where no arm's engine reports its facts."""
    arms = [a for a in plan["arms"] if a in warmups]
    cols = {a: _column(warmups[a]["engine_facts"], warmups[a].get("fast_paths"))
            for a in arms if warmups[a].get("engine_facts")}
    if not cols:
        return []
    keys = list(dict.fromkeys(k for c in cols.values() for k in c))
    out = ["## Engine facts (what each arm's engine ran)", "",
           "| fact | " + " | ".join(f"`{a}`" for a in cols) + " |", "|---|" + "---|" * len(cols)]
    out += [f"| {k} | " + " | ".join(c.get(k, "–") for c in cols.values()) + " |" for k in keys]
    out.append("")
    differ = [k for k in NOT_FROM_PATCHES if len({c.get(k) for c in cols.values()}) > 1]
    if differ:
        out.append(f"**The arms differ in {', '.join(differ)}, which no patch decides**: a difference in the "
                   "results may come from that, not from the patches.")
    elif len(cols) > 1:
        out.append("The arms ran the same kernel path, threads and torch.")
    notes = [n for a in cols for n in fastpaths.notes(a, warmups[a]["engine_facts"], warmups[a].get("fast_paths"))]
    out += [f"- {n}" for n in notes]
    return out + [""]

