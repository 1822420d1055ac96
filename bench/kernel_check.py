#!/usr/bin/env python3
"""Check, on this machine, every instruction-set path of the engine's block products.

Not a test: a self-contained check to run on a CPU with AVX-VNNI or AVX-512 VNNI (the project's
development host has neither, so only the AVX2 path runs there). For each path this CPU supports
(``engine.native.ISAS``), forced in turn:

1. **bit-identity**: Q4_1 and Q8_0 products of random matrices, for batches of 1..16 rows, equal the
   AVX2 path's results bit for bit (every block sum is an exact integer; the float arithmetic after
   it is the same on every path), and stay within 1e-5 of max |y| of the float64 reference
   ``engine.kernels.linear_ref``;
2. **speed**: one decode step's products for SmolLM2-135M's shapes (30 layers' Q4_1 matrices and
   the Q8_0 lm_head) at 1 and 8 rows, on one thread, thread CPU time (min of ``--reps``).

Exit status 0 when every supported path passes 1., 1 otherwise.

    python3 bench/kernel_check.py [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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


def speed(isa: str, reps: int) -> dict:
    native.set_isa(isa)
    mats = [("q4_1", *matrix("q4_1", n, k, i)[:1], n, k) for i in range(30) for (n, k) in SHAPES]
    mats.append(("q8_0", matrix("q8_0", 49152, 576, 99)[0], 49152, 576))
    xs = {k: torch.randn(8, k) for k in (576, 1536)}
    out = {}
    for m in (1, 8):
        best = float("inf")
        for _ in range(reps):
            t = time.thread_time()
            for fmt, blocks, n, k in mats:
                native.linear(xs[k][:m], fmt, blocks, n)
            best = min(best, time.thread_time() - t)
        out[f"rows{m}_ms"] = best * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not native.available():
        print(f"native kernels unavailable: {native.unavailable_reason()}")
        return 1
    native.set_threads(1)
    best = native.isa()
    import platform

    report = {"cpu": platform.processor() or platform.machine(), "default_path": best, "paths": {}}
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            report["cpu"] = line.split(":", 1)[1].strip()
            break
    ok = True
    for isa in native.ISAS:
        if not native.isa_supported(isa):
            report["paths"][isa] = {"supported": False}
            print(f"{isa:<11} not supported by this CPU (or the compiler that built the kernels): not run")
            continue
        failures = identity(isa)
        figures = speed(isa, args.reps)
        ok &= not failures
        report["paths"][isa] = {"supported": True, "bit_identical_to_avx2": not failures, "failures": failures,
                                **figures}
        print(f"{isa:<11} {'PASS' if not failures else 'FAIL'} bit-identical to avx2 and within 1e-5 of the "
              f"reference; one decode step's products: {figures['rows1_ms']:.2f} ms for 1 row, "
              f"{figures['rows8_ms']:.2f} ms for 8 rows (1 thread, CPU time)")
        for f in failures:
            print(f"    {f}")
    native.set_isa(best)
    print(f"{report['cpu']}: the engine uses {best} by default")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
