"""What actually runs: the engine's effective facts after a load, in one dict.

Two arms of a comparison should differ only by their patches. What else can make them differ is
decided at load, not in the source: whether the native kernels built, which instruction-set path
they took (``engine.isa``), which native fast paths stand in for the Python model
(``engine.fastpaths``), the weight format, the KV cache's dtype, the thread counts. The server
returns these facts (``GET /props``, ``engine_facts``) and prints them when ready, so a harness can
record them per arm and name any difference its patches did not cause.
"""

from __future__ import annotations

import torch

from . import NATIVE, __version__, isa, native


def native_facts() -> dict:
    """The native library: whether it runs (and why not), its source hash and its dot-product path."""
    available = native.available()
    chosen = isa.facts() if available else {"isa": None, "source": None, "table_ms": None, "cpu": None}
    return {"available": available, "reason": native.unavailable_reason(), "kernels_sha256": native.kernels_sha256(),
            "isa": chosen["isa"], "isa_source": chosen["source"], "isa_table_ms": chosen["table_ms"],
            "cpu": chosen["cpu"]}


def engine_facts(loaded, *, prefill_threads: int, decode_threads: int, slots: int = 1) -> dict:
    """The facts of a loaded model (``engine.weights.LoadedModel``) served with these threads."""
    return {"engine": NATIVE, "version": __version__, "torch": torch.__version__, "model": loaded.name,
            "linear": loaded.linear, "kv_dtype": loaded.kv_dtype, "fast_paths": loaded.fast_paths,
            "native": native_facts(), "threads": {"prefill": prefill_threads, "decode": decode_threads},
            "slots": slots}


def summary(facts: dict) -> str:
    """One line of the facts, for a log: ``linear gguf (avx2, measured), fused decode on, kv f16, ...``."""
    n, fp = facts["native"], facts["fast_paths"]
    kernels = f"{n['isa']}, {n['isa_source']}" if n["available"] else f"no native kernels: {n['reason']}"
    fused = fp["fused_decode"]
    return (f"linear {facts['linear']} ({kernels}), fused decode {'on' if fused['on'] else 'off'}"
            f"{'' if fused['on'] or not fused['why'] else ' (' + fused['why'] + ')'} [fused_decode {fp['mode']}], "
            f"kv {facts['kv_dtype']}, threads {facts['threads']['prefill']} prefill / {facts['threads']['decode']} "
            f"decode, torch {facts['torch']}")
