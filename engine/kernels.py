"""Weight formats of the matrix products, and the modules that multiply by them.

Decode at batch 1 is a chain of matrix-vector products whose time is set by how many weight bytes
stream through the core per token (docs/perf.md). The formats, fastest first:

* ``q4_1`` / ``q8_0`` -- GGUF's own blocks of 32 weights, kept exactly as the file stores them
  (0.625 / 1.0625 bytes per weight), multiplied by ``engine/csrc/kernels.cpp`` (through
  ``engine.native``): the activation row is written as two int8 digits per value (the int8
  rounding llama.cpp's q8_1 makes, plus its scaled remainder), i.e. one 15-bit integer, and each
  block's dot product is an exact integer sum on AVX2 (or AVX-VNNI / AVX-512 VNNI) SIMD. A decode
  step's rows (one per sequence) share one pass over the weights. Many-row inputs (prefill)
  dequantize the matrix to fp32 for that call and use MKL's sgemm.
  ``QuantLinear``, ``QuantEmbedding``; needs the native library.
* ``fp16`` -- half-precision storage, ATen's fp16 GEMV for <= 2 rows (fp32 accumulation, 1 thread:
  its multi-threaded form stalls when the other core is busy), fp32 sgemm over widened weights for
  more rows. ``HalfLinear``, ``HalfEmbedding``; pure PyTorch, the path without a compiler.
* ``fp32`` -- ``engine.model.Linear``, the exact reference.

Numerics against fp32 ``F.linear`` over the same (dequantized) weights: fp16 rounds weights and
one-row inputs to 11 bits (measured 4-5e-4 of max |y|); the block formats round the activation to
two int8 digits per 32-block, ~2**-15 of the block's largest value (one digit, as llama.cpp's q8_1,
measured 0.5-1 % of max |y| on random inputs and flipped a greedy token of SmolLM2 early;
``python3 -m engine.kernels`` prints them). The weights themselves are bit-exact to the GGUF's.

Reference implementations in plain PyTorch (``dequantize_ref``, ``quantize_q8_0``,
``quantize_q4_1``, ``quantize_activation_ref``) define the formats; the tests check the native
kernels against them and against ``F.linear``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import native

#: Inputs with at most this many rows (tokens) take the fp16 matrix-vector path; more rows widen the
#: weight to fp32 for an MKL GEMM (fp16 GEMM on AVX2 is several times slower than fp32 GEMM).
MATVEC_MAX_ROWS = 2
#: Up to this many rows the block formats use the native kernel (weights read once for all rows: a
#: decode step of up to 16 sequences); beyond it, dequantize once and let sgemm do the O(rows) work.
QUANT_MAX_ROWS = 16

#: Intra-op threads for the fp16 matrix-vector path (see ``linear``).
MATVEC_THREADS = 1

FP16_MAX = torch.finfo(torch.float16).max
BLOCK = 32
BLOCK_FORMATS = ("q4_1", "q8_0")


# --------------------------------------------------------------------------------------------------
# fp16


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

    fmt = "fp16"

    def __init__(self, weight: torch.Tensor | PreparedWeight):
        super().__init__()
        self.prepared = weight if isinstance(weight, PreparedWeight) else prepare(weight)
        self.out_features, self.in_features = self.prepared.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.prepared)

    def nbytes(self) -> int:
        return self.prepared.nbytes()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, storage=float16"


class HalfEmbedding(nn.Module):
    """Token embedding over an fp16 table (shared with a tied ``HalfLinear`` lm_head)."""

    def __init__(self, prepared: PreparedWeight):
        super().__init__()
        self.prepared = prepared

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.prepared.half).float()  # (..., dim)


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


# --------------------------------------------------------------------------------------------------
# GGUF block formats: reference definitions in PyTorch


def block_bytes(fmt: str) -> int:
    return native.BLOCK_BYTES[fmt]


def _check_blocks(fmt: str, blocks: torch.Tensor, k: int) -> None:
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"unknown block format {fmt!r} (known: {', '.join(BLOCK_FORMATS)})")
    if k % BLOCK or blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != k // BLOCK * block_bytes(fmt):
        raise ValueError(f"{fmt} blocks for {k} inputs must be uint8 (rows, {k // BLOCK * block_bytes(fmt)}), got "
                         f"{blocks.dtype} {tuple(blocks.shape)}")


def split_rows(fmt: str, blocks: torch.Tensor) -> torch.Tensor:
    """GGUF blocks -> the kernels' split row layout (the same bytes, regrouped per row: every
    block's quants, then every block's fp16 d, then (q4_1) every block's fp16 m), so the kernels
    load and convert 8 scales at once. (rows, nb * bytes) uint8 -> the same shape."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, block_bytes(fmt))  # (rows, blocks, bytes)
    parts = [b[..., 4:], b[..., 0:2], b[..., 2:4]] if fmt == "q4_1" else [b[..., 2:], b[..., 0:2]]
    return torch.cat([p.reshape(n, -1) for p in parts], dim=1).contiguous()


def join_rows(fmt: str, split: torch.Tensor) -> torch.Tensor:
    """The inverse of ``split_rows``: back to GGUF's interleaved blocks."""
    n = split.shape[0]
    nb = split.shape[1] // block_bytes(fmt)
    qb = 16 if fmt == "q4_1" else 32
    qs = split[:, :nb * qb].reshape(n, nb, qb)
    d = split[:, nb * qb:nb * (qb + 2)].reshape(n, nb, 2)
    parts = [d, split[:, nb * (qb + 2):].reshape(n, nb, 2), qs] if fmt == "q4_1" else [d, qs]
    return torch.cat(parts, dim=-1).reshape(n, -1).contiguous()


def dequantize_ref(fmt: str, blocks: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, k) float32 of a block matrix, by the GGUF definitions (ggml's dequantize_row_*):
    q4_1: w = d * q + m, q in [0, 15], element j in the low nibble of byte j, j + 16 in its high one;
    q8_0: w = d * q, q int8."""
    _check_blocks(fmt, blocks, k)
    n = blocks.shape[0]
    b = blocks.reshape(n, k // BLOCK, block_bytes(fmt))  # (rows, blocks, bytes)
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # (rows, blocks, 1)
    if fmt == "q8_0":
        q = b[..., 2:].contiguous().view(torch.int8).float()  # (rows, blocks, 32)
        return (d * q).reshape(n, k)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    qs = b[..., 4:]  # (rows, blocks, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()  # (rows, blocks, 32)
    return (d * q + m).reshape(n, k)


def _pack(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.contiguous().view(torch.uint8) for p in parts], dim=-1)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, torch.ones_like(d), d))


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """Q8_0 as gguf-py's reference quantizer makes it (byte for byte): d = absmax / 127 per block,
    q = w / d rounded half away from zero. (out, in) float -> (out, in/32 * 34) uint8 blocks."""
    n, k = w.shape
    x = w.float().reshape(n, k // BLOCK, BLOCK)
    d = x.abs().amax(-1, keepdim=True) / 127
    v = x * _inverse(d)
    a = v.abs()
    q = (torch.sign(v) * (a.floor() + (2 * (a - a.floor())).floor())).to(torch.int8)
    return _pack([d.half(), q]).reshape(n, -1)


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """Q4_1 as gguf-py's reference quantizer makes it (byte for byte): d = (max - min) / 15, m = min,
    q = trunc((w - m) / d + 0.5) in [0, 15]."""
    n, k = w.shape
    x = w.float().reshape(n, k // BLOCK, BLOCK)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).to(torch.uint8).clamp(0, 15)
    nib = q[..., :16] | (q[..., 16:] << 4)  # (rows, blocks, 16)
    return _pack([d.half(), lo.half(), nib]).reshape(n, -1)


def quantize_activation_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' form of an activation row x (k,), two int8 digits per value:
    (d (k/32,), q (k/32, 32), r (k/32, 32)) with d = absmax / 127 per block, q = x / d rounded to
    nearest (ties to even; llama.cpp's q8_1 stops here) and r = (x / d - q) * 254 rounded, so
    x ~= d * (q + r / 254) to about 2**-15 of each block's largest value."""
    xb = x.float().reshape(-1, BLOCK)
    d = xb.abs().amax(-1) / 127
    v = xb * _inverse(d)[:, None]
    q = torch.round(v)
    return d, q, torch.round((v - q) * 254).clamp(-127, 127)


def linear_ref(fmt: str, blocks: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What ``QuantLinear`` computes for <= QUANT_MAX_ROWS rows, in plain PyTorch: per block,
    d_w * d_x * (sum(q_w * q_x) + sum(q_w * r_x) / 254), plus for q4_1 m_w * sum(x) over the
    block's exact inputs. x (rows, k) -> (rows, out). (The kernel sums 254 * q_x + r_x exactly in
    integers and scales in float: the same value up to float rounding.)"""
    k = x.shape[-1]
    _check_blocks(fmt, blocks, k)
    n = blocks.shape[0]
    b = blocks.reshape(n, k // BLOCK, block_bytes(fmt))
    d = b[..., 0:2].contiguous().view(torch.float16).float()[..., 0]  # (out, blocks)
    if fmt == "q8_0":
        q = b[..., 2:].contiguous().view(torch.int8).double()  # (out, blocks, 32)
    else:
        qs = b[..., 4:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).double()
        m = b[..., 2:4].contiguous().view(torch.float16).float()[..., 0]
    out = []
    for row in x.reshape(-1, k):
        dx, qx, rx = quantize_activation_ref(row)  # (blocks,), (blocks, 32), (blocks, 32)
        isum = torch.einsum("obi,bi->ob", q, qx.double())  # exact integer dot products
        rsum = torch.einsum("obi,bi->ob", q, rx.double())
        y = (d.double() * dx.double() * (isum + rsum / 254)).sum(-1)
        if fmt == "q4_1":
            y = y + (m.double() * row.double().reshape(-1, BLOCK).sum(-1)).sum(-1)
        out.append(y.float())
    return torch.stack(out).reshape(*x.shape[:-1], n)


# --------------------------------------------------------------------------------------------------
# GGUF block formats: the modules


_tls = threading.local()
#: Largest dequantized weight kept in the reused buffer (64 MiB: every SmolLM2 layer matrix; not a
#: whole-vocabulary lm_head, which only the all-positions logits of tests ask for).
SCRATCH_MAX = 16 * 2**20


def _weight_scratch(numel: int) -> torch.Tensor | None:
    """A per-thread float32 buffer of >= numel elements that only grows (None: too big to keep)."""
    if numel > SCRATCH_MAX:
        return None
    buf = getattr(_tls, "weight", None)
    if buf is None or buf.numel() < numel:
        buf = _tls.weight = torch.empty(numel, dtype=torch.float32)
    return buf


class QuantLinear(nn.Module):
    """A bias-free linear layer over GGUF blocks (q4_1 / q8_0): weight (out, in) held once, as
    ``blocks`` (out, in/32 * block bytes) uint8 in the split row layout (``layout="gguf"``: split
    here, a copy). Needs ``engine.native``."""

    def __init__(self, fmt: str, blocks: torch.Tensor, in_features: int, layout: str = "gguf"):
        super().__init__()
        _check_blocks(fmt, blocks, in_features)
        self.fmt, self.in_features, self.out_features = fmt, in_features, blocks.shape[0]
        split = split_rows(fmt, blocks) if layout == "gguf" else blocks.contiguous()
        self.register_buffer("blocks", split, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if x.numel() else 0
        if rows <= QUANT_MAX_ROWS:
            return native.linear(x, self.fmt, self.blocks, self.out_features)
        # Prefill: compute-bound; dequantize once into a reused buffer (no allocation, so no page
        # faults per call) and let MKL's sgemm do the O(rows) work.
        return F.linear(x, native.dequantize(self.fmt, self.blocks, self.in_features,
                                             out=_weight_scratch(self.out_features * self.in_features)))

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32, a fresh tensor (for checks)."""
        return native.dequantize(self.fmt, self.blocks, self.in_features)

    def nbytes(self) -> int:
        return self.blocks.numel()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, storage={self.fmt}"


class QuantEmbedding(nn.Module):
    """Token embedding whose table is a block matrix (vocab, dim): rows are dequantized on lookup.
    A tied lm_head is a ``QuantLinear`` over the very same ``blocks`` tensor (``layout="split"``)."""

    def __init__(self, fmt: str, blocks: torch.Tensor, dim: int, layout: str = "gguf"):
        super().__init__()
        _check_blocks(fmt, blocks, dim)
        self.fmt, self.dim = fmt, dim
        split = split_rows(fmt, blocks) if layout == "gguf" else blocks.contiguous()
        self.register_buffer("blocks", split, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = native.dequantize(self.fmt, self.blocks, self.dim, tokens)  # (n, dim)
        return rows.reshape(*tokens.shape, self.dim)


class FusedDecode:
    """One decoder block's decode step (one token of each of B sequences) in two native calls around
    its KV cache update: ``block_pre`` (RMSNorm, qkv product, RoPE), ``kv_cache.update`` in Python
    (the slot contract that patches hook into), ``block_post`` (attention of each sequence over its
    own slot, output product, residual, RMSNorm, SwiGLU MLP, residual). Same math as
    ``Block.forward``; it removes ~25 small PyTorch ops per block, lets the native pool run every
    product of the block without returning to Python, and multiplies all B rows in one pass over
    each weight matrix."""

    def __init__(self, block: nn.Module, norm_eps: float):
        a, f = block.attention, block.feed_forward
        mods = (a.wqkv, a.wo, f.w13, f.w2)
        assert all(isinstance(m, QuantLinear) for m in mods), "FusedDecode needs QuantLinear weights"
        self.keep = (mods, block.attention_norm.weight, block.ffn_norm.weight)  # the pointers' owners
        self.L = native.layer_weights(tuple(m.fmt for m in mods), tuple(m.blocks for m in mods),
                                      block.attention_norm.weight, block.ffn_norm.weight, norm_eps,
                                      a.wo.out_features, f.hidden_dim, a.n_heads, a.n_kv_heads, a.head_dim)
        self.shapes = (a.n_heads, a.n_kv_heads, a.head_dim)
        self.buffers: dict[int, tuple] = {}  # B -> the new tokens' q, k, v, reused every step

    def _buffers(self, B: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if B not in self.buffers:
            H, Hkv, D = self.shapes
            self.buffers[B] = (torch.empty(B, H, 1, D), torch.empty(B, Hkv, 1, D),  # (B, H, 1, D), (B, H_kv, 1, D)
                               torch.empty(B, Hkv, 1, D))
        return self.buffers[B]

    @staticmethod
    def supported(block: nn.Module) -> bool:
        a, f = block.attention, block.feed_forward
        return (all(isinstance(m, QuantLinear) for m in (a.wqkv, a.wo, f.w13, f.w2)) and native.available()
                and native.attention_supported(a.n_heads, a.n_kv_heads, a.head_dim))

    def __call__(self, block: nn.Module, x: torch.Tensor, step) -> torch.Tensor:
        x = x.contiguous()  # (B, 1, dim), updated in place below
        q, k, v = self._buffers(x.shape[0])  # the cache's update copies k and v in
        native.block_pre(self.L, x, step.cos, step.sin, q, k, v)  # cos, sin (B, 1, D) contiguous
        k_all, v_all = block.attention.kv_cache.update(step.slots, step.positions, k, v)  # (N, H_kv, S, D)
        native.block_post(self.L, x, q, k_all, v_all, step.slots, step.lengths)
        return x


class FusedStep:
    """Every decoder block of a decode step in one native call (``native.decode_layers``): each
    block's ``FusedDecode`` halves with the KV write between them done natively too, in place of
    ``KVCache.update``. Runs only where engine/model.py's KVCache is the code that write stands in for
    (fast path ``native_kv``, engine/fastpaths.py); elsewhere (a patched cache, e.g. int8 KV) each
    block's ``FusedDecode`` calls the Python ``kv_cache.update``. Same arithmetic, the same bits;
    one call instead of ~30 Python-level steps per block."""

    def __init__(self, model: nn.Module):
        self.model = model
        fused = [layer.fused_decode for layer in model.layers]
        assert all(isinstance(f, FusedDecode) for f in fused), "FusedStep needs every block's FusedDecode"
        self.layers = (native.LayerW * len(fused))(*(f.L for f in fused))
        self.shapes = fused[0].shapes
        self.buffers: dict[int, tuple] = {}
        self.kv_key = None

    def _kv(self):
        caches = [layer.attention.kv_cache for layer in self.model.layers]
        key = tuple((id(c.k), id(c.v)) for c in caches)  # the cache's tensors, reallocated by setup_cache
        if key != self.kv_key:
            self.kvs = (native.KvW * len(caches))(*(native.kv_weights(c.k, c.v) for c in caches))
            self.kv_key, self.kv_keep = key, [(c.k, c.v) for c in caches]
        return self.kvs

    def __call__(self, x: torch.Tensor, step) -> torch.Tensor:
        B = x.shape[0]
        if B not in self.buffers:
            H, Hkv, D = self.shapes
            self.buffers[B] = (torch.empty(B, H * D), torch.empty(B, Hkv * D), torch.empty(B, Hkv * D))
        q, k, v = self.buffers[B]
        x = x.contiguous()  # (B, 1, dim), updated in place
        native.decode_layers(self.layers, self._kv(), x, step.cos, step.sin, q, k, v, step.slots.contiguous(),
                             step.positions.reshape(B).contiguous(), step.lengths.contiguous())
        return x


def weight_nbytes(model: nn.Module) -> int:
    """Bytes of weight storage a model holds, each tensor counted once (a tied table once); the KV
    cache and the RoPE tables are not weights. (Counted per tensor, not per storage: a converted
    model's tensors are views of one memory-mapped file.)"""
    seen, total = set(), 0
    tensors = [*model.parameters(), *(b for name, b in model.named_buffers() if name.endswith("blocks"))]
    tensors += [m.prepared.half for m in model.modules() if isinstance(m, (HalfLinear, HalfEmbedding))]
    for t in tensors:
        key = (t.data_ptr(), t.numel())
        if t.numel() and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


# --------------------------------------------------------------------------------------------------


def error_report(seed: int = 0) -> list[dict]:
    """Max error of each format's ``linear`` vs fp32 ``F.linear`` over the same (dequantized)
    weights, on SmolLM2-135M shapes (random weights of the model's typical magnitude), relative to
    the output's largest magnitude, for 1 and 16 rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    formats = ["fp16"] + (list(BLOCK_FORMATS) if native.available() else [])
    for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)):
        w = torch.randn(n, k, generator=g) * 0.05
        for fmt in formats:
            if fmt == "fp16":
                mod, wref = HalfLinear(w), w
            else:
                blocks = quantize_q4_1(w) if fmt == "q4_1" else quantize_q8_0(w)
                mod = QuantLinear(fmt, blocks, k)
                wref = dequantize_ref(fmt, blocks, k)
            for rows in (1, 16):
                x = torch.randn(rows, k, generator=g)
                ref, got = F.linear(x, wref), mod(x)
                err = float((got - ref).abs().max())
                out.append({"format": fmt, "shape": (n, k), "rows": rows, "max_abs": err,
                            "rel_to_max": err / float(ref.abs().max())})
    return out


if __name__ == "__main__":
    if not native.available():
        print(f"native kernels unavailable: {native.unavailable_reason()}")
    for r in error_report():
        print(f"{r['format']:<5} W {r['shape'][0]:>5}x{r['shape'][1]:<5} rows {r['rows']:>2}: max abs err "
              f"{r['max_abs']:.2e}, relative to max |y| {r['rel_to_max']:.2e}")
