"""Correctness of the engine on the real SmolLM2-135M GGUF against an independent implementation.

The reference is Hugging Face transformers' ``LlamaForCausalLM`` loading the same GGUF file itself
(its own GGUF reader and dequantizer, float32, offline). Both see the same prompt token ids (the
engine's chat template and tokenizer; the tokenizer is not what is under test here), and we assert:

* full-sequence logits agree: max |ours - hf| <= ``ABS_BOUND`` and that difference relative to the
  largest |logit| <= ``REL_BOUND``. Both sides are fp32 over identical dequantized weights, so the
  only differences are summation order (MKL blocking, SDPA vs eager attention): measured here
  ~1e-4 absolute on logits of magnitude ~30, so the bounds leave a 10-50x margin while still
  catching any real mistake (a wrong RoPE layout, norm epsilon or GQA mapping moves logits by >0.1);
* greedy decoding agrees for at least the first ``GREEDY_MATCH`` tokens;
* the same holds with the optional fp16 decode kernels (``engine.kernels``), with a looser logit bound
  (``KERNEL_REL_BOUND``) since weights and matrix-vector inputs are rounded to fp16.

Runtime is dominated by transformers' GGUF load (pure-Python metadata parsing, ~40 s on a quiet
2-core machine); ``gguf.get_tensor_name_map`` is memoized during that load because transformers
rebuilds the same name map for every submodule.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os

import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.slow]

ABS_BOUND = 5e-3
REL_BOUND = 2e-4
KERNEL_REL_BOUND = 1e-2
GREEDY_MATCH = 32
NEW_TOKENS = 40

MESSAGES = [{
    "role": "user",
    "content": ("Complete this Python function. Reply with code only.\n\n"
                "def is_prime(n: int) -> bool:\n"
                "    \"\"\"Return True if n is a prime number, else False.\"\"\"\n"),
}]


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    import engine

    return engine.load(str(smollm2_gguf), max_context=512)


@pytest.fixture(scope="module")
def prompt_ids(ours) -> list[int]:
    ids = ours.tokenizer.encode_chat(MESSAGES)
    assert 30 < len(ids) < 200, f"unexpected prompt length {len(ids)}"
    return ids


@pytest.fixture(scope="module")
def hf(smollm2_gguf):
    os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: local_files_only already forbids the hub
    import gguf
    from transformers import AutoModelForCausalLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(
            str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32,
            local_files_only=True, attn_implementation="sdpa")
    model.eval()
    return model


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()  # (T, vocab)


def _hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _compare(ours_logits: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    assert ours_logits.shape == ref.shape, f"logits shape {tuple(ours_logits.shape)} vs hf {tuple(ref.shape)}"
    assert torch.isfinite(ours_logits).all(), "engine produced non-finite logits"
    diff = float((ours_logits - ref).abs().max())
    return diff, diff / float(ref.abs().max())


def _first_mismatch(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_config_matches_hf(ours, hf):
    c, h = ours.config, hf.config
    assert (c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim) == (
        h.vocab_size, h.hidden_size, h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads,
        h.intermediate_size)
    assert c.norm_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)


def test_logits_match_hf(ours, hf, prompt_ids):
    from engine.generate import forward_logits

    ref = _hf_logits(hf, prompt_ids)
    got = forward_logits(ours, prompt_ids)
    abs_diff, rel_diff = _compare(got, ref)
    print(f"logits over {len(prompt_ids)} positions: max abs diff {abs_diff:.3g}, relative {rel_diff:.3g}")
    assert abs_diff <= ABS_BOUND, f"max |logit diff| {abs_diff:.3g} > {ABS_BOUND}"
    assert rel_diff <= REL_BOUND, f"relative logit diff {rel_diff:.3g} > {REL_BOUND}"
    # The next-token choice must agree at every prompt position, not just numerically close.
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_greedy_matches_hf(ours, hf, prompt_ids):
    from engine.generate import greedy

    ref = _hf_greedy(hf, prompt_ids, NEW_TOKENS)
    got = greedy(ours, prompt_ids, NEW_TOKENS, ignore_eos=True)
    n = _first_mismatch(got, ref)
    assert n >= GREEDY_MATCH, (
        f"greedy tokens diverge at {n} (< {GREEDY_MATCH}):\n ours {got}\n hf   {ref}\n"
        f" ours text {ours.tokenizer.decode(got)!r}\n hf text   {ours.tokenizer.decode(ref)!r}")


def test_fp16_kernels_match_hf(ours, hf, prompt_ids):
    """The optional engine.kernels path (fp16 weights) on a copy of the model stays faithful."""
    from engine import kernels
    from engine.generate import forward_logits, greedy

    fast = dataclasses.replace(ours, model=copy.deepcopy(ours.model))
    assert kernels.quantize_(fast.model) == 4 * ours.config.n_layers + 1  # qkv, o, gate-up, down; lm_head
    ref = _hf_logits(hf, prompt_ids)
    # Decode (the fp16 matrix-vector path) is what the kernels change; the prefill widens to fp32.
    got = greedy(fast, prompt_ids, NEW_TOKENS, ignore_eos=True)
    ref_tokens = _hf_greedy(hf, prompt_ids, NEW_TOKENS)
    n = _first_mismatch(got, ref_tokens)
    assert n >= GREEDY_MATCH, f"fp16 kernels: greedy diverges at {n}:\n ours {got}\n hf   {ref_tokens}"
    # Logits of single-token steps go through the fp16 GEMV: compare the last prompt position.
    fast.model.setup_cache(fast.model.max_context)
    forward_logits(fast, prompt_ids[:-1])
    with torch.inference_mode():
        last = fast.model(torch.tensor([prompt_ids[-1:]]), len(prompt_ids) - 1)
    abs_diff, rel_diff = _compare(last, ref[-1])
    print(f"fp16 kernels, one decode step: max abs diff {abs_diff:.3g}, relative {rel_diff:.3g}")
    assert rel_diff <= KERNEL_REL_BOUND, f"fp16 kernels: relative logit diff {rel_diff:.3g} > {KERNEL_REL_BOUND}"
