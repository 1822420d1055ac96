"""Model loading: named random-weight models, GGUF files, and the engine's converted format.

- Named models (``tiny``, ``tiny-tied``): deterministic random weights and a byte-level tokenizer,
  for fast tests. The weights depend only on the name.
- GGUF (read with the ``gguf`` package's GGUFReader): Q4_1 and Q8_0 weights are kept as their
  blocks (``Blocks``, bytes verbatim); F32, F16, BF16, Q4_0 and the 1-D norms are dequantized to
  float32. llama.cpp's converter permutes the rows of attn_q/attn_k so that its RoPE rotates
  adjacent pairs; we undo that (as transformers' GGUF loader does; blocks run along a row, so whole
  rows move) and use the "rotate half" RoPE of ``model.py``. The BPE tokenizer (vocab, merges,
  special tokens) and the chat template come from the metadata.
- Converted directory (``python -m engine convert``, format v2): ``model.safetensors`` (this
  engine's parameter names; blocks in the kernels' split row layout, the rest float32),
  ``config.json``, ``tokenizer.json`` and ``chat_template.jinja``. Loading is a memory map of
  ``model.safetensors``: no copy, no decoding.

``build_model`` turns each weight, one at a time, into the format the matrix products use
(``linear``: the blocks themselves with the native kernels, fp16, or fp32), so a weight is held
once and a load never holds two copies of the model.

Models are chosen by explicit name (a named model) or by what the path is (a directory holding
``config.json``, or a file starting with the GGUF magic), never by the spelling of a path.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from torch import nn

from . import fastpaths
from .fastpaths import FastPathRefused  # noqa: F401 (engine.weights.FastPathRefused)
from .model import Embedding, Linear, ModelConfig, Transformer
from .tokenizer import Tokenizer

FORMAT = "pairbench-engine/v2"
LINEAR_KINDS = ("auto", "fp16", "fp32")
#: One default for ``load``, ``ServedModel`` and ``python -m engine serve``.
DEFAULT_LINEAR = "auto"
KV_KINDS = ("auto", "f16", "f32")


@dataclass(frozen=True)
class Blocks:
    """A weight kept in a GGUF block format (``engine.kernels.BLOCK_FORMATS``), exactly as stored."""

    fmt: str
    data: torch.Tensor  # (out, in/32 * block bytes) uint8
    shape: tuple[int, int]  # (out, in) of the weight it encodes
    layout: str = "gguf"  # "gguf" (the file's interleaved blocks) or "split" (engine.kernels.split_rows)

    def float(self) -> torch.Tensor:
        from .kernels import dequantize_ref, join_rows

        data = join_rows(self.fmt, self.data) if self.layout == "split" else self.data
        return dequantize_ref(self.fmt, data, self.shape[1])


def _shape(w) -> tuple[int, ...]:
    return tuple(w.shape) if isinstance(w, Blocks) else tuple(w.shape)


def _as_float(w) -> torch.Tensor:
    return w.float() if isinstance(w, Blocks) else w.float().contiguous()


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    linear: str = "fp32"  # what the matrix products resolved to: "fp32", "fp16" or "gguf" (native blocks)
    kv_dtype: str = "f32"

    @property
    def fast_paths(self) -> dict:
        """Which native fast paths run and why (``build_model``; ``engine.fastpaths``)."""
        return self.model.fast_paths

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (held once, by the tokenizer)."""
        return self.tokenizer.chat_template


# --------------------------------------------------------------------------------------------------
# Building the model from a state dict


def resolve_linear(linear: str, state: dict) -> str:
    """``auto`` -> ``gguf`` (the GGUF blocks with the native kernels) when the state holds blocks and
    engine.native is available, else ``fp16``. ``fp16`` and ``fp32`` are taken as asked."""
    if linear not in LINEAR_KINDS:
        raise ValueError(f"linear {linear!r} is not one of {LINEAR_KINDS}")
    if linear != "auto":
        return linear
    if any(isinstance(w, Blocks) for w in state.values()):
        from . import native

        if native.available():
            return "gguf"
    return "fp16"


def _make_linear(w, kind: str) -> nn.Module:
    from . import kernels

    if kind == "gguf" and isinstance(w, Blocks):
        return kernels.QuantLinear(w.fmt, w.data, w.shape[1], layout=w.layout)
    if kind in ("gguf", "fp16"):
        return kernels.HalfLinear(_as_float(w))
    weight = nn.Parameter(_as_float(w), requires_grad=False)
    return Linear(weight.shape[1], weight.shape[0], weight=weight)


def _make_embedding(w, kind: str) -> tuple[nn.Module, nn.Module]:
    """(embedding, tied lm_head) sharing one table in the decode format."""
    from . import kernels

    if kind == "gguf" and isinstance(w, Blocks):
        split = w.data if w.layout == "split" else kernels.split_rows(w.fmt, w.data)  # one table for both
        return (kernels.QuantEmbedding(w.fmt, split, w.shape[1], layout="split"),
                kernels.QuantLinear(w.fmt, split, w.shape[1], layout="split"))
    if kind in ("gguf", "fp16"):
        head = kernels.HalfLinear(_as_float(w))
        return kernels.HalfEmbedding(head.prepared), head
    emb = Embedding(*w.shape)
    emb.weight = nn.Parameter(_as_float(w), requires_grad=False)
    return emb, Linear(w.shape[1], w.shape[0], weight=emb.weight)


def build_model(cfg: ModelConfig, state: dict, max_context: int, linear: str = DEFAULT_LINEAR,
                kv: str = "auto", slots: int = 1, fused_decode: str | None = None,
                fast_paths_off=None) -> tuple[Transformer, str, str]:
    """A Transformer holding ``state`` (this engine's parameter names; values are float tensors or
    ``Blocks``), each weight converted once to the decode format ``linear`` resolves to, with its KV
    cache of ``slots`` sequences allocated. Returns (model, resolved linear kind, KV dtype name).

    ``fused_decode`` (``engine.fastpaths.MODES``; None: ``$PAIRBENCH_ENGINE_FUSED_DECODE`` or auto)
    says whether the native fast paths may stand in for the model's Python code, and
    ``fast_paths_off`` (names of ``engine.fastpaths.KNOWN``; None: ``$PAIRBENCH_ENGINE_FAST_PATHS_OFF``)
    turns single ones off; what runs is ``model.fast_paths`` (facts)."""
    from . import native

    mode, off = fastpaths.mode(fused_decode), fastpaths.off_set(fast_paths_off)
    with torch.device("meta"):
        model = Transformer(cfg)
    state = dict(state)
    if cfg.tie_embeddings and "output.weight" in state:
        raise ValueError("tied-embedding model must not carry a separate output.weight")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        shapes.pop("output.weight")
    missing, unexpected = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, value in state.items():
        if _shape(value) != shapes[key]:
            raise ValueError(f"weight {key}: shape {_shape(value)}, model expects {shapes[key]}")
    if kv not in KV_KINDS:
        raise ValueError(f"kv {kv!r} is not one of {KV_KINDS}")
    checks = fastpaths.check()
    kind, formats_fact = fastpaths.weight_kind(linear, lambda: resolve_linear(linear, state),
                                               checks["weight_formats"], mode, off)
    fast_attention, decode_fact = fastpaths.decode_allowed(mode, checks["fused_decode"], kind, cfg, off)
    kv_dtype = {"f16": torch.float16, "f32": torch.float32}.get(kv) or (
        torch.float16 if fast_attention else torch.float32)

    # One weight at a time, so the load never holds a second full copy (the peak RSS stays low).
    model.tok_embeddings, tied_head = _make_embedding(state.pop("tok_embeddings.weight"), kind)
    model.output = tied_head if cfg.tie_embeddings else _make_linear(state.pop("output.weight"), kind)
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        for parent, name in ((layer.attention, "wqkv"), (layer.attention, "wo"),
                             (layer.feed_forward, "w13"), (layer.feed_forward, "w2")):
            key = f"{p}{'attention' if parent is layer.attention else 'feed_forward'}.{name}.weight"
            setattr(parent, name, _make_linear(state.pop(key), kind))
    norms = {k: nn.Parameter(_as_float(v), requires_grad=False) for k, v in state.items()}
    model.load_state_dict(norms, strict=False, assign=True)
    model.eval()
    model.setup_cache(max_context, kv_dtype, slots)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise ValueError(f"weights do not fit the model: {leftover[:5]} not loaded")
    step_fact = fastpaths.fuse(model, decode_fact, checks["native_kv"], mode, off, cfg.norm_eps) if fast_attention \
        else fastpaths.step_not_fused(decode_fact, checks["native_kv"])
    model.fast_paths = {"mode": mode, "off": sorted(off), "fused_decode": decode_fact, "native_kv": step_fact,
                        "weight_formats": formats_fact}
    if kind == "gguf":  # the fastest instruction-set path for these products on this CPU (cached)
        from . import isa

        isa.choose(isa.model_step(model))
    return model, kind, {torch.float16: "f16", torch.float32: "f32"}[kv_dtype]


def _resolve_max_context(cfg: ModelConfig, max_context: int | None) -> int:
    if max_context is None:
        return cfg.context_length
    if not isinstance(max_context, int) or max_context < 1:
        raise ValueError(f"max_context must be a positive int, got {max_context!r}")
    if max_context > cfg.context_length:
        raise ValueError(f"max_context {max_context} exceeds the model's context_length {cfg.context_length}")
    return max_context


# --------------------------------------------------------------------------------------------------
# Named random-weight models


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_tokenizer() -> tokenizers.Tokenizer:
    """Special tokens at ids 0..2 (as in SmolLM2), then one token per byte (no merges)."""
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    byte_chars = bytes_to_unicode()
    for b in range(256):
        vocab[byte_chars[b]] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIALS])
    return tok


_TINY = dict(vocab_size=len(TINY_SPECIALS) + 256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
             norm_eps=1e-5, rope_theta=10000.0, context_length=8192)
# ``tiny`` has an untied lm_head: with tied random embeddings the logit of the input token itself
# dominates and greedy decoding repeats one token, which would make every test trivially pass.
NAMED_MODELS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(**_TINY, tie_embeddings=False),
    "tiny-tied": ModelConfig(**_TINY, tie_embeddings=True),
}


def random_state(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights: unit-scale embeddings, projections scaled by 1/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Transformer(cfg).state_dict().items()}
    if cfg.tie_embeddings:
        shapes.pop("output.weight")
    state = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("norm.weight"):
            state[key] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif key == "tok_embeddings.weight":
            state[key] = torch.randn(shape, generator=g)
        elif key == "output.weight":  # logits of std ~2: greedy choices well separated
            state[key] = 2.0 * torch.randn(shape, generator=g) / shape[1] ** 0.5
        else:
            state[key] = torch.randn(shape, generator=g) / shape[1] ** 0.5
    return state


def load_named(name: str, max_context: int | None, linear: str = DEFAULT_LINEAR, kv: str = "auto",
               slots: int = 1, fused_decode: str | None = None, fast_paths_off=None) -> LoadedModel:
    cfg = NAMED_MODELS[name]
    model, kind, kv_dtype = build_model(cfg, random_state(cfg, zlib.crc32(name.encode())),
                                        _resolve_max_context(cfg, max_context), linear, kv, slots, fused_decode,
                                        fast_paths_off)
    return LoadedModel(model=model, tokenizer=tiny_tokenizer(), config=cfg, name=name, linear=kind, kv_dtype=kv_dtype)


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(byte_level_tokenizer(), eos_id=2, bos_id=None, add_bos=False, chat_template=TINY_CHAT_TEMPLATE)


# --------------------------------------------------------------------------------------------------
# GGUF


def dequantize(data: np.ndarray, qtype, shape: tuple[int, ...], name: str = "?") -> torch.Tensor:
    """A GGUF tensor's data as float32 of ``shape`` (numpy order: rows first).

    Block formats (Q8_0, Q4_0, Q4_1) are decoded by ``gguf.quants.dequantize``; see
    tests/engine/test_gguf.py for a hand-written check of one block of each."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    if qtype == Q.F32:
        out = np.array(data, dtype=np.float32)  # a copy: the reader's memmap is read-only
    elif qtype == Q.F16:
        out = np.asarray(data).view(np.float16).astype(np.float32)
    elif qtype in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1):
        out = quants.dequantize(np.asarray(data), qtype).astype(np.float32, copy=False)
    else:
        raise ValueError(f"GGUF tensor {name}: type {Q(qtype).name} is not supported "
                         "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)")
    return torch.from_numpy(np.ascontiguousarray(out.reshape(shape)))


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp convert's q/k row permutation (its ``permute``), back to the HF layout."""
    out_dim = w.shape[0]
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFFile:
    """Metadata and tensors of a GGUF file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = path
        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default=...):
        field = self.reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"{self.path.name}: GGUF metadata key {key!r} is missing")
            return default
        return field.contents()

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ValueError(f"{self.path.name}: GGUF tensor {name!r} is missing")
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape))
        return dequantize(t.data, t.tensor_type, shape, name)

    def weight(self, name: str):
        """A 2-D weight as ``Blocks`` when the native kernels know its format (a copy of the bytes,
        verbatim), else dequantized to float32."""
        from gguf import GGMLQuantizationType as Q

        t = self.tensors.get(name)
        fmt = {Q.Q4_1: "q4_1", Q.Q8_0: "q8_0"}.get(t.tensor_type) if t is not None else None
        if fmt is None or len(t.shape) != 2:
            return self.tensor(name)
        out_f, in_f = int(t.shape[1]), int(t.shape[0])
        data = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(out_f, -1))  # (out, row bytes)
        return Blocks(fmt, data, (out_f, in_f))


def _unpermute(w, n_heads: int):
    if isinstance(w, Blocks):  # blocks run along a row, so the row permutation moves whole rows
        return Blocks(w.fmt, unpermute_rope(w.data, n_heads), w.shape)
    return unpermute_rope(w, n_heads)


def _cat_rows(parts: list):
    """Stack weights along the output dim; blocks stay blocks when all share one format."""
    if all(isinstance(p, Blocks) for p in parts) and len({p.fmt for p in parts}) == 1:
        data = torch.cat([p.data for p in parts])
        return Blocks(parts[0].fmt, data, (sum(p.shape[0] for p in parts), parts[0].shape[1]))
    return torch.cat([_as_float(p) for p in parts])


def gguf_config(g: GGUFFile) -> ModelConfig:
    arch = g.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{g.path.name}: general.architecture is {arch!r}; only 'llama' is supported")
    dim = int(g.get("llama.embedding_length"))
    n_heads = int(g.get("llama.attention.head_count"))
    if "rope_freqs.weight" in g.tensors or g.get("llama.rope.scaling.type", None) not in (None, "none"):
        raise ValueError(f"{g.path.name}: RoPE scaling is not supported")
    rope_dim = int(g.get("llama.rope.dimension_count", dim // n_heads))
    if rope_dim != dim // n_heads:
        raise ValueError(f"{g.path.name}: llama.rope.dimension_count {rope_dim} != head_dim {dim // n_heads}")
    return ModelConfig(
        vocab_size=len(g.get("tokenizer.ggml.tokens")),
        dim=dim,
        n_layers=int(g.get("llama.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(g.get("llama.attention.head_count_kv", n_heads)),
        hidden_dim=int(g.get("llama.feed_forward_length")),
        norm_eps=float(g.get("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(g.get("llama.rope.freq_base", 10000.0)),
        context_length=int(g.get("llama.context_length")),
        tie_embeddings="output.weight" not in g.tensors,
    )


def gguf_state(g: GGUFFile, cfg: ModelConfig) -> dict:
    """This engine's state dict from a GGUF: 2-D weights as ``Blocks`` where the native kernels know
    the format (``GGUFFile.weight``), norms and the rest as float32."""
    state = {"tok_embeddings.weight": g.weight("token_embd.weight"), "norm.weight": g.tensor("output_norm.weight")}
    if not cfg.tie_embeddings:
        state["output.weight"] = g.weight("output.weight")
    for i in range(cfg.n_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        q = _unpermute(g.weight(b + "attn_q.weight"), cfg.n_heads)
        k = _unpermute(g.weight(b + "attn_k.weight"), cfg.n_kv_heads)
        state[p + "attention.wqkv.weight"] = _cat_rows([q, k, g.weight(b + "attn_v.weight")])
        state[p + "attention.wo.weight"] = g.weight(b + "attn_output.weight")
        state[p + "feed_forward.w13.weight"] = _cat_rows([g.weight(b + "ffn_gate.weight"), g.weight(b + "ffn_up.weight")])
        state[p + "feed_forward.w2.weight"] = g.weight(b + "ffn_down.weight")
        state[p + "attention_norm.weight"] = g.tensor(b + "attn_norm.weight")
        state[p + "ffn_norm.weight"] = g.tensor(b + "ffn_norm.weight")
    known = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(cfg.n_layers) for n in (
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm")}
    extra = sorted(set(g.tensors) - known)
    if extra:
        raise ValueError(f"{g.path.name}: unsupported tensors {extra[:5]}")
    return state


# Pre-tokenizers by ``tokenizer.ggml.pre`` (llama.cpp's names), as in the models' own tokenizer.json.
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre in ("llama-bpe", "llama3"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ValueError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported (smollm, default, gpt-2, llama-bpe)")


def gguf_tokenizer(g: GGUFFile) -> tuple[tokenizers.Tokenizer, dict]:
    kind = g.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{g.path.name}: tokenizer.ggml.model {kind!r} is not supported (only BPE 'gpt2')")
    tokens = list(g.get("tokenizer.ggml.tokens"))
    types = list(g.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in g.get("tokenizer.ggml.merges", [])]
    try:
        tok = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    except Exception as e:  # tokenizers raises a bare Exception for an inconsistent vocab/merges
        raise ValueError(f"{g.path.name}: tokenizer.ggml.tokens/merges do not form a BPE model: {e}") from e
    tok.pre_tokenizer = _pre_tokenizer(str(g.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    # Control (3) and user-defined (4) tokens are matched whole in the text, as llama.cpp does.
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == 4])
    eos = int(g.get("tokenizer.ggml.eos_token_id"))
    bos = g.get("tokenizer.ggml.bos_token_id", None)
    eot = g.get("tokenizer.ggml.eot_token_id", None)
    meta = {"eos_id": eos, "bos_id": None if bos is None else int(bos),
            "add_bos": bool(g.get("tokenizer.ggml.add_bos_token", False)),
            "stop_ids": [] if eot is None else [int(eot)]}
    return tok, meta


def read_gguf(path: Path):
    """(config, state dict, tokenizers.Tokenizer, tokenizer meta, chat template, name) of a GGUF."""
    g = GGUFFile(path)
    cfg = gguf_config(g)
    tok, meta = gguf_tokenizer(g)
    template = g.get("tokenizer.chat_template", None)
    name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    return cfg, gguf_state(g, cfg), tok, meta, template, name


def _loaded(cfg, state, tok, meta, template, name, max_context, linear, kv, slots=1,
            fused_decode=None, fast_paths_off=None) -> LoadedModel:
    model, kind, kv_dtype = build_model(cfg, state, _resolve_max_context(cfg, max_context), linear, kv, slots,
                                        fused_decode, fast_paths_off)
    return LoadedModel(model=model, tokenizer=_tokenizer(tok, meta, template), config=cfg, name=name, linear=kind,
                       kv_dtype=kv_dtype)


def _tokenizer(tok: tokenizers.Tokenizer, meta: dict, template: str | None) -> Tokenizer:
    return Tokenizer(tok, eos_id=meta["eos_id"], bos_id=meta.get("bos_id"), add_bos=meta.get("add_bos", False),
                     chat_template=template, stop_ids=meta.get("stop_ids", []))


# --------------------------------------------------------------------------------------------------
# Converted format (v2): the GGUF's blocks verbatim (already un-permuted and fused), norms in fp32


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write the fast-loading form of a GGUF model into ``out_dir`` (created; must not hold a model).

    ``model.safetensors`` holds each weight's GGUF bytes: block formats as uint8 tensors in the
    kernels' split row layout (``engine.kernels.split_rows``: the same bytes regrouped per row; their
    format, logical shape and layout listed under ``weights`` in ``config.json``), the rest float32."""
    from safetensors.torch import save_file

    cfg, state, tok, meta, template, name = read_gguf(Path(gguf_path))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors, formats = {}, {}
    from .kernels import split_rows

    for key, w in state.items():
        if isinstance(w, Blocks):  # stored in the kernels' split row layout: loading is a memory map
            tensors[key] = split_rows(w.fmt, w.data)
            formats[key] = {"format": w.fmt, "shape": list(w.shape), "layout": "split"}
        else:
            tensors[key] = w.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"))
    tok.save(str(out_dir / "tokenizer.json"))
    if template is not None:
        (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    doc = {"format": FORMAT, "name": name, "model": cfg.to_dict(), "tokenizer": meta, "weights": formats,
           "source": {"file": Path(gguf_path).name}}
    (out_dir / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out_dir


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8,
              "I8": torch.int8, "I32": torch.int32, "I64": torch.int64}


def mmap_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file as views of one private (copy-on-write) memory map: no copy
    at load, the weights live once, in the page cache, and pages come in as they are first used."""
    import mmap
    import struct

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8:8 + n])
    header.pop("__metadata__", None)
    base = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the map alive as long as any view lives
    out = {}
    for key, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {key} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = base[8 + n + begin: 8 + n + end]
        out[key] = raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def load_converted(path: Path, max_context: int | None, linear: str, kv: str, slots: int = 1,
                   fused_decode: str | None = None, fast_paths_off=None) -> LoadedModel:
    doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path / 'config.json'}: format {doc.get('format')!r}, expected {FORMAT!r} "
                         "(convert the GGUF again with `python -m engine convert`)")
    cfg = ModelConfig.from_dict(doc["model"])
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    template_file = path / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.exists() else None
    state = mmap_safetensors(path / "model.safetensors")
    for key, info in doc.get("weights", {}).items():
        state[key] = Blocks(info["format"], state[key], tuple(info["shape"]), info.get("layout", "gguf"))
    return _loaded(cfg, state, tok, doc["tokenizer"], template, doc["name"], max_context, linear, kv, slots,
                   fused_decode, fast_paths_off)


def load_tokenizer(spec: str) -> tuple[Tokenizer, str, int]:
    """(tokenizer, model name, context length) of a model, without loading its weights."""
    if spec in NAMED_MODELS:
        return tiny_tokenizer(), spec, NAMED_MODELS[spec].context_length
    path = Path(spec)
    if path.is_dir() and (path / "config.json").exists():
        doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
        meta, template_file = doc["tokenizer"], path / "chat_template.jinja"
        template = template_file.read_text(encoding="utf-8") if template_file.exists() else None
        tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        name, ctx = doc["name"], int(doc["model"]["context_length"])
    elif path.is_file():
        g = GGUFFile(path)
        tok, meta = gguf_tokenizer(g)
        template = g.get("tokenizer.chat_template", None)
        name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
        ctx = int(gguf_config(g).context_length)
    else:
        raise ValueError(f"model {spec!r} is neither a named model, a converted directory nor a GGUF file")
    return _tokenizer(tok, meta, template), name, ctx


def load(spec: str, max_context: int | None = None, linear: str = DEFAULT_LINEAR, kv: str = "auto",
         slots: int = 1, fused_decode: str | None = None, fast_paths_off=None) -> LoadedModel:
    """Load a model: a name in NAMED_MODELS, a converted directory, or a GGUF file.

    ``linear`` picks the weight format of the matrix products (``engine.kernels``): ``auto`` (the
    default everywhere: a GGUF's own q4_1/q8_0 blocks with the native kernels when they are
    available, else fp16), ``fp16``, or ``fp32`` (the exact reference). ``kv``: the KV cache's
    dtype, ``auto`` (f16 when the native attention kernel serves it, else f32), ``f16`` or ``f32``.
    ``slots``: sequences the KV cache holds, each of ``max_context`` positions (the server's
    ``--parallel``). ``fused_decode``: ``auto`` (None: ``$PAIRBENCH_ENGINE_FUSED_DECODE``, else auto)
    runs each native fast path where this tree's model code is the code it stands in for
    (``engine.fastpaths``), ``on`` refuses to load unless every one runs, ``off`` runs the Python
    decode path; ``fast_paths_off`` (names of ``engine.fastpaths.KNOWN``, or None:
    ``$PAIRBENCH_ENGINE_FAST_PATHS_OFF``) turns single fast paths off. Every weight is held once, in the format decode uses."""
    if linear not in LINEAR_KINDS:
        raise ValueError(f"linear {linear!r} is not one of {LINEAR_KINDS}")
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")
    if spec in NAMED_MODELS:
        return load_named(spec, max_context, linear, kv, slots, fused_decode, fast_paths_off)
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model directory {spec} has no config.json (make one with `python -m engine convert`)")
        return load_converted(path, max_context, linear, kv, slots, fused_decode, fast_paths_off)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"model file {spec} is not a GGUF file (magic {magic!r})")
        return _loaded(*read_gguf(path), max_context, linear, kv, slots, fused_decode, fast_paths_off)
    raise ValueError(f"model {spec!r} is neither a named model ({', '.join(NAMED_MODELS)}), "
                     "a converted directory nor a GGUF file")
