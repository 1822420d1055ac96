"""Which instruction-set path the block products take: the fastest one, measured, cached per CPU model.

Every path of ``engine/csrc/kernels.cpp`` (``native.ISAS``: AVX2, AVX-VNNI, AVX-512 VNNI) gives
bit-identical results, so the choice is speed alone, and the widest is not always the fastest: on an
Intel Xeon (AVX-512, VNNI, AMX) the AVX-512 VNNI path took 11.4-11.7 ms for one decode step's
products where AVX2 took 8.4-9.4. So the choice is measured, not read from the CPU's flags: every
path this CPU supports times one decode step's products (every layer's matrices and the lm_head, on
the model's own shapes and formats) for 1 and 8 activation rows, on one thread (thread CPU time, the
minimum over interleaved repetitions), and the path with the least time relative to the best at both
row counts wins.

The choice is cached in the kernels' build directory (one per kernels source, compiler and flags),
in ``isa.json``, keyed by the CPU (vendor, model name, family/model/stepping, and which paths it
runs), so that a cluster's shared cache holds one entry per kind of node and never hands one node's
choice to another. ``python -m engine build-kernels`` measures it (SmolLM2-135M's shapes, or
``--model``'s); otherwise the first load of a model with native weights on a CPU with no entry does.
``PAIRBENCH_ENGINE_ISA`` still forces a path (for comparisons); the engine's facts say where the path
came from (``source``: env, cache, measured, or flags when nothing has been measured yet).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

import torch

from . import native

CACHE_NAME = "isa.json"
CACHE_SCHEMA = "pairbench-engine.isa/v1"
ROWS = (1, 8)
#: SmolLM2-135M's decode step: 30 blocks of these q4_1 matrices (out, in), then the q8_0 lm_head
SMOLLM2_STEP = [("q4_1", n, k) for _ in range(30) for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536))]
SMOLLM2_STEP.append(("q8_0", 49152, 576))

_state: dict = {"source": None, "table": None, "cpu": None}


def cpu() -> dict:
    """This CPU as /proc/cpuinfo names it (empty strings where it does not), and the paths it runs."""
    info = {"vendor": "", "model_name": "", "family": "", "model": "", "stepping": ""}
    keys = {"vendor_id": "vendor", "model name": "model_name", "cpu family": "family", "model": "model",
            "stepping": "stepping"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor is enough
            name, _, value = line.partition(":")
            if name.strip() in keys:
                info[keys[name.strip()]] = value.strip()
    except OSError:
        pass
    info["paths"] = [i for i in native.ISAS if native.isa_supported(i)]
    return info


def cpu_key(info: dict) -> str:
    return (f"{info['vendor']} {info['model_name']} (family {info['family']} model {info['model']} stepping "
            f"{info['stepping']}; {'+'.join(info['paths'])})")


def cache_path() -> Path | None:
    lib = native.library_path()
    return lib.parent / CACHE_NAME if lib is not None else None


def _warn(message: str) -> None:
    print(f"pairbench-engine: warning: {message}", file=sys.stderr, flush=True)


def read_cache(path: Path) -> dict:
    """{cpu key: entry}; an unreadable or foreign file is an empty cache (after a warning)."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("schema") != CACHE_SCHEMA or not isinstance(doc.get("cpus"), dict):
            raise ValueError(f"not a {CACHE_SCHEMA} file")
        return doc["cpus"]
    except (OSError, ValueError, AttributeError) as e:
        _warn(f"{path}: ignoring the instruction-set cache ({e}); measuring again")
        return {}


def _write_cache(path: Path, cpus: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"schema": CACHE_SCHEMA, "cpus": cpus}, indent=2, sort_keys=True) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def synthetic_step(step=SMOLLM2_STEP) -> list[tuple[str, torch.Tensor, int, int]]:
    """One decode step's products for (format, out, in) shapes: arbitrary quants, fixed valid scales
    (the speed of a product does not depend on the values, only on no denormals or NaNs)."""
    import numpy as np

    rng, out = np.random.default_rng(0), []
    for fmt, n, k in step:
        nb = k // 32
        width = nb * (16 if fmt == "q4_1" else 32)
        qs = torch.frombuffer(bytearray(rng.bytes(n * width)), dtype=torch.uint8).view(n, width)
        scales = torch.full((n, nb * (2 if fmt == "q4_1" else 1)), 0.01, dtype=torch.float16).view(torch.uint8)
        out.append((fmt, torch.cat([qs, scales], dim=1).contiguous(), n, k))
    return out


def model_step(model) -> list[tuple[str, torch.Tensor, int, int]]:
    """One decode step's block products of a loaded Transformer (its QuantLinear modules)."""
    from .kernels import QuantLinear

    mods = [m for m in model.modules() if isinstance(m, QuantLinear)]
    return [(m.fmt, m.blocks, m.out_features, m.in_features) for m in mods]


def describe(step) -> str:
    """The shapes of a step's products, e.g. ``30x q4_1 960x576, ..., 1x q8_0 49152x576``."""
    counts: dict = {}
    for fmt, _, n, k in step:
        counts[(fmt, n, k)] = counts.get((fmt, n, k), 0) + 1
    return ", ".join(f"{c}x {fmt} {n}x{k}" for (fmt, n, k), c in counts.items())


def measure(step, paths: list[str], reps: int = 5, budget_s: float = 6.0) -> dict:
    """{path: {"rows1_ms", "rows8_ms"}}: thread CPU time of one decode step's products, the minimum
    over ``reps`` repetitions with the paths interleaved (fewer when ``budget_s`` runs out), on one
    thread. Restores the pool's threads and the path in force."""
    threads, before = native.threads(), native.isa()
    xs = {k: torch.randn(max(ROWS), k, generator=torch.Generator().manual_seed(k)) for k in {s[3] for s in step}}
    best = {p: {m: float("inf") for m in ROWS} for p in paths}
    native.set_threads(1)
    t_end = time.monotonic() + budget_s
    try:
        for rep in range(reps + 1):  # the first pass warms caches and pages, and is not counted
            for p in paths[rep % len(paths):] + paths[:rep % len(paths)]:
                native.set_isa(p)
                for m in ROWS:
                    t = time.thread_time_ns()
                    for fmt, blocks, n, k in step:
                        native.linear(xs[k][:m], fmt, blocks, n)
                    if rep:
                        best[p][m] = min(best[p][m], (time.thread_time_ns() - t) / 1e6)
            if rep and time.monotonic() > t_end:
                break
    finally:
        native.set_threads(threads)
        native.set_isa(before)
    return {p: {f"rows{m}_ms": round(v, 3) for m, v in t.items()} for p, t in best.items()}


def fastest(table: dict) -> str:
    """The path with the least sum, over the row counts, of its time relative to the best path's."""
    lows = {m: min(t[f"rows{m}_ms"] for t in table.values()) for m in ROWS}
    return min(table, key=lambda p: (sum(table[p][f"rows{m}_ms"] / lows[m] for m in ROWS), native.ISAS.index(p)))


def choose(step=None, *, remeasure: bool = False) -> dict:
    """Apply the path for this CPU: the environment's, else the cached choice, else measure on
    ``step`` (the products of ``model_step`` or ``synthetic_step``, or a function making them, called
    only when a measurement is needed; None: nothing to measure, the flags' choice stays) and cache
    it. Returns ``facts()``."""
    if native.lib() is None:
        return facts()
    if native.isa_forced():
        _state["source"] = "env"
        return facts()
    info = cpu()
    key, path = cpu_key(info), cache_path()
    if len(info["paths"]) < 2:
        _state.update(source="only", table=None, cpu=key)
        return facts()
    with open(path.with_name(".isa.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two servers starting at once measure once
        cpus = read_cache(path)
        entry = cpus.get(key)
        if entry is not None and entry.get("choice") in info["paths"] and not remeasure:
            native.set_default_isa(entry["choice"])
            _state.update(source="cache", table=entry.get("table_ms"), cpu=key)
            return facts()
        if entry is None and cpus and step is not None:
            _warn(f"{path.name} holds choices for {', '.join(sorted(cpus))}, not this CPU ({key}): measuring")
        if step is None:
            _state.update(source="flags", table=None, cpu=key)
            return facts()
        step = step() if callable(step) else step
        table = measure(step, info["paths"])
        choice = fastest(table)
        native.set_default_isa(choice)
        cpus[key] = {"choice": choice, "table_ms": table, "shapes": describe(step),
                     "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_cache(path, cpus)
    _state.update(source="measured", table=table, cpu=key)
    return facts()


def facts() -> dict:
    """The path in force and where it came from (``source``), with the times it was chosen on."""
    return {"isa": native.isa(), "source": "env" if native.isa_forced() else (_state["source"] or "flags"),
            "table_ms": _state["table"], "cpu": _state["cpu"]}
