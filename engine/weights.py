"""Model loading: named random-weight models, GGUF files, and the engine's converted format.

- Named models (``tiny``, ``tiny-tied``): deterministic random weights and a byte-level tokenizer,
  for fast tests. The weights depend only on the name.
- GGUF (read with the ``gguf`` package's GGUFReader): F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors are
  dequantized to float32. llama.cpp's converter permutes the rows of attn_q/attn_k so that its RoPE
  rotates adjacent pairs; we undo that (as transformers' GGUF loader does) and use the "rotate half"
  RoPE of ``model.py``. The BPE tokenizer (vocab, merges, special tokens) and the chat template
  come from the metadata.
- Converted directory (``python -m engine convert``): ``model.safetensors`` (float32, this engine's
  parameter names), ``config.json``, ``tokenizer.json`` and ``chat_template.jinja``. It loads in
  seconds because nothing needs dequantizing.

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

from .model import ModelConfig, Transformer
from .tokenizer import Tokenizer

FORMAT = "pairbench-engine/v1"
DEFAULT_MAX_CONTEXT = 4096


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    chat_template: str | None


# --------------------------------------------------------------------------------------------------
# Building the model from a state dict


def build_model(cfg: ModelConfig, state: dict[str, torch.Tensor], max_context: int) -> Transformer:
    """A Transformer holding ``state`` (this engine's parameter names), with its KV cache allocated."""
    with torch.device("meta"):
        model = Transformer(cfg)
    state = dict(state)
    if cfg.tie_embeddings:
        if "output.weight" in state:
            raise ValueError("tied-embedding model must not carry a separate output.weight")
        state["output.weight"] = state["tok_embeddings.weight"]
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = set(shapes)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, value in state.items():
        if tuple(value.shape) != shapes[key]:
            raise ValueError(f"weight {key}: shape {tuple(value.shape)}, model expects {shapes[key]}")
    model.load_state_dict({k: v.float().contiguous() for k, v in state.items()}, assign=True)
    if cfg.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    model.setup_cache(max_context)
    return model


def _resolve_max_context(cfg: ModelConfig, max_context: int | None) -> int:
    if max_context is None:
        return min(cfg.context_length, DEFAULT_MAX_CONTEXT)
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


def load_named(name: str, max_context: int | None) -> LoadedModel:
    cfg = NAMED_MODELS[name]
    model = build_model(cfg, random_state(cfg, zlib.crc32(name.encode())), _resolve_max_context(cfg, max_context))
    tok = Tokenizer(byte_level_tokenizer(), eos_id=2, bos_id=None, add_bos=False, chat_template=TINY_CHAT_TEMPLATE)
    return LoadedModel(model=model, tokenizer=tok, config=cfg, name=name, chat_template=TINY_CHAT_TEMPLATE)


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


def gguf_state(g: GGUFFile, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    state = {"tok_embeddings.weight": g.tensor("token_embd.weight"), "norm.weight": g.tensor("output_norm.weight")}
    if not cfg.tie_embeddings:
        state["output.weight"] = g.tensor("output.weight")
    for i in range(cfg.n_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        q = unpermute_rope(g.tensor(b + "attn_q.weight"), cfg.n_heads)
        k = unpermute_rope(g.tensor(b + "attn_k.weight"), cfg.n_kv_heads)
        state[p + "attention.wqkv.weight"] = torch.cat([q, k, g.tensor(b + "attn_v.weight")])
        state[p + "attention.wo.weight"] = g.tensor(b + "attn_output.weight")
        state[p + "feed_forward.w13.weight"] = torch.cat([g.tensor(b + "ffn_gate.weight"), g.tensor(b + "ffn_up.weight")])
        state[p + "feed_forward.w2.weight"] = g.tensor(b + "ffn_down.weight")
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


def _loaded(cfg, state, tok, meta, template, name, max_context) -> LoadedModel:
    model = build_model(cfg, state, _resolve_max_context(cfg, max_context))
    tokenizer = Tokenizer(tok, eos_id=meta["eos_id"], bos_id=meta.get("bos_id"), add_bos=meta.get("add_bos", False),
                          chat_template=template, stop_ids=meta.get("stop_ids", []))
    return LoadedModel(model=model, tokenizer=tokenizer, config=cfg, name=name, chat_template=template)


# --------------------------------------------------------------------------------------------------
# Converted format


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write the fast-loading form of a GGUF model into ``out_dir`` (created; must not hold a model)."""
    from safetensors.torch import save_file

    cfg, state, tok, meta, template, name = read_gguf(Path(gguf_path))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"))
    tok.save(str(out_dir / "tokenizer.json"))
    if template is not None:
        (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    doc = {"format": FORMAT, "name": name, "model": cfg.to_dict(), "tokenizer": meta,
           "source": {"file": Path(gguf_path).name}}
    (out_dir / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out_dir


def load_converted(path: Path, max_context: int | None) -> LoadedModel:
    from safetensors.torch import load_file

    doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path / 'config.json'}: format {doc.get('format')!r}, expected {FORMAT!r}")
    cfg = ModelConfig.from_dict(doc["model"])
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    template_file = path / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.exists() else None
    state = load_file(str(path / "model.safetensors"))
    return _loaded(cfg, state, tok, doc["tokenizer"], template, doc["name"], max_context)


def load(spec: str, max_context: int | None = None) -> LoadedModel:
    """Load a model: a name in NAMED_MODELS, a converted directory, or a GGUF file."""
    if spec in NAMED_MODELS:
        return load_named(spec, max_context)
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model directory {spec} has no config.json (make one with `python -m engine convert`)")
        return load_converted(path, max_context)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"model file {spec} is not a GGUF file (magic {magic!r})")
        return _loaded(*read_gguf(path), max_context)
    raise ValueError(f"model {spec!r} is neither a named model ({', '.join(NAMED_MODELS)}), "
                     "a converted directory nor a GGUF file")
