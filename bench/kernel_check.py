#!/usr/bin/env python3
"""Check, on this machine, every instruction-set path of the engine's block products, and which one
the engine takes.

A self-contained check to run on any CPU (the paths this CPU lacks are listed as not run). For each
path this CPU supports (``engine.native.ISAS``), forced in turn:

1. **bit-identity**: Q4_1 and Q8_0 products of random matrices, for batches of 1..16 rows, equal the
   AVX2 path's results bit for bit (every block sum is an exact integer; the float arithmetic after
   it is the same on every path), and stay within 1e-5 of max |y| of the float64 reference
   ``engine.kernels.linear_ref``;
2. **speed**: one decode step's products for SmolLM2-135M's shapes (30 layers' Q4_1 matrices and
   the Q8_0 lm_head) at 1 and 8 rows, on one thread, thread CPU time (min of ``--reps``, the paths
   interleaved): ``engine.isa.measure``, the measurement the engine chooses its path by.

Then the table, the path the figures above would choose (``engine.isa.fastest``), and the path the
engine takes on this CPU and where it comes from (``engine.isa.choose``: the environment's
``PAIRBENCH_ENGINE_ISA``, the cached choice for this CPU model, or a measurement made now).

Exit status 0 when every supported path passes 1., 1 otherwise.

    python3 bench/kernel_check.py [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from engine import kernels, native  # noqa: E402

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # one SmolLM2 layer: qkv, o, gate-up, down


def matrix(fmt: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    gguf = kernels.quantize_q4_1(w) if fmt == "q4_1" else kernels.quantize_q8_0(w)
    return kernels.split_rows(fmt, gguf), gguf


def identity(isa: str) -> list[str]:
    """Failures of ``isa`` against AVX2 and the reference (empty: it passes)."""
    failures = []
    for fmt in ("q4_1", "q8_0"):
        for (n, k), seed in zip(((200, 576), (96, 1536), (5, 64)), (1, 2, 3)):
            split, gguf = matrix(fmt, n, k, seed)
            x = torch.randn(16, k, generator=torch.Generator().manual_seed(seed + 10)) * 2
            native.set_isa("avx2")
            want = [native.linear(x[:m], fmt, split, n) for m in range(1, 17)]
            native.set_isa(isa)
            got = [native.linear(x[:m], fmt, split, n) for m in range(1, 17)]
            for m, (g, w) in enumerate(zip(got, want), start=1):
                if not torch.equal(g, w):
                    failures.append(f"{isa} {fmt} {n}x{k} rows {m}: max |diff| {float((g - w).abs().max()):.3g} "
                                    "against avx2 (must be 0)")
            ref = kernels.linear_ref(fmt, gguf, x)
            err = float((got[-1] - ref).abs().max() / ref.abs().max())
            if err > 1e-5:
                failures.append(f"{isa} {fmt} {n}x{k}: {err:.3g} of max |y| from the reference (bound 1e-5)")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not native.available():
        print(f"native kernels unavailable: {native.unavailable_reason()}")
        return 1
    from engine import isa as choice

    native.set_threads(1)
    info = choice.cpu()
    report = {"cpu": choice.cpu_key(info), "paths": {}}
    ok, supported = True, info["paths"]
    for name in native.ISAS:
        if name not in supported:
            report["paths"][name] = {"supported": False}
            print(f"{name:<11} not supported by this CPU (or the compiler that built the kernels): not run")
            continue
        failures = identity(name)
        ok &= not failures
        report["paths"][name] = {"supported": True, "bit_identical_to_avx2": not failures, "failures": failures}
        print(f"{name:<11} {'PASS' if not failures else 'FAIL'} bit-identical to avx2 and within 1e-5 of the reference")
        for f in failures:
            print(f"    {f}")
    table = choice.measure(choice.synthetic_step(), supported, reps=args.reps, budget_s=60)
    print(f"\none decode step's products, SmolLM2-135M's shapes, 1 thread, CPU time (min of {args.reps}):")
    print("| path | 1 row (ms) | 8 rows (ms) |\n|---|---:|---:|")
    for name, row in table.items():
        report["paths"][name].update(row)
        print(f"| {name} | {row['rows1_ms']:.2f} | {row['rows8_ms']:.2f} |")
    engine_choice = choice.choose(choice.synthetic_step)
    report.update(fastest_here=choice.fastest(table), engine=engine_choice)
    print(f"\nfastest by these figures: {report['fastest_here']}")
    print(f"{report['cpu']}: the engine uses {engine_choice['isa']} ({engine_choice['source']}"
          f"{': PAIRBENCH_ENGINE_ISA' if engine_choice['source'] == 'env' else ''})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
