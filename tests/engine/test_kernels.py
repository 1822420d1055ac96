"""engine.kernels: the optional fp16 decode kernels agree with fp32 F.linear and swap in cleanly."""

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from engine.model import Linear

# fp16 rounds weight and (one-row path) input to 11 significant bits: 2**-11 ~ 4.9e-4 relative per
# operand; measured 4-5e-4 of max |y| on SmolLM2 shapes, so 2e-3 fails only on a real defect.
REL_BOUND = 2e-3


@pytest.mark.parametrize("rows", [1, 2, 3, 64])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536)])
def test_linear_close_to_fp32(shape, rows):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g) * 0.05
    x = torch.randn(2, rows, shape[1], generator=g)  # leading batch dims are kept
    ref = F.linear(x, w)
    got = kernels.linear(x, kernels.prepare(w))
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert float((got - ref).abs().max()) <= REL_BOUND * float(ref.abs().max())


def test_error_report_within_bound():
    for r in kernels.error_report():
        assert r["rel_to_max"] <= REL_BOUND, r


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
