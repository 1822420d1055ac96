"""Model units: the KV cache contract, cached vs. full forward, sampling, and the decoder against
Hugging Face's LlamaForCausalLM holding the same (tiny, random) weights."""

from __future__ import annotations

import pytest
import torch

import engine
from engine import generate
from engine.model import KVCache, ModelConfig


@pytest.fixture(scope="module")
def tiny():
    return engine.load("tiny", max_context=128, linear="fp32")  # the exact reference


PROMPT = [5, 80, 120, 33, 200, 17, 64, 64, 9, 250, 3, 101, 77, 140, 12, 58]


def test_kv_cache_update_contract():
    cache = KVCache(max_context=8, n_kv_heads=2, head_dim=4, n_slots=3)
    k = torch.randn(1, 2, 3, 4)  # (B, H_kv, T, D)
    v = torch.randn(1, 2, 3, 4)
    k_all, v_all = cache.update(torch.tensor([1]), torch.arange(2, 5)[None], k, v)
    assert k_all.shape == (3, 2, 8, 4) and v_all.shape == (3, 2, 8, 4)  # every slot, indexed by slot
    assert torch.equal(k_all[1, :, 2:5], k[0]) and torch.equal(v_all[1, :, 2:5], v[0])
    assert cache.nbytes() == 3 * 2 * 8 * 2 * 4 * 4
    # one token of each of two sequences, at their own positions, in their own slots
    k2, v2 = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    before = cache.k[1].clone()
    cache.update(torch.tensor([2, 0]), torch.tensor([[6], [0]]), k2, v2)
    assert torch.equal(cache.k[2, :, 6], k2[0, :, 0]) and torch.equal(cache.v[0, :, 0], v2[1, :, 0])
    # a slot that is not named is never touched: compared as bits, because the cache is
    # uninitialized on purpose and its unwritten positions may hold NaN, which equals nothing
    assert torch.equal(cache.k[1].view(torch.int32), before.view(torch.int32))
    with pytest.raises(AssertionError, match="expected"):
        cache.update(torch.tensor([0]), torch.arange(0, 3)[None], torch.randn(1, 3, 3, 4), torch.randn(1, 3, 3, 4))
    with pytest.raises(AssertionError, match="max_context"):
        cache.update(torch.tensor([0]), torch.arange(7, 10)[None], k, v)
    with pytest.raises(AssertionError, match="not distinct"):
        cache.update(torch.tensor([1, 1]), torch.tensor([[3], [4]]), k2, v2)
    with pytest.raises(AssertionError, match="expected"):  # a slot per sequence
        cache.update(torch.tensor([0, 1, 2]), torch.tensor([[3], [4]]), k2, v2)


def test_config_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(vocab_size=10, dim=64, n_layers=1, n_heads=4, n_kv_heads=3, hidden_dim=8)
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict({"vocab_size": 10, "bogus": 1})


def test_incremental_decode_matches_full_forward(tiny):
    full = generate.forward_logits(tiny, PROMPT)  # (T, V)
    assert full.shape == (len(PROMPT), tiny.config.vocab_size) and full.dtype == torch.float32
    first = generate.prefill(tiny.model, PROMPT[:6], 0)
    torch.testing.assert_close(first, full[5], rtol=1e-4, atol=1e-4)
    for pos in range(6, len(PROMPT)):
        step = generate.decode_one(tiny.model, PROMPT[pos], pos)
        torch.testing.assert_close(step, full[pos], rtol=1e-4, atol=1e-4)


def test_prefill_after_a_cached_prefix_uses_the_offset_causal_mask(tiny):
    full = generate.forward_logits(tiny, PROMPT)
    generate.prefill(tiny.model, PROMPT[:9], 0)
    # Several new tokens after 9 cached ones: wrong masking would let them see the future.
    with torch.inference_mode():
        tail = tiny.model(torch.tensor([PROMPT[9:]]), 9, all_logits=True)
    torch.testing.assert_close(tail, full[9:], rtol=1e-4, atol=1e-4)


def test_tied_model_shares_the_embedding():
    tied = engine.load("tiny-tied", max_context=32, linear="fp32")
    assert tied.model.output.weight is tied.model.tok_embeddings.weight
    untied = engine.load("tiny", max_context=32, linear="fp32")
    assert untied.model.output.weight is not untied.model.tok_embeddings.weight
    half = engine.load("tiny-tied", max_context=32, linear="fp16")  # one fp16 table serves both
    assert half.model.output.prepared is half.model.tok_embeddings.prepared


def test_named_weights_are_deterministic():
    a, b = engine.load("tiny", max_context=16, linear="fp32"), engine.load("tiny", max_context=16, linear="fp32")
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_sample():
    logits = torch.tensor([0.1, 3.0, 0.2, 2.9])
    assert generate.sample(logits, 0.0) == 1
    draws = [generate.sample(logits, 1.0, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert draws[0] == draws[1]
    many = {generate.sample(logits, 1.0, g) for g in [torch.Generator().manual_seed(i) for i in range(40)]}
    assert many == {0, 1, 2, 3} or many >= {1, 3}


def test_generation_stops_at_stop_ids_unless_ignore_eos(tiny):
    out = generate.greedy(tiny, PROMPT, 20)
    assert len(out) == 20
    k = next(i for i, t in enumerate(out) if i > 0 and t not in out[:i])
    stop = frozenset([out[k]])
    assert list(generate.generate(tiny.model, PROMPT, 20, stop_ids=stop)) == out[:k]
    assert list(generate.generate(tiny.model, PROMPT, 20, stop_ids=stop, ignore_eos=True)) == out
    assert generate.token_limit(prompt_len=126, max_tokens=20, max_context=128) == 3


def test_fp16_linear_stays_close_to_fp32(tiny):
    half = engine.load("tiny", max_context=128, linear="fp16")
    want = generate.forward_logits(tiny, PROMPT)
    many_rows = generate.forward_logits(half, PROMPT)  # fp32 GEMM over widened weights
    one_row = torch.stack([generate.prefill(half.model, PROMPT[:1], 0)] +  # fp16 matrix-vector path
                          [generate.decode_one(half.model, PROMPT[i], i) for i in range(1, len(PROMPT))])
    for got in (many_rows, one_row):
        assert (got - want).abs().max() / want.abs().max() < 1e-2
    assert generate.greedy(half, PROMPT, 8) == generate.greedy(tiny, PROMPT, 8)
    with pytest.raises(ValueError, match="linear"):
        engine.load("tiny", linear="int3")


def to_hf_state(loaded) -> dict[str, torch.Tensor]:
    cfg = loaded.config
    sd = loaded.model.state_dict()
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    hf = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"],
          "lm_head.weight": sd["output.weight"]}
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = sd[p + "attention.wqkv.weight"].split([q_out, kv_out, kv_out])
        gate, up = sd[p + "feed_forward.w13.weight"].split(cfg.hidden_dim)
        hf.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                   h + "self_attn.v_proj.weight": v, h + "self_attn.o_proj.weight": sd[p + "attention.wo.weight"],
                   h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                   h + "mlp.down_proj.weight": sd[p + "feed_forward.w2.weight"],
                   h + "input_layernorm.weight": sd[p + "attention_norm.weight"],
                   h + "post_attention_layernorm.weight": sd[p + "ffn_norm.weight"]})
    return hf


@pytest.mark.slow
def test_decoder_matches_transformers_llama(tiny):
    transformers = pytest.importorskip("transformers")
    cfg = tiny.config
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, max_position_embeddings=cfg.context_length,
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state(tiny), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].float()
    got = generate.forward_logits(tiny, PROMPT)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_prefill_in_chunks_matches_one_pass(tiny, monkeypatch):
    whole = generate.forward_logits(tiny, PROMPT)[-1]
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 5)  # 16 tokens: passes of 5, 5, 5, 1
    torch.testing.assert_close(generate.prefill(tiny.model, PROMPT, 0), whole, rtol=1e-4, atol=1e-4)
    step = generate.decode_one(tiny.model, 7, len(PROMPT))  # the cache holds all 16 positions
    torch.testing.assert_close(step, generate.forward_logits(tiny, PROMPT + [7])[-1], rtol=1e-4, atol=1e-4)
