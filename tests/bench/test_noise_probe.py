"""bench/noise.py's CPU-speed probe and its correlation with the decode rate (issue 25)."""

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SPEC = importlib.util.spec_from_file_location("bench_noise", Path(__file__).resolve().parents[2] / "bench" / "noise.py")
noise = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(noise)


def frame(decode_of_probe):
    """2 launches x 4 requests at one length; each launch at its own level, the probe's log rate x."""
    rows = []
    x = {1: [0.0, 0.3, 0.1, 0.25], 2: [0.5, 0.2, 0.45, 0.1]}
    for launch, xs in x.items():
        for j, xi in enumerate(xs, start=1):
            y = decode_of_probe(xi) + (0.7 if launch == 2 else 0.0)  # a launch-level offset the probe does not see
            rows.append({"launch": launch, "request": j, "length": 256, "engine_decode_tok_s": 20 * math.exp(y),
                         **{f"{when}_{cpu}_{kind}": math.exp(xi) for when in ("pre", "post")
                            for cpu in ("server", "client") for kind in noise.PROBES}})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("slope, r", [(2.0, 1.0), (-0.5, -1.0)])
def test_a_decode_rate_that_follows_the_probe_correlates_fully_within_launches_and_in_pairs(slope, r):
    c = noise.probe_correlations(frame(lambda x: slope * x))
    assert len(c) == 2 * 2 * 3  # CPUs x probes x before/after/both, one metric, one length
    assert np.allclose(c["r_within"], r) and np.allclose(c["r_pairs"], r) and np.allclose(c["variance_removed"], 1)
    assert (c["n"] == 8).all()
    assert (c["r"].abs() < 1 - 1e-6).all()  # pooled over launches, the offset the probe cannot see weakens it


def test_the_probe_times_each_cpu_and_puts_this_thread_back():
    home = os.sched_getaffinity(0)
    cpu = min(home)
    out = noise.probe({"server": cpu}, np.ones(1 << 16, dtype=np.float32))
    assert set(out) == {"server_compute", "server_memory"}
    assert all(v > 0 and math.isfinite(v) for v in out.values())
    assert os.sched_getaffinity(0) == home
