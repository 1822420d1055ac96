"""Micro-benchmark of the matrix-vector kernels behind SmolLM2-135M decode on this CPU.

Not a test: it prints one table. Each variant runs the matmuls of one whole decode step (30 layers
of q/k/v/o/gate/up/down, optionally fused, plus the 49152x576 lm_head) with 30 *distinct* weight
copies, so the weights stream from DRAM as they do in the real model (one layer's weights fit in
L2/L3 and would flatter a single-matrix loop). For each variant it reports the median time per
step, the weight bytes read per step, the achieved GB/s and the tok/s ceiling that implies.
A plain tensor copy and a sum give the machine's memory-bandwidth reference.

``q4_1`` and ``q8_0`` are the engine's own native kernels (``engine/csrc/kernels.cpp``, through
``engine.kernels.QuantLinear``), threads = the native pool's; the rest are PyTorch's.

    python3 bench/kernel_speed.py [--threads 1 2] [--reps 7] [--only fp32,int4,q4_1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 30, 9, 3, 64, 49152
GROUP = 32  # GGUF Q4_1 block size

# (out, in) of each weight in one layer
UNFUSED = [(HEADS * HEAD_DIM, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN),
           (HIDDEN, HEADS * HEAD_DIM), (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]
FUSED = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM),
         (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def _median_s(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _int4_pack(w: torch.Tensor):
    """Asymmetric 4-bit, group 32 (the Q4_1 scheme), packed for _weight_int4pack_mm_for_cpu."""
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    sz = torch.stack([d, lo + 8 * d], -1).transpose(0, 1).contiguous()
    return packed, sz


def _int8_pack(w: torch.Tensor):
    s = (w.abs().amax(1) / 127).clamp(min=1e-12)
    return (w / s[:, None]).round().clamp(-127, 127).to(torch.int8), s


def make_variant(name: str, shapes, with_head: bool = True):
    """Return (step_fn, bytes_per_step) for a variant over LAYERS copies of `shapes` (+ lm_head)."""
    torch.manual_seed(0)
    mats = [[torch.randn(o, i) * 0.05 for (o, i) in shapes] for _ in range(LAYERS)]
    if with_head:
        mats.append([torch.randn(VOCAB, HIDDEN) * 0.05])
    xs = {i: torch.randn(1, i) for i in {HIDDEN, HEADS * HEAD_DIM, INTER}}
    flat = [w for layer in mats for w in layer]

    if name == "fp32":
        ops = [(lambda x, w=w: F.linear(x, w)) for w in flat]
        nbytes = sum(w.numel() * 4 for w in flat)
    elif name == "fp32_t":  # weight stored (in, out): x @ Wt, a different MKL gemv layout
        wts = [w.t().contiguous() for w in flat]
        ops = [(lambda x, w=w: x @ w) for w in wts]
        nbytes = sum(w.numel() * 4 for w in flat)
    elif name == "fp32_mv":
        ops = [(lambda x, w=w: torch.mv(w, x[0])) for w in flat]
        nbytes = sum(w.numel() * 4 for w in flat)
    elif name == "mkl_packed":  # the packed-MKL linear that inductor's freezing uses
        packs = [(torch.ops.mkl._mkl_reorder_linear_weight(w, 1), w) for w in flat]
        ops = [(lambda x, p=p: torch.ops.mkl._mkl_linear(x, p[0], p[1], None, 1)) for p in packs]
        nbytes = sum(w.numel() * 4 for w in flat)
    elif name == "bf16":
        wb = [w.to(torch.bfloat16) for w in flat]
        xs = {k: v.to(torch.bfloat16) for k, v in xs.items()}
        ops = [(lambda x, w=w: F.linear(x, w)) for w in wb]
        nbytes = sum(w.numel() * 2 for w in flat)
    elif name == "fp16":
        wb = [w.to(torch.float16) for w in flat]
        xs = {k: v.to(torch.float16) for k, v in xs.items()}
        ops = [(lambda x, w=w: F.linear(x, w)) for w in wb]
        nbytes = sum(w.numel() * 2 for w in flat)
    elif name == "int8":
        packs = [_int8_pack(w) for w in flat]
        ops = [(lambda x, p=p: torch.ops.aten._weight_int8pack_mm(x, p[0], p[1])) for p in packs]
        nbytes = sum(p[0].numel() + p[1].numel() * 4 for p in packs)
    elif name in ("q4_1", "q8_0"):  # the engine's native kernels (engine/csrc/kernels.cpp), split row layout
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from engine import kernels, native

        if not native.available():
            raise RuntimeError(f"native kernels unavailable: {native.unavailable_reason()}")
        native.set_threads(torch.get_num_threads())
        quant = kernels.quantize_q4_1 if name == "q4_1" else kernels.quantize_q8_0
        mods = [kernels.QuantLinear(name, quant(w), w.shape[1]) for w in flat]
        ops = [(lambda x, m=m: m(x)) for m in mods]
        nbytes = sum(m.nbytes() for m in mods)
    elif name == "int4":
        packs = [_int4_pack(w) for w in flat]
        ops = [(lambda x, p=p: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p[0], GROUP, p[1]))
               for p in packs]
        nbytes = sum(p[0].numel() + p[1].numel() * 4 for p in packs)
    else:
        raise ValueError(f"unknown variant {name!r}")
    del mats, flat
    ins = [xs[i] for layer_shapes in ([shapes] * LAYERS + ([[(VOCAB, HIDDEN)]] if with_head else []))
           for (_, i) in layer_shapes]

    def step():
        for op, x in zip(ops, ins):
            op(x)

    return step, nbytes


def bandwidth(reps: int) -> tuple[float, float]:
    a = torch.empty(64 * 2**20, dtype=torch.float32).normal_()  # 256 MiB
    b = torch.empty_like(a)
    t_copy = _median_s(lambda: b.copy_(a), reps)
    t_sum = _median_s(lambda: a.sum(), reps)
    return 2 * a.numel() * 4 / t_copy / 1e9, a.numel() * 4 / t_sum / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="fp32,fp32_t,fp32_mv,mkl_packed,bf16,fp16,int8,int4,q4_1,q8_0")
    ap.add_argument("--head-only", action="store_true", help="time only the 49152x576 lm_head")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'threads':>7} {'variant':<12} {'layout':<7} {'ms/step':>9} {'MB/step':>8} {'GB/s':>6} {'tok/s max':>9}")
    for nt in args.threads:
        torch.set_num_threads(nt)
        cp, rd = bandwidth(args.reps)
        print(f"{nt:>7} {'copy':<12} {'256MiB':<7} {'':>9} {'':>8} {cp:6.1f}   (read+write)")
        print(f"{nt:>7} {'sum':<12} {'256MiB':<7} {'':>9} {'':>8} {rd:6.1f}   (read)")
        for name in args.only.split(","):
            for layout, shapes in (("unfused", UNFUSED), ("fused", FUSED)):
                if args.head_only:
                    if layout == "fused":
                        continue
                    shapes, layout = [], "lm_head"
                try:
                    step, nbytes = make_variant(name, shapes if not args.head_only else [])
                except Exception as e:  # noqa: BLE001 - report and keep going
                    print(f"{nt:>7} {name:<12} {layout:<7} unavailable: {type(e).__name__}: {e}")
                    continue
                with torch.inference_mode():
                    t = _median_s(step, args.reps)
                print(f"{nt:>7} {name:<12} {layout:<7} {t * 1e3:9.2f} {nbytes / 1e6:8.1f} "
                      f"{nbytes / t / 1e9:6.1f} {1 / t:9.1f}", flush=True)
                del step


if __name__ == "__main__":
    main()
