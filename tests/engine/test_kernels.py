"""engine.kernels and engine.native: every kernel against F.linear / SDPA, the block formats against
gguf-py's own (independent) quantizer and dequantizer, and the fallback without the native library.

Bounds, per weight format, relative to the output's largest magnitude (max |y|):
* fp16: weights and one-row inputs rounded to 11 bits: measured 4-5e-4; bound 2e-3.
* q4_1 / q8_0 against fp32 F.linear over the same dequantized weights: the only difference is the
  kernels' two-digit int8 rounding of the activation per 32-block (~2**-15 of its largest value);
  bound 2e-3. Against ``linear_ref`` (the same arithmetic in float64) it is summation order only:
  bound 1e-5.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import kernels, native
from engine.model import Linear

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

REL_BOUND = 2e-3
BLOCK_REL_BOUND = 2e-3
EXACT_REL_BOUND = 1e-5
GGUF_TYPES = {"q4_1": Q.Q4_1, "q8_0": Q.Q8_0}

needs_native = pytest.mark.usefixtures("native_kernels")  # a skip locally, a failure under CI


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max()) / float(ref.abs().max())


# ------------------------------------------------------------------------------------------- fp16


@pytest.mark.parametrize("rows", [1, 2, 3, 64])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536)])
def test_fp16_linear_close_to_fp32(shape, rows):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g) * 0.05
    x = torch.randn(2, rows, shape[1], generator=g)  # leading batch dims are kept
    ref = F.linear(x, w)
    got = kernels.linear(x, kernels.prepare(w))
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert rel_err(got, ref) <= REL_BOUND


def test_error_report_within_bound():
    for r in kernels.error_report():
        assert r["rel_to_max"] <= (REL_BOUND if r["format"] == "fp16" else BLOCK_REL_BOUND), r


def test_prepare_rejects_bad_weights():
    with pytest.raises(ValueError, match="2-D float"):
        kernels.prepare(torch.ones(4))
    with pytest.raises(ValueError, match="fp16 range"):
        kernels.prepare(torch.full((2, 2), 1e6))


def test_quantize_swaps_engine_linears_and_keeps_outputs():
    torch.manual_seed(0)
    net = torch.nn.Sequential(Linear(8, 16), torch.nn.Linear(16, 4, bias=False), torch.nn.Linear(4, 4))
    for m in net:
        torch.nn.init.normal_(m.weight, std=0.2)
    x = torch.randn(1, 8)
    with torch.inference_mode():
        ref = net(x)
    assert kernels.quantize_(net) == 2  # the biased nn.Linear is left alone
    assert isinstance(net[0], kernels.HalfLinear) and isinstance(net[1], kernels.HalfLinear)
    assert isinstance(net[2], torch.nn.Linear)
    with torch.inference_mode():
        got = net(x)
    assert torch.allclose(got, ref, rtol=0, atol=REL_BOUND * float(ref.abs().max()) * 4)


def test_decode_threads_context_restores_count():
    from engine.generate import intra_op_threads

    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="n must be >= 1"):
        with intra_op_threads(0):
            pass


# ---------------------------------------------------------------------------- GGUF block formats


def random_weight(n: int, k: int, seed: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[0, :32] = 0.0  # an all-zero block (d = 0) must not divide by zero
    return w


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_quantizers_match_gguf_py_byte_for_byte(fmt):
    w = random_weight(64, 128, 2)
    ours = kernels.quantize_q4_1(w) if fmt == "q4_1" else kernels.quantize_q8_0(w)
    theirs = torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w.numpy(), GGUF_TYPES[fmt])))
    assert ours.shape == (64, 128 // 32 * kernels.block_bytes(fmt)) and torch.equal(ours, theirs)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_split_rows_round_trip(fmt):
    blocks = kernels.quantize_q4_1(random_weight(7, 96, 10)) if fmt == "q4_1" else kernels.quantize_q8_0(
        random_weight(7, 96, 10))
    split = kernels.split_rows(fmt, blocks)
    assert split.shape == blocks.shape and not torch.equal(split, blocks)
    assert torch.equal(kernels.join_rows(fmt, split), blocks)
    assert sorted(split[3].tolist()) == sorted(blocks[3].tolist())  # the same bytes of each row


@needs_native
def test_activation_quantization_matches_the_reference():
    x = torch.randn(96, generator=torch.Generator().manual_seed(11)) * 3
    x[:32] = 0.0
    d, s, q, r, x16 = native.quantize_row(x)
    d_ref, q_ref, r_ref = kernels.quantize_activation_ref(x)
    assert torch.equal(d, d_ref) and torch.equal(q.float().reshape(3, 32), q_ref)
    assert torch.equal(r.float().reshape(3, 32), r_ref)
    assert torch.equal(x16.int(), 254 * q.int() + r.int())  # the one 15-bit integer the products use
    torch.testing.assert_close(s, x.reshape(3, 32).sum(-1))
    # the two digits carry the value to 1/508 of a step of the first
    back = d[:, None] * (q.float().reshape(3, 32) + r.float().reshape(3, 32) / 254)
    assert float((back - x.reshape(3, 32)).abs().max()) <= float(d.max()) / 508 * 1.01


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_dequantize_ref_matches_gguf_py(fmt):
    blocks = kernels.quantize_q4_1(random_weight(48, 96, 3)) if fmt == "q4_1" else kernels.quantize_q8_0(
        random_weight(48, 96, 3))
    theirs = gguf.quants.dequantize(blocks.numpy(), GGUF_TYPES[fmt])
    assert torch.equal(kernels.dequantize_ref(fmt, blocks, 96), torch.from_numpy(theirs))


def test_q4_1_block_layout_by_hand():
    """One block: d = 0.25, m = -1.5, element j in the low nibble of byte j, j + 16 in its high one."""
    d, m = np.float16(0.25), np.float16(-1.5)
    qs = bytes(((j * 7) % 16 | (j << 4)) for j in range(16))
    blocks = torch.from_numpy(np.frombuffer(d.tobytes() + m.tobytes() + qs, dtype=np.uint8).reshape(1, 20).copy())
    want = [((j * 7) % 16) * 0.25 - 1.5 for j in range(16)] + [j * 0.25 - 1.5 for j in range(16)]
    assert kernels.dequantize_ref("q4_1", blocks, 32).tolist() == [want]
    split = kernels.split_rows("q4_1", blocks)
    assert split[0, :16].tolist() == list(qs) and split[0, 16:18].tolist() == list(d.tobytes())
    assert torch.equal(kernels.join_rows("q4_1", split), blocks)
    if native.available():
        assert native.dequantize("q4_1", split, 32).tolist() == [want]
        x = torch.zeros(1, 32)
        x[0, 3], x[0, 20] = 127.0, -64.0  # the activation's int8 scale is exactly 1
        assert native.linear(x, "q4_1", split, 1).item() == 127.0 * want[3] - 64.0 * want[20] == 0.25


@needs_native
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (5, 64)])
def test_block_linear_against_f_linear(fmt, rows, shape):
    n, k = shape
    blocks = kernels.quantize_q4_1(random_weight(n, k, 4)) if fmt == "q4_1" else kernels.quantize_q8_0(
        random_weight(n, k, 4))
    mod = kernels.QuantLinear(fmt, blocks, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5))
    got = mod(x)
    ref = F.linear(x, kernels.dequantize_ref(fmt, blocks, k))
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert rel_err(got, ref) <= BLOCK_REL_BOUND
    if rows <= kernels.QUANT_MAX_ROWS:  # the integer kernel is exactly the defined arithmetic
        assert rel_err(got, kernels.linear_ref(fmt, blocks, x)) <= EXACT_REL_BOUND
    else:  # many rows: dequantize + sgemm, i.e. F.linear itself
        assert rel_err(got, ref) <= EXACT_REL_BOUND


@needs_native
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_native_dequantize_and_embedding_rows(fmt):
    w = random_weight(40, 64, 6)
    blocks = kernels.quantize_q4_1(w) if fmt == "q4_1" else kernels.quantize_q8_0(w)
    full = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), GGUF_TYPES[fmt]))
    assert torch.equal(native.dequantize(fmt, kernels.split_rows(fmt, blocks), 64), full)
    emb = kernels.QuantEmbedding(fmt, blocks, 64)
    tokens = torch.tensor([[3, 39, 0, 3]])
    assert torch.equal(emb(tokens), full[tokens])


@needs_native
@pytest.mark.parametrize("H, Hkv, D, S", [(9, 3, 64, 1), (9, 3, 64, 300), (4, 2, 16, 33), (8, 8, 128, 513),
                                          (9, 3, 64, 2048), (16, 4, 24, 77), (12, 2, 64, 100),
                                          (9, 3, 64, 7), (9, 3, 64, 258)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_attention_decode_against_sdpa(H, Hkv, D, S, dtype):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, H, 1, D, generator=g)
    # Views of a longer cache, as the KV cache hands them out (the position stride is not S * D).
    k = (torch.randn(1, Hkv, S + 5, D, generator=g) * 2).to(dtype)[:, :, :S]
    v = torch.randn(1, Hkv, S + 5, D, generator=g).to(dtype)[:, :, :S]
    ref = F.scaled_dot_product_attention(q, k.float(), v.float(), enable_gqa=True).reshape(1, 1, H * D)
    got = native.attention_decode(q, k, v)
    assert got.shape == (1, 1, H * D)
    assert float((got - ref).abs().max()) <= 1e-5


@needs_native
def test_two_threads_give_identical_results():
    blocks = kernels.split_rows("q4_1", kernels.quantize_q4_1(random_weight(3072, 576, 8)))
    x = torch.randn(1, 576)
    q = torch.randn(1, 9, 1, 64)
    k, v = torch.randn(1, 3, 1000, 64).half(), torch.randn(1, 3, 1000, 64).half()
    before = native.threads()
    try:
        native.set_threads(1)
        one = native.linear(x, "q4_1", blocks, 3072), native.attention_decode(q, k, v)
        native.set_threads(2)
        two = [(native.linear(x, "q4_1", blocks, 3072), native.attention_decode(q, k, v)) for _ in range(20)]
    finally:
        native.set_threads(before)
    for y, a in two:  # rows and attention blocks are split between threads, never summed across them
        assert torch.equal(y, one[0]) and torch.equal(a, one[1])


@needs_native
def test_fused_decode_block_matches_the_module_path(tmp_path):
    """tiny's blocks (GQA 4/2, head 16) with q4_1 weights: the fused native decode step gives the
    module path's output, and both write the same KV."""
    import engine
    from engine import generate

    loaded = engine.load("tiny", max_context=64, linear="fp32")
    cfg = loaded.config
    state = {k: v for k, v in loaded.model.state_dict().items()}
    from engine.weights import Blocks, build_model

    for key in list(state):
        if key.endswith(("wqkv.weight", "wo.weight", "w13.weight", "w2.weight")):
            w = state[key]
            state[key] = Blocks("q4_1", kernels.quantize_q4_1(w), tuple(w.shape))
    fused, kind, kv = build_model(cfg, state, 64, linear="auto")
    plain, _, _ = build_model(cfg, state, 64, linear="auto")
    for layer in plain.layers:
        layer.fused_decode = None
    assert kind == "gguf" and kv == "f16" and all(layer.fused_decode is not None for layer in fused.layers)
    prompt = [5, 80, 120, 33, 200, 17]
    for m in (fused, plain):
        generate.prefill(m, prompt, 0)
    # One block: the same arithmetic; only summation order differs, which can move one activation's
    # second int8 digit by one (2**-15 of its block's largest value): measured 2e-5.
    x = torch.randn(1, 1, cfg.dim, generator=torch.Generator().manual_seed(9))
    cos, sin, pos = fused.rope_cos[6:7], fused.rope_sin[6:7], torch.arange(6, 7)
    from engine.model import Step

    step = Step(slots=torch.tensor([0]), positions=pos[None], lengths=torch.tensor([7]), cos=cos[None],
                sin=sin[None], mask=None)
    with torch.inference_mode():
        one_fused = fused.layers[0](x.clone(), step)
        one_plain = plain.layers[0](x.clone(), step)
    assert rel_err(one_fused, one_plain) <= 1e-4
    k_fused, k_plain = (m.layers[0].attention.kv_cache.k[:, :, 6].float() for m in (fused, plain))
    assert torch.equal(k_fused, k_plain)
    # The whole model: a last-bit difference can flip one int8 rounding of a later activation, which
    # the next layers carry on (measured 1.5e-3 of max |logit|).
    a, b = generate.decode_one(fused, 9, len(prompt)), generate.decode_one(plain, 9, len(prompt))
    assert rel_err(a, b) <= 1e-2


@needs_native
@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_the_one_call_decode_step_gives_the_per_block_bits(tiny_q4_gguf, kv):
    """Transformer.fused_step (every block in one native call, the KV write done natively) against
    each block's FusedDecode around the Python KVCache.update: the same logits and the same cache,
    bit for bit, for sequences in their own slots at their own positions, and for one alone."""
    import engine

    one = engine.load(str(tiny_q4_gguf), max_context=64, kv=kv, slots=3)
    per_block = engine.load(str(tiny_q4_gguf), max_context=64, kv=kv, slots=3, fast_paths_off=["native_kv"])
    assert one.model.fused_step is not None and per_block.model.fused_step is None
    assert one.fast_paths["native_kv"]["on"] and not per_block.fast_paths["native_kv"]["on"]
    assert all(layer.fused_decode is not None for layer in per_block.model.layers)
    prompts = {0: [5, 80, 120], 2: [7, 9, 11, 13, 200], 1: [42]}
    steps = [(torch.tensor([3, 99, 17]), torch.tensor([3, 5, 1]), torch.tensor([0, 2, 1])),
             (torch.tensor([8]), torch.tensor([6]), torch.tensor([2])),  # one sequence alone
             (torch.tensor([250, 4]), torch.tensor([2, 4]), torch.tensor([1, 0]))]
    with torch.inference_mode():
        for m in (one, per_block):
            for slot, p in prompts.items():
                m.model(torch.tensor([p]), 0, slot=slot)
        for tokens, positions, slots in steps:
            assert torch.equal(one.model.decode(tokens, positions, slots), per_block.model.decode(tokens, positions, slots))
    written = {0: 5, 1: 3, 2: 7}  # positions each slot holds now
    for a, b in zip(one.model.layers, per_block.model.layers):
        ca, cb = a.attention.kv_cache, b.attention.kv_cache
        for slot, n in written.items():
            assert torch.equal(ca.k[slot, :, :n], cb.k[slot, :, :n]) and torch.equal(ca.v[slot, :, :n], cb.v[slot, :, :n])


# ---------------------------------------------------------------------------- batches and paths


def _block_matrix(fmt: str, n: int, k: int, seed: int) -> torch.Tensor:
    w = random_weight(n, k, seed)
    return kernels.split_rows(fmt, kernels.quantize_q4_1(w) if fmt == "q4_1" else kernels.quantize_q8_0(w))


@needs_native
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_a_batch_gives_each_row_exactly_its_result_alone(fmt):
    """A decode step multiplies all its sequences' rows in one pass over the weights; every block sum
    is an exact integer, so each row's result is bit-identical to its product alone, for every batch
    size and grouping of rows (passes of 1 to 8 rows)."""
    blocks = _block_matrix(fmt, 200, 576, 12)  # 200 rows: chunks of 32 and a ragged one, groups of 4 and 1
    x = torch.randn(23, 576, generator=torch.Generator().manual_seed(13)) * 2
    alone = torch.cat([native.linear(x[i:i + 1], fmt, blocks, 200) for i in range(23)])
    for m in range(2, 24):  # every pass size, and 2 and 3 passes
        assert torch.equal(native.linear(x[:m], fmt, blocks, 200), alone[:m]), m
    assert torch.equal(native.linear(x.flip(0), fmt, blocks, 200), alone.flip(0))  # order within the batch


@needs_native
@pytest.mark.parametrize("isa", ["avxvnni", "avx512vnni"])
def test_every_instruction_set_path_gives_the_avx2_results_bit_for_bit(isa):
    if not native.isa_supported(isa):
        pytest.skip(f"CI cannot meet: this CPU lacks {isa} (python3 bench/kernel_check.py runs this check where it has it)")
    before = native.isa()
    try:
        for fmt in ("q4_1", "q8_0"):
            blocks = _block_matrix(fmt, 96, 1536, 14)
            x = torch.randn(11, 1536, generator=torch.Generator().manual_seed(15))
            assert native.set_isa("avx2")
            want = [native.linear(x[:m], fmt, blocks, 96) for m in (1, 4, 11)]
            assert native.set_isa(isa) and native.isa() == isa
            assert all(torch.equal(native.linear(x[:m], fmt, blocks, 96), w) for m, w in zip((1, 4, 11), want))
    finally:
        native.set_isa(before)


@needs_native
def test_isa_selection_and_forcing(repo_root):
    assert native.isa() in native.ISAS and native.isa_supported("avx2")
    before = native.isa()
    try:
        assert native.set_isa("avx2") and native.isa() == "avx2"
        assert not native.set_isa("sse9")
        assert native.set_isa(None) and native.isa() == before  # None: the best this CPU runs
    finally:
        native.set_isa(before)
    script = "from engine import native; print(native.isa())"
    env = dict(os.environ, PYTHONPATH=str(repo_root), PAIRBENCH_ENGINE_ISA="avx2")
    r = subprocess.run([sys.executable, "-c", script], cwd=repo_root, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "avx2", r.stderr
    missing = next((i for i in native.ISAS if not native.isa_supported(i)), None)
    if missing is not None:  # forcing a path this CPU lacks keeps a working one and says so
        r = subprocess.run([sys.executable, "-c", script], cwd=repo_root, capture_output=True, text=True,
                           env=dict(env, PAIRBENCH_ENGINE_ISA=missing))
        assert r.returncode == 0 and r.stdout.strip() == native.isa() and f"PAIRBENCH_ENGINE_ISA={missing}" in r.stderr


@needs_native
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_batched_attention_reads_each_sequence_slot(dtype):
    """One call for B sequences: each attends to its own slot up to its own length, bit-identical to
    attending alone, and as SDPA over that slot's prefix."""
    g = torch.Generator().manual_seed(16)
    N, Hkv, S, D, H = 5, 3, 700, 64, 9
    k = (torch.randn(N, Hkv, S, D, generator=g) * 2).to(dtype)
    v = torch.randn(N, Hkv, S, D, generator=g).to(dtype)
    q = torch.randn(4, H, 1, D, generator=g)
    slots, lengths = torch.tensor([3, 0, 4, 1]), torch.tensor([1, 700, 257, 33])
    got = native.attention_decode(q, k, v, slots, lengths)  # (B, 1, H*D)
    for b, (s, n) in enumerate(zip(slots.tolist(), lengths.tolist())):
        alone = native.attention_decode(q[b:b + 1], k[s:s + 1, :, :n], v[s:s + 1, :, :n])
        assert torch.equal(got[b], alone[0])
        ref = F.scaled_dot_product_attention(q[b:b + 1], k[s:s + 1, :, :n].float(), v[s:s + 1, :, :n].float(),
                                             enable_gqa=True).reshape(1, H * D)
        assert float((got[b] - ref).abs().max()) <= 1e-5


# ------------------------------------------------------------------------------------- fallbacks

FALLBACK = """
import engine, sys
m = engine.load(sys.argv[1], max_context=32)
from engine import generate
print(m.linear, m.kv_dtype, len(generate.greedy(m, [5, 6, 7], 3)))
"""


@pytest.mark.parametrize("env", [{"PAIRBENCH_ENGINE_NATIVE": "0"},
                                 {"CXX": "false", "PAIRBENCH_NATIVE_CACHE": "{tmp}"}])
def test_without_native_kernels_the_engine_warns_and_runs_fp16(repo_root, tmp_path, env):
    """No library (disabled, or a compiler that fails): one warning naming why, then the fp16 path."""
    env = {k: v.format(tmp=tmp_path / "cache") for k, v in env.items()}
    gguf_path = tmp_path / "tiny-q4_1.gguf"
    from tests.engine.test_gguf import write_tiny_gguf

    write_tiny_gguf(gguf_path, Q.Q4_1)
    r = subprocess.run([sys.executable, "-c", FALLBACK, str(gguf_path)], cwd=repo_root, capture_output=True,
                       text=True, env=dict(os.environ, **env, PYTHONPATH=str(repo_root)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fp16", "f32", "3"]
    assert r.stderr.count("native kernels unavailable") == 1
    assert ("PAIRBENCH_ENGINE_NATIVE=0" in r.stderr) if "PAIRBENCH_ENGINE_NATIVE" in env else ("failed" in r.stderr)
