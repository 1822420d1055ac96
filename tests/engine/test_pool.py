"""The native pool's choice between one and two threads (engine/csrc/kernels.cpp, ``Pool``).

A second decode thread is worth ~1.4x on an idle 2-core machine, so the pool must keep it through
the rare long wait an idle machine still shows (an interrupt, a kernel thread), and give it up only
when two threads have become slower than one: helpers that keep stalling, or a caller that waits
for a core because other processes want both. Each case is made real here: stalls injected into
the helper (``native.test_stall``), and CPU-bound processes on both cores.
"""

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from engine import kernels, native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: "
                                                                f"{native.unavailable_reason()}")


CPUS = len(os.sched_getaffinity(0))


@pytest.fixture
def two_threads():
    before = native.threads()
    native.set_threads(2)
    native.test_stall(0, 0)  # (also clears the pool's backoff history)
    native.pool_stats()
    yield
    native.test_stall(0, 0)
    native.set_threads(before)


def q4_matrix(n=1536, k=576, seed=0):
    """(the kernels' split rows, GGUF's blocks) of a random Q4_1 matrix"""
    g = torch.Generator().manual_seed(seed)
    gguf_blocks = kernels.quantize_q4_1(torch.randn(n, k, generator=g) * 0.05)
    return kernels.split_rows("q4_1", gguf_blocks), gguf_blocks


def run_jobs(blocks, n, jobs, x):
    """``jobs`` pool jobs of one matrix-vector product; its result, the same every time"""
    ref = None
    for _ in range(jobs):
        y = native.linear(x, "q4_1", blocks, n)
        if ref is None:
            ref = y.clone()
        assert torch.equal(y, ref)  # which thread ran a chunk never changes the result
    return ref


def test_rare_long_stalls_keep_both_threads(two_threads):
    """The pool once backed off 100 ms-2 s (doubling) for each such stall: ~90 % of these jobs ran
    alone. Other processes' activity makes stalls of its own, and a backoff for those is right, so
    each attempt first runs 2,000 jobs without injected stalls: only where those kept both threads
    is the injected run judged. (With the old policy this failed 1 run in 3 and skipped 2: its
    uninjected runs backed off too.)"""
    blocks, _ = q4_matrix()
    x = torch.randn(1, 576)
    judged = []
    for _attempt in range(3):
        native.test_stall(0, 0)
        native.pool_stats()
        run_jobs(blocks, 1536, 2000, x)
        if native.pool_stats()["alone"]:
            continue  # this machine's own stalls earned a backoff: no quiet second core to test with
        native.test_stall(1000, 1000)  # 1 ms inside one job in a thousand: an idle machine's worst
        run_jobs(blocks, 1536, 20000, x)
        stats = native.pool_stats()
        assert stats["stalls"] >= 1, stats
        judged.append(stats)
        if stats["alone"] < stats["jobs"] // 2:
            return
    if not judged:
        pytest.skip("CI cannot meet: the second core was never quiet: every uninjected run backed off")
    pytest.fail(f"rare injected stalls made the pool work alone: {judged}")


def test_stalling_helper_makes_the_caller_work_alone(two_threads):
    blocks, gguf_blocks = q4_matrix()
    x = torch.randn(1, 576)
    ref = F.linear(x, kernels.dequantize_ref("q4_1", gguf_blocks, 576))
    native.test_stall(1, 1000)  # every job: a helper that is never there when needed
    y = run_jobs(blocks, 1536, 2000, x)
    stats = native.pool_stats()
    # most jobs ran alone; without the backoff every one would have waited >= 1 ms for the helper
    assert stats["alone"] > 1000, stats
    assert float((y - ref).abs().max()) <= 2e-3 * float(ref.abs().max())


def test_other_processes_on_both_cores_make_the_caller_work_alone(two_threads):
    blocks, _ = q4_matrix()
    x = torch.randn(1, 576)
    # one CPU-bound process per CPU this test may use: both of the pool's threads must share
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CPUS)]
    try:
        time.sleep(0.3)
        run_jobs(blocks, 1536, 4000, x)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    stats = native.pool_stats()
    assert stats["busy"] + stats["stalls"] > 0, stats
    assert stats["alone"] > 0, stats
