"""GGUF loading: block dequantization checked by hand, llama.cpp's q/k permutation undone, a GGUF
written from the tiny model's weights loads back to the same logits, and ``convert`` round-trips.
The SmolLM2 checks use the real file through the ``smollm2_gguf`` fixture."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

import engine
from engine import generate, weights

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def block_bytes(*parts) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(1, -1)


def test_dequantize_q8_0_block_by_hand():
    d = np.float16(0.0625)
    qs = np.arange(-16, 16, dtype=np.int8)
    got = weights.dequantize(block_bytes(d.tobytes(), qs.tobytes()), Q.Q8_0, (1, 32))
    want = [float(d) * q for q in range(-16, 16)]
    assert got.dtype == torch.float32 and got.tolist() == [want]


def test_dequantize_q4_0_block_by_hand():
    d = np.float16(0.5)
    qs = bytes((j | ((15 - j) << 4)) for j in range(16))  # low nibble j, high nibble 15 - j
    got = weights.dequantize(block_bytes(d.tobytes(), qs), Q.Q4_0, (1, 32))
    want = [(j - 8) * 0.5 for j in range(16)] + [(15 - j - 8) * 0.5 for j in range(16)]
    assert got.tolist() == [want]


def test_dequantize_q4_1_block_by_hand():
    d, m = np.float16(0.25), np.float16(-1.5)
    qs = bytes(((j * 7) % 16 | (j << 4)) for j in range(16))
    got = weights.dequantize(block_bytes(d.tobytes(), m.tobytes(), qs), Q.Q4_1, (1, 32))
    want = [((j * 7) % 16) * 0.25 - 1.5 for j in range(16)] + [j * 0.25 - 1.5 for j in range(16)]
    assert got.tolist() == [want]


def test_dequantize_f16_and_f32():
    x = np.array([[1.5, -2.25, 3.0]], dtype=np.float16)
    assert weights.dequantize(x.view(np.uint8).reshape(1, -1), Q.F16, (1, 3)).tolist() == [[1.5, -2.25, 3.0]]
    y = np.array([[0.1, 0.2]], dtype=np.float32)
    assert torch.equal(weights.dequantize(y, Q.F32, (1, 2)), torch.from_numpy(y))


def test_unsupported_quant_type_names_the_tensor():
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight.*Q5_K"):
        weights.dequantize(np.zeros((1, 176), np.uint8), Q.Q5_K, (1, 256), "blk.0.attn_q.weight")


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py's ``permute`` of q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
    w = torch.randn(3 * 64, 20)
    p = llama_cpp_permute(w, 3)
    assert not torch.equal(p, w)
    assert torch.equal(weights.unpermute_rope(p, 3), w)


# --------------------------------------------------------------------------------------------------
# A GGUF written from the tiny model, the way llama.cpp's converter lays it out.


def write_tiny_gguf(path, qtype) -> engine.LoadedModel:
    tiny = engine.load("tiny", max_context=64, linear="fp32")
    cfg = tiny.config
    sd = tiny.model.state_dict()
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-gguf")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    vocab = tiny.tokenizer.tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in weights.TINY_SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(weights.TINY_CHAT_TEMPLATE)

    def put(name, t: torch.Tensor, quantize: bool = True):
        a = t.numpy().astype(np.float32)
        if quantize and qtype != Q.F32 and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    put("token_embd.weight", sd["tok_embeddings.weight"])
    put("output.weight", sd["output.weight"])
    put("output_norm.weight", sd["norm.weight"])
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        q, k, v = sd[p + "attention.wqkv.weight"].split([q_out, kv_out, kv_out])
        gate, up = sd[p + "feed_forward.w13.weight"].split(cfg.hidden_dim)
        put(b + "attn_q.weight", llama_cpp_permute(q, cfg.n_heads))
        put(b + "attn_k.weight", llama_cpp_permute(k, cfg.n_kv_heads))
        put(b + "attn_v.weight", v)
        put(b + "attn_output.weight", sd[p + "attention.wo.weight"])
        put(b + "ffn_gate.weight", gate)
        put(b + "ffn_up.weight", up)
        put(b + "ffn_down.weight", sd[p + "feed_forward.w2.weight"])
        put(b + "attn_norm.weight", sd[p + "attention_norm.weight"])
        put(b + "ffn_norm.weight", sd[p + "ffn_norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tiny


PROMPT = [40, 41, 42, 100, 7, 250, 3, 61, 62, 63, 99, 130]


@pytest.fixture(scope="module")
def tiny_f32_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    tiny = write_tiny_gguf(path, Q.F32)
    return path, tiny


def test_gguf_f32_loads_to_the_same_model(tiny_f32_gguf):
    path, tiny = tiny_f32_gguf
    loaded = engine.load(str(path), max_context=64, linear="fp32")
    # GGUF stores the epsilon as float32
    assert loaded.config.norm_eps == pytest.approx(tiny.config.norm_eps, rel=1e-6)
    assert dataclasses.replace(loaded.config, norm_eps=tiny.config.norm_eps) == tiny.config
    assert loaded.name == "tiny-f32"
    torch.testing.assert_close(generate.forward_logits(loaded, PROMPT), generate.forward_logits(tiny, PROMPT),
                               rtol=1e-5, atol=1e-5)
    text = "héllo <|im_start|>user"
    assert loaded.tokenizer.encode(text) == tiny.tokenizer.encode(text)
    assert loaded.tokenizer.stop_ids == {2}
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == \
        tiny.tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantized_gguf_loads_the_quantized_values(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype.name}.gguf"
    tiny = write_tiny_gguf(path, qtype)
    loaded = engine.load(str(path), max_context=64, linear="fp32")  # dequantized once, to compare values
    ours = loaded.model.state_dict()
    for key, orig in tiny.model.state_dict().items():
        if orig.dim() == 2:  # blocks run along rows, so the q/k row permutation commutes with them
            want = gguf.quants.dequantize(gguf.quants.quantize(orig.numpy(), qtype), qtype)
            assert torch.equal(ours[key], torch.from_numpy(want)), key
    if qtype == Q.Q8_0:  # 8-bit rounding noise through the random network stays small
        want, got = generate.forward_logits(tiny, PROMPT), generate.forward_logits(loaded, PROMPT)
        assert (got - want).abs().max() / want.std() < 0.1


def test_convert_round_trip_and_serve(tiny_f32_gguf, tmp_path, repo_root):
    from tests.engine._server import ServerProcess

    path, tiny = tiny_f32_gguf
    out = tmp_path / "converted"
    subprocess.run([sys.executable, "-m", "engine", "convert", str(path), str(out)], cwd=repo_root, check=True)
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json",
                                               "chat_template.jinja"}
    conv = engine.load(str(out), max_context=64, linear="fp32")
    assert conv.config == engine.load(str(path)).config and conv.chat_template == weights.TINY_CHAT_TEMPLATE
    assert torch.equal(generate.forward_logits(conv, PROMPT), generate.forward_logits(tiny, PROMPT))
    expected = generate.greedy(engine.load(str(out), max_context=64), PROMPT, 6)  # the server's default format
    srv = ServerProcess(repo_root, str(out), ["--max-context", "64"])
    try:
        r = srv.client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                     "ignore_eos": True, "return_tokens": True})
        assert r.json()["choices"][0]["tokens"] == expected and r.json()["model"] == "tiny-f32"
    finally:
        srv.stop()


def test_load_rejects_what_is_not_a_model(tmp_path):
    bogus = tmp_path / "model.bin"
    bogus.write_bytes(b"NOPE" + b"\0" * 16)
    with pytest.raises(ValueError, match="not a GGUF"):
        engine.load(str(bogus))
    with pytest.raises(ValueError, match="config.json"):
        engine.load(str(tmp_path))
    with pytest.raises(ValueError, match="neither a named model"):
        engine.load("no-such-model")
    with pytest.raises(ValueError, match="context_length"):
        engine.load("tiny", max_context=10**6)


# --------------------------------------------------------------------------------------------------
# The real SmolLM2 file.


@pytest.mark.model
def test_smollm2_metadata_and_tokenizer(smollm2_gguf):
    g = weights.GGUFFile(smollm2_gguf)
    cfg = weights.gguf_config(g)
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim) == (30, 576, 9, 3, 1536)
    assert cfg.tie_embeddings and cfg.rope_theta == 100000.0
    tok, meta = weights.gguf_tokenizer(g)
    t = engine.tokenizer.Tokenizer(tok, eos_id=meta["eos_id"], chat_template=g.get("tokenizer.chat_template"))
    assert t.encode("<|im_start|>") == [1] and t.encode("<|im_end|>") == [2] and t.eos_id == 2
    assert len(t.encode("12345")) == 5  # SmolLM2 splits digits one by one
    for text in ["Hello world!", "def add(a, b):\n    return a + b\n", "naïve café – ünïcödé 🙂"]:
        assert t.decode(t.encode(text)) == text
    rendered = t.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert rendered.startswith("<|im_start|>system\n")


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_writes_the_add_function(smollm2_gguf):
    loaded = engine.load(str(smollm2_gguf), max_context=256)
    ids = loaded.tokenizer.encode_chat(
        [{"role": "user", "content": "Write a Python function add(a, b) that returns the sum of a and b."}])
    out = loaded.tokenizer.decode(generate.greedy(loaded, ids, 24, ignore_eos=False))
    assert "def add(a, b):" in out and "return a + b" in out
