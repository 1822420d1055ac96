"""Optional fast linear kernels for CPU decode: half-precision weight storage for matrix-vector products.

Why (figures and method in docs/perf.md, from ``bench/kernel_speed.py``): decode at batch 1 is a
chain of matrix-vector products whose speed is set by how many weight bytes stream from DRAM per
token. On this machine one core streams about 5-7 GB/s and fp32 ``F.linear`` (MKL sgemv) already
runs at that rate, so the only lever is fewer bytes. PyTorch's own fp16 GEMV (``fp16_gemv_trans``,
fp32 accumulation, F16C/AVX2) reads half the bytes at the same GB/s, i.e. about 2x the tok/s, while
the int8/int4 weight-only kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``) and
``torch.compile`` were slower here (AVX2 only, no AVX-512/AMX paths). fp16 GEMM with many rows (prefill)
has no fast path on AVX2, so for more than ``MATVEC_MAX_ROWS`` rows the weight is widened back to
fp32 for that one call (about 1 ms per matrix, negligible against a multi-token GEMM) and MKL sgemm
does the work.

Numerics: the weight is rounded to fp16 (relative error <= 2**-11, far below the 4-bit quantization
error of a Q4_1 GGUF it came from) and, on the matrix-vector path, so is the input; products
accumulate in fp32. Measured against fp32 ``F.linear`` on SmolLM2-135M shapes: max error 4-5e-4 of the
output's largest magnitude for one row, 2e-4 for 16 rows (``python3 -m engine.kernels`` prints it). Weights whose
magnitude exceeds the fp16 range are refused (``prepare`` raises), never silently saturated.

API (all optional; the engine runs unchanged without it)::

    from engine import kernels
    p = kernels.prepare(weight)       # once at load: weight (out, in) float32 -> PreparedWeight
    y = kernels.linear(x, p)          # x (..., in) float32 -> (..., out) float32
    kernels.quantize_(model)          # swap every engine Linear in a model for a HalfLinear
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: Inputs with at most this many rows (tokens) take the fp16 matrix-vector path; more rows widen the
#: weight to fp32 for an MKL GEMM (fp16 GEMM on AVX2 is several times slower than fp32 GEMM).
MATVEC_MAX_ROWS = 2

#: Intra-op threads for the fp16 matrix-vector path (see ``linear``).
MATVEC_THREADS = 1

FP16_MAX = torch.finfo(torch.float16).max


@dataclass(frozen=True)
class PreparedWeight:
    """A weight of shape (out, in) stored in fp16 for the decode matrix-vector path."""

    half: torch.Tensor  # (out, in) float16, contiguous

    @property
    def shape(self) -> torch.Size:
        return self.half.shape

    def nbytes(self) -> int:
        return self.half.nelement() * self.half.element_size()


def prepare(weight: torch.Tensor) -> PreparedWeight:
    """Convert a float (out, in) weight to the fp16 storage ``linear`` uses. Done once, at load."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"kernels.prepare: expected a 2-D float weight (out, in), got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    peak = float(weight.detach().abs().max()) if weight.numel() else 0.0
    if not peak < FP16_MAX:
        raise ValueError(f"kernels.prepare: weight {tuple(weight.shape)} has |w| up to {peak:g}, beyond "
                         f"the fp16 range {FP16_MAX:g}; keep it in fp32")
    return PreparedWeight(weight.detach().to(torch.float16).contiguous())


def linear(x: torch.Tensor, p: PreparedWeight) -> torch.Tensor:
    """y = x @ W.T in float32 for x (..., in); W given by ``prepare``. Same contract as ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if rows <= MATVEC_MAX_ROWS:
        # fp16 GEMV: half the DRAM bytes of fp32, fp32 accumulation inside ATen's kernel. Its
        # multi-threaded form is pathological here (10x slower at 2 threads than at 1 whenever the
        # other core is busy; docs/perf.md), so it runs on MATVEC_THREADS threads. Toggling the
        # intra-op thread count costs < 1 us and applies to the calling thread only.
        saved = torch.get_num_threads()
        if saved != MATVEC_THREADS:
            torch.set_num_threads(MATVEC_THREADS)
        try:
            return F.linear(x.to(torch.float16), p.half).to(x.dtype)
        finally:
            if saved != MATVEC_THREADS:
                torch.set_num_threads(saved)
    return F.linear(x, p.half.to(x.dtype))  # many rows: compute-bound, widen once and use MKL sgemm


class HalfLinear(nn.Module):
    """Drop-in for the engine's ``Linear`` (bias-free, weight (out, in)) backed by ``PreparedWeight``."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.prepared = prepare(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.prepared)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, storage=float16"


def quantize_(model: nn.Module, min_numel: int = 0) -> int:
    """Replace, in place, every bias-free linear submodule (``engine.model.Linear`` or a bias-free
    ``nn.Linear``) holding at least ``min_numel`` weights by a ``HalfLinear``. Returns how many were
    replaced. Shared weights (the tied lm_head) are copied, so the embedding table stays fp32."""
    from .model import Linear  # local: keep this module importable on its own

    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            plain = isinstance(child, nn.Linear) and child.bias is None
            if (isinstance(child, Linear) or plain) and child.weight.numel() >= min_numel:
                swaps.append((parent, name, child))
    for parent, name, child in swaps:
        setattr(parent, name, HalfLinear(child.weight))
    return len(swaps)


def error_report(seed: int = 0) -> list[dict]:
    """Max error of ``linear`` vs fp32 ``F.linear`` on SmolLM2-135M shapes (random weights of the
    model's typical magnitude), relative to the output's largest magnitude, for 1 and 16 rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)):
        w = torch.randn(n, k, generator=g) * 0.05
        p = prepare(w)
        for rows in (1, 16):
            x = torch.randn(rows, k, generator=g)
            ref, got = F.linear(x, w), linear(x, p)
            err = float((got - ref).abs().max())
            out.append({"shape": (n, k), "rows": rows, "max_abs": err,
                        "rel_to_max": err / float(ref.abs().max())})
    return out


if __name__ == "__main__":
    for r in error_report():
        print(f"W {r['shape'][0]:>5}x{r['shape'][1]:<5} rows {r['rows']:>2}: max abs err {r['max_abs']:.2e}, "
              f"relative to max |y| {r['rel_to_max']:.2e}")

