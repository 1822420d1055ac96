"""The Llama-architecture decoder: config, modules and the KV cache, in plain PyTorch.

Shape and structure follow pytorch-labs/gpt-fast and the Llama papers: RMSNorm, rotary position
embeddings (the "rotate half" layout used by Hugging Face; GGUF's permuted q/k weights are undone at
load time in ``weights.py``), grouped-query attention through ``F.scaled_dot_product_attention`` and
a SwiGLU MLP. One sequence at a time (batch 1): the server runs one generation at a time.

All matrix multiplications by weights go through ``Linear`` / ``linear`` below, so a faster kernel
can be plugged in at that single point without touching the rest: ``engine.kernels`` swaps in its
fp16 and GGUF-block modules at load (``engine.weights.build_model``). Two optional one-token fast
paths are set at load too, each with the same math as the code here: ``Attention.decode_attention``
(a native kernel reading an f16 cache) and ``Block.fused_decode`` (the whole block in two native
calls around ``kv_cache.update``). This file stays the reference; tests hold the fast paths to it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Llama-family decoder (names follow gpt-fast's ModelArgs)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    context_length: int = 2048
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for key in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "context_length"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{key} must be a positive int, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"ModelConfig: dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim {self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown keys {unknown}")
        return cls(**d)


# --------------------------------------------------------------------------------------------------
# The single place where weights multiply activations.


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T. weight: (out, in); x: (..., in) -> (..., out)."""
    return F.linear(x, weight)


class Linear(nn.Module):
    """A bias-free linear layer whose forward is ``linear`` (the kernel plug-in point)."""

    def __init__(self, in_features: int, out_features: int, weight: nn.Parameter | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        if weight is None:
            weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight = weight  # (out, in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


# --------------------------------------------------------------------------------------------------


class KVCache(nn.Module):
    """Keys and values of one attention layer, preallocated to ``max_context`` positions, stored in
    ``dtype`` (float16 when engine.native's attention kernel reads the cache, float32 otherwise).

    Contract of ``update(positions, k, v)``:
      positions: (T,) int64, the absolute positions of the T new tokens, ascending and contiguous;
      k, v:      (1, H_kv, T, D), the new keys/values (keys already rotated);
      returns (k_all, v_all): (1, H_kv, positions[-1] + 1, D), views of every cached position up to
      and including the last new one. Positions before positions[0] must have been written earlier
      (or be reused from a previous request's common prefix).
    """

    def __init__(self, max_context: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.max_context = max_context
        shape = (1, n_kv_heads, max_context, head_dim)  # (B, H_kv, S, D)
        # Uninitialized on purpose: a position is always written before it is read (the contract
        # above), so the pages of positions never used are never touched and resident memory
        # follows the longest sequence served, not max_context.
        self.register_buffer("k", torch.empty(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.empty(shape, dtype=dtype), persistent=False)

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = positions.shape[0]
        assert positions.dim() == 1 and k.shape == v.shape == (1, self.k.shape[1], T, self.k.shape[3]), (
            f"KVCache.update: positions {tuple(positions.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            f"expected (T,), (1, {self.k.shape[1]}, T, {self.k.shape[3]})"
        )
        end = int(positions[-1]) + 1
        assert end <= self.max_context, f"KVCache.update: position {end - 1} beyond max_context {self.max_context}"
        self.k.index_copy_(2, positions, k.to(self.k.dtype))  # rounds to an f16 cache's dtype
        self.v.index_copy_(2, positions, v.to(self.v.dtype))
        return self.k[:, :, :end], self.v[:, :, :end]

    def nbytes(self) -> int:
        """Bytes of KV storage held (what the server reports as ``memory.kv_bytes``)."""
        return self.k.nelement() * self.k.element_size() + self.v.nelement() * self.v.element_size()


# --------------------------------------------------------------------------------------------------


class Embedding(nn.Module):
    """Token embedding table. Not ``nn.Embedding``: its random init on the meta device imports
    torch._dynamo, which costs seconds at every server start."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)  # (V, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (length, head_dim), "rotate half" layout (as in HF Llama)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))  # (D/2,)
    t = torch.arange(length, dtype=torch.int64).float()  # (S,)
    freqs = torch.outer(t, inv_freq)  # (S, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (S, D)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (1, H, T, D); cos/sin: (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (1, H, T, D)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.split = (q_out, kv_out, kv_out)
        # q, k and v projections fused into one matrix: one matvec per layer instead of three.
        self.wqkv = Linear(cfg.dim, q_out + 2 * kv_out)
        self.wo = Linear(q_out, cfg.dim)
        self.kv_cache: KVCache | None = None
        # Optional single-token attention kernel (q (1, H, 1, D), k, v (1, H_kv, S, D)) -> (1, 1, H*D);
        # set at load (engine.weights) when engine.native is available, else SDPA below.
        self.decode_attention = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        _, T, _ = x.shape  # (1, T, dim)
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(1, T, self.n_heads, self.head_dim).transpose(1, 2)  # (1, H, T, D)
        k = k.view(1, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (1, H_kv, T, D)
        v = v.view(1, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (1, H_kv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = self.kv_cache.update(positions, k, v)  # (1, H_kv, S, D), the cache's dtype
        if T == 1 and self.decode_attention is not None:
            y = self.decode_attention(q, k, v)  # (1, 1, H*D): engine.native's kernel reads f16 KV as is
        elif T == 1:
            # Decode: one query per head attends to every cached position, so fold the query heads
            # that share a KV head into the "sequence" axis and skip the GQA expansion entirely.
            rep = self.n_heads // self.n_kv_heads
            qg = q.view(1, self.n_kv_heads, rep, self.head_dim)  # (1, H_kv, rep, D)
            y = F.scaled_dot_product_attention(qg, k.to(q.dtype), v.to(q.dtype))  # (1, H_kv, rep, D)
            y = y.reshape(1, 1, self.n_heads * self.head_dim)  # (1, 1, H*D)
        else:
            # Prefill: widen an f16 cache to the queries' dtype once per layer (cheap beside the GEMMs).
            y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                               is_causal=mask is None, enable_gqa=True)  # (1, H, T, D)
            y = y.transpose(1, 2).reshape(1, T, self.n_heads * self.head_dim)  # (1, T, H*D)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hidden_dim = cfg.hidden_dim
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim)  # gate (w1) and up (w3) fused
        self.w2 = Linear(cfg.hidden_dim, cfg.dim)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (1, T, hidden) each
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        # Optional one-token fast path, set at load when every weight is in a native block format
        # (engine.kernels.FusedDecode): the same math in two native calls around kv_cache.update.
        self.fused_decode = None

    def forward(self, x, cos, sin, positions, mask):
        if x.shape[1] == 1 and self.fused_decode is not None:
            return self.fused_decode(self, x, cos, sin, positions)  # (1, 1, dim)
        h = x + self.attention(self.attention_norm(x), cos, sin, positions, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = Linear(cfg.dim, cfg.vocab_size,
                             weight=self.tok_embeddings.weight if cfg.tie_embeddings else None)
        self.max_context = 0
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def setup_cache(self, max_context: int, dtype: torch.dtype = torch.float32) -> None:
        """Allocate a KV cache of ``max_context`` positions per layer, and the RoPE tables."""
        cfg = self.config
        self.max_context = max_context
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(max_context, cfg.n_kv_heads, cfg.head_dim, dtype)
        self.rope_cos, self.rope_sin = rope_tables(cfg.head_dim, max_context, cfg.rope_theta)

    def kv_nbytes(self) -> int:
        return sum(layer.attention.kv_cache.nbytes() for layer in self.layers)

    def kv_bytes_per_position(self) -> int:
        return self.kv_nbytes() // self.max_context if self.max_context else 0

    def forward(self, tokens: torch.Tensor, start: int, all_logits: bool = False) -> torch.Tensor:
        """tokens: (1, T) int64 at absolute positions start..start+T-1, whose KV is written to the cache.

        Every position before ``start`` must already be in the cache. Returns float32 logits of
        shape (T, vocab) if ``all_logits`` else (vocab,) for the last position.
        """
        T = tokens.shape[1]
        end = start + T
        if end > self.max_context:
            raise ValueError(f"sequence of {end} tokens exceeds max_context {self.max_context}")
        positions = torch.arange(start, end)  # (T,)
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]  # (T, D)
        mask = None
        if T > 1 and start > 0:
            # Queries start+i may see keys 0..start+i; SDPA's is_causal would align them top-left.
            # Additive float, built once for all layers: SDPA would otherwise widen a bool mask to
            # float in every layer (a (T, S) float32 allocation per layer, page faults included).
            allowed = torch.ones(T, end, dtype=torch.bool).tril(diagonal=start)  # (T, S)
            mask = torch.zeros(T, end).masked_fill_(~allowed, float("-inf"))  # (T, S)
        x = self.tok_embeddings(tokens)  # (1, T, dim)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, mask)
        if not all_logits:
            x = x[:, -1:]  # (1, 1, dim): the lm_head is the largest matrix; apply it once
        logits = self.output(self.norm(x))  # (1, T', vocab)
        return logits[0].float() if all_logits else logits[0, -1].float()
