"""The SLO (pairbench.core.slo): vLLM's goodput rule, TPOT, and the requests a percentile needs."""

import pytest

from pairbench.core.slo import SLO, min_requests, tpot_ms


def test_good_is_inclusive_on_every_bound_given():
    slo = SLO(ttft_ms=200, itl_ms=50, e2e_ms=1000)
    assert slo.good(ttft_ms=200, tpot_ms=50, e2e_ms=1000)          # on the bound: good (vLLM: slo >= value)
    assert not slo.good(ttft_ms=200.001, tpot_ms=10, e2e_ms=10)
    assert not slo.good(ttft_ms=10, tpot_ms=50.5, e2e_ms=10)
    assert not slo.good(ttft_ms=10, tpot_ms=10, e2e_ms=1000.5)
    assert SLO(ttft_ms=200).good(ttft_ms=150, tpot_ms=10_000, e2e_ms=10_000)  # unbounded keys are ignored
    assert not SLO(ttft_ms=200).good(ttft_ms=None, tpot_ms=None, e2e_ms=None)  # no first token: not good


def test_tpot_is_vllms():
    # (e2e - ttft) / (tokens - 1): 64 tokens, 100 ms to the first, 730 ms in all -> 10 ms per token
    assert tpot_ms(ttft_ms=100.0, e2e_ms=730.0, output_tokens=64) == pytest.approx(10.0)
    assert tpot_ms(ttft_ms=100.0, e2e_ms=130.0, output_tokens=1) == 0.0  # vLLM: tpot 0 at <= 1 token
    assert tpot_ms(ttft_ms=None, e2e_ms=130.0, output_tokens=4) is None


@pytest.mark.parametrize("percentiles,min_tail,need", [
    ((50,), 1, 2), ((90,), 1, 10), ((50, 99), 1, 100), ((99.9,), 1, 1000), ((99,), 2, 200), ((95,), 1, 20),
    ((0,), 1, 1),
])
def test_min_requests(percentiles, min_tail, need):
    assert min_requests(percentiles, min_tail) == need


@pytest.mark.parametrize("d,key", [
    ({"ttft_ms": -1}, "load.slo.ttft_ms"), ({"itl_ms": "fast"}, "load.slo.itl_ms"),
    ({"e2e_ms": 100, "attainment": 1.5}, "load.slo.attainment"), ({"attainment": 0.9}, "at least one bound"),
    ({"ttft_ms": 100, "tpot_ms": 5}, "unknown key.*tpot_ms"), ({"e2e_ms": True}, "load.slo.e2e_ms"),
])
def test_bad_slo_names_the_key(d, key):
    with pytest.raises(ValueError, match=key):
        SLO.from_dict(d)


def test_round_trip():
    slo = SLO.from_dict({"ttft_ms": 500, "itl_ms": 120, "attainment": 0.95})
    assert slo.to_dict() == {"ttft_ms": 500, "itl_ms": 120, "e2e_ms": None, "attainment": 0.95}
    assert SLO.from_dict(slo.to_dict()) == slo


def test_percentile_out_of_range_names_the_key():
    with pytest.raises(ValueError, match="load.percentiles"):
        min_requests((100,))
