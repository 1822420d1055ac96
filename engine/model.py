"""The Llama-architecture decoder: config, modules and the KV cache, in plain PyTorch.

Shape and structure follow pytorch-labs/gpt-fast and the Llama papers: RMSNorm, rotary position
embeddings (the "rotate half" layout used by Hugging Face; GGUF's permuted q/k weights are undone at
load time in ``weights.py``), grouped-query attention through ``F.scaled_dot_product_attention`` and
a SwiGLU MLP.

Many sequences at once, as llama.cpp's server and vLLM serve them: the KV cache holds ``n_slots``
sequences ("slots", llama.cpp's word), and one forward pass is either one sequence's prompt chunk
(B = 1, T tokens; ``forward``) or one new token of each of B sequences, each at its own position in
its own slot (T = 1; ``decode``). Every token's computation is the same in both, and the same
whatever else is in the batch: rows never mix except in the KV slot each sequence owns.

All matrix multiplications by weights go through ``Linear`` / ``linear`` below, so a faster kernel
can be plugged in at that single point without touching the rest: ``engine.kernels`` swaps in its
fp16 and GGUF-block modules at load (``engine.weights.build_model``). Two optional one-token fast
paths are set at load too, each with the same math as the code here: ``Attention.decode_attention``
(a native kernel reading an f16 cache), ``Block.fused_decode`` (the whole block in two native
calls around ``kv_cache.update``) and ``Transformer.fused_step`` (every block, the KV write
included, in one call). This file stays the reference; tests hold the fast paths to it, and each
runs only where the code here is the code it was written for (``engine.fastpaths``).
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
    """Keys and values of one attention layer for ``n_slots`` sequences, each preallocated to
    ``max_context`` positions, stored in ``dtype`` (float16 when engine.native's attention kernel
    reads the cache, float32 otherwise).

    Contract of ``update(slots, positions, k, v)`` (the slot contract):
      slots:     (B,) int64, distinct slots in [0, n_slots): slot slots[b] belongs to sequence b;
      positions: (B, T) int64, row b the absolute positions of sequence b's T new tokens, ascending
                 and contiguous, below max_context;
      k, v:      (B, H_kv, T, D), the new keys/values (keys already rotated);
      returns (k_all, v_all): (n_slots, H_kv, S, D) with S > every written position, in which
      [slots[b], :, :positions[b, -1] + 1] holds every key/value of sequence b up to and including
      its newest one. Positions before positions[b, 0] must have been written earlier into the same
      slot (or be reused from a previous request's common prefix). Other slots are never touched.
    """

    def __init__(self, max_context: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                 n_slots: int = 1):
        super().__init__()
        self.max_context, self.n_slots = max_context, n_slots
        shape = (n_slots, n_kv_heads, max_context, head_dim)  # (N, H_kv, S, D)
        # Uninitialized on purpose: a position is always written before it is read (the contract
        # above), so the pages of positions never used are never touched and resident memory
        # follows the longest sequences served, not n_slots x max_context. Plain attributes, not
        # module buffers: they are read several times per layer and token, and a buffer's lookup
        # through nn.Module costs ~2 us each.
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)

    def update(self, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = positions.shape
        _, H, S, D = self.k.shape
        assert slots.shape == (B,) and k.shape == v.shape == (B, H, T, D), (
            f"KVCache.update: slots {tuple(slots.shape)}, positions {tuple(positions.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}; expected (B,), (B, T), (B, {H}, T, {D})")
        if B == 1:  # one sequence (a prompt chunk, or a lone decode step): a copy into its slot's positions
            s, first = slots.item(), (positions.item() if T == 1 else int(positions[0, 0]))  # (.item(): ~0.4 us)
            assert 0 <= s < self.n_slots, f"KVCache.update: slot {s} outside [0, {self.n_slots})"
            assert first + T <= self.max_context, (
                f"KVCache.update: position {first + T - 1} beyond max_context {self.max_context}")
            self.k[s, :, first:first + T].copy_(k[0])  # positions are contiguous; rounds to an f16 cache's dtype
            self.v[s, :, first:first + T].copy_(v[0])
        else:
            rows = self._rows(slots, positions, H, S)
            self.k.view(-1, D).index_copy_(0, rows, k.reshape(-1, D).to(self.k.dtype))
            self.v.view(-1, D).index_copy_(0, rows, v.reshape(-1, D).to(self.v.dtype))
        return self.k, self.v

    _last = (None, None, None, None)  # (slots, positions, geometry, rows): shared by a step's layers

    def _rows(self, slots: torch.Tensor, positions: torch.Tensor, H: int, S: int) -> torch.Tensor:
        """(B * H_kv * T,) rows of the cache seen as (N * H_kv * S, D) where each new key goes; the
        contract's checks. Every layer of a decode step passes the same tensors: computed once."""
        geometry = (self.n_slots, H, S, self.max_context)
        last = KVCache._last
        if last[0] is slots and last[1] is positions and last[2] == geometry:
            return last[3]
        assert len(set(slots.tolist())) == len(slots), f"KVCache.update: slots {slots.tolist()} are not distinct"
        assert int(slots.max()) < self.n_slots and int(slots.min()) >= 0, f"KVCache.update: slots {slots.tolist()}"
        end = int(positions[:, -1].max())
        assert end < self.max_context, f"KVCache.update: position {end} beyond max_context {self.max_context}"
        rows = ((slots * (H * S))[:, None, None] + (torch.arange(H) * S)[:, None] + positions[:, None, :]).reshape(-1)
        KVCache._last = (slots, positions, geometry, rows)
        return rows

    def nbytes(self) -> int:
        """Bytes of KV storage held (what the server reports as ``memory.kv_bytes``), all slots."""
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
    """x: (B, H, T, D); cos/sin: (B, T, D), each row's own positions."""
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, H, T, D)
    return x * cos + rotated * sin


@dataclass
class Step:
    """What one forward pass reads and writes: one sequence's chunk (B = 1, T tokens) or one new
    token of each of B sequences (T = 1)."""

    slots: torch.Tensor      # (B,) int64, the sequences' KV slots
    positions: torch.Tensor  # (B, T) int64, absolute positions of the new tokens
    lengths: torch.Tensor    # (B,) int64, positions[:, -1] + 1: how many positions each sequence attends to
    cos: torch.Tensor        # (B, T, D) RoPE rows of the new tokens
    sin: torch.Tensor
    mask: torch.Tensor | None  # (T, S) additive mask of a chunk after cached positions (B = 1), else None


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
        # Optional single-token attention kernel (q (B, H, 1, D), the cache k, v (N, H_kv, S, D),
        # slots, lengths) -> (B, 1, H*D); set at load (engine.weights) when engine.native is
        # available, else SDPA below.
        self.decode_attention = None

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        B, T, _ = x.shape  # (B, T, dim)
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        k_all, v_all = self.kv_cache.update(step.slots, step.positions, k, v)  # (N, H_kv, S, D), the cache's dtype
        if T == 1 and self.decode_attention is not None:
            # engine.native's kernel reads each sequence's slot of the f16 cache as is
            y = self.decode_attention(q, k_all, v_all, step.slots, step.lengths)  # (B, 1, H*D)
        elif T == 1:
            # Decode: one query per head attends to every cached position of its own slot, so fold
            # the query heads that share a KV head into the "sequence" axis and skip the GQA expansion.
            rep = self.n_heads // self.n_kv_heads
            rows = []
            for b, (s, n) in enumerate(zip(step.slots.tolist(), step.lengths.tolist())):
                qg = q[b:b + 1].view(1, self.n_kv_heads, rep, self.head_dim)  # (1, H_kv, rep, D)
                ks, vs = k_all[s:s + 1, :, :n], v_all[s:s + 1, :, :n]  # (1, H_kv, S_b, D)
                rows.append(F.scaled_dot_product_attention(qg, ks.to(q.dtype), vs.to(q.dtype)))  # (1, H_kv, rep, D)
            y = torch.cat(rows).reshape(B, 1, self.n_heads * self.head_dim)  # (B, 1, H*D)
        else:
            # Prefill of one sequence's chunk: widen an f16 cache to the queries' dtype once per layer
            # (cheap beside the GEMMs).
            assert B == 1, "a multi-token pass is one sequence's chunk"
            s, n = int(step.slots[0]), int(step.lengths[0])
            ks, vs = k_all[s:s + 1, :, :n], v_all[s:s + 1, :, :n]  # (1, H_kv, S, D)
            y = F.scaled_dot_product_attention(q, ks.to(q.dtype), vs.to(q.dtype), attn_mask=step.mask,
                                               is_causal=step.mask is None, enable_gqa=True)  # (1, H, T, D)
            y = y.transpose(1, 2).reshape(1, T, self.n_heads * self.head_dim)  # (1, T, H*D)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hidden_dim = cfg.hidden_dim
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim)  # gate (w1) and up (w3) fused
        self.w2 = Linear(cfg.hidden_dim, cfg.dim)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (B, T, hidden) each
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

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        if x.shape[1] == 1 and self.fused_decode is not None:
            return self.fused_decode(self, x, step)  # (B, 1, dim)
        h = x + self.attention(self.attention_norm(x), step)
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
        self.n_slots = 0
        # Optional one-token fast path over every block at once, set at load where every block has its
        # fused_decode and the KV cache is this file's (engine.kernels.FusedStep): the same math as
        # the loop in _run, with KVCache.update's write done natively.
        self.fused_step = None
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def setup_cache(self, max_context: int, dtype: torch.dtype = torch.float32, n_slots: int = 1) -> None:
        """Allocate a KV cache of ``n_slots`` sequences x ``max_context`` positions per layer, and the
        RoPE tables."""
        cfg = self.config
        self.max_context, self.n_slots = max_context, n_slots
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(max_context, cfg.n_kv_heads, cfg.head_dim, dtype, n_slots)
        self.rope_cos, self.rope_sin = rope_tables(cfg.head_dim, max_context, cfg.rope_theta)

    def kv_nbytes(self) -> int:
        return sum(layer.attention.kv_cache.nbytes() for layer in self.layers)

    def kv_bytes_per_position(self) -> int:
        """Bytes of KV per position of one sequence (one slot)."""
        return self.kv_nbytes() // (self.max_context * self.n_slots) if self.max_context else 0

    def _run(self, tokens: torch.Tensor, step: Step, all_logits: bool) -> torch.Tensor:
        x = self.tok_embeddings(tokens)  # (B, T, dim)
        if tokens.shape[1] == 1 and self.fused_step is not None:
            x = self.fused_step(x, step)
        else:
            for layer in self.layers:
                x = layer(x, step)
        if not all_logits:
            x = x[:, -1:]  # (B, 1, dim): the lm_head is the largest matrix; apply it once per sequence
        return self.output(self.norm(x))  # (B, T', vocab)

    def forward(self, tokens: torch.Tensor, start: int, all_logits: bool = False, slot: int = 0) -> torch.Tensor:
        """tokens: (1, T) int64 of one sequence at absolute positions start..start+T-1, whose KV is
        written to slot ``slot`` of the cache.

        Every position before ``start`` must already be in that slot. Returns float32 logits of
        shape (T, vocab) if ``all_logits`` else (vocab,) for the last position.
        """
        T = tokens.shape[1]
        end = start + T
        if end > self.max_context:
            raise ValueError(f"sequence of {end} tokens exceeds max_context {self.max_context}")
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} outside the cache's {self.n_slots} slots")
        mask = None
        if T > 1 and start > 0:
            # Queries start+i may see keys 0..start+i; SDPA's is_causal would align them top-left.
            # Additive float, built once for all layers: SDPA would otherwise widen a bool mask to
            # float in every layer (a (T, S) float32 allocation per layer, page faults included).
            allowed = torch.ones(T, end, dtype=torch.bool).tril(diagonal=start)  # (T, S)
            mask = torch.zeros(T, end).masked_fill_(~allowed, float("-inf"))  # (T, S)
        step = Step(slots=torch.tensor([slot]), positions=torch.arange(start, end)[None], lengths=torch.tensor([end]),
                    cos=self.rope_cos[None, start:end], sin=self.rope_sin[None, start:end], mask=mask)  # (1, T, D)
        logits = self._run(tokens, step, all_logits)
        return logits[0].float() if all_logits else logits[0, -1].float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One new token of each of B sequences: tokens, positions, slots (B,) int64 (distinct
        slots; sequence b's positions before positions[b] already in its slot). Returns (B, vocab)
        float32 logits of each sequence's next token."""
        if int(positions.max()) >= self.max_context:
            raise ValueError(f"position {int(positions.max())} beyond max_context {self.max_context}")
        pos = positions[:, None]  # (B, 1)
        step = Step(slots=slots, positions=pos, lengths=positions + 1, cos=self.rope_cos[pos],
                    sin=self.rope_sin[pos], mask=None)  # cos, sin (B, 1, D)
        return self._run(tokens[:, None], step, all_logits=False)[:, 0].float()  # (B, vocab)
