"""Fixtures shared by the engine's tests: the native kernels (a skip that CI must never see) and a
tiny GGUF with Q4_1 weights, which runs the engine's production decode path (the native fused,
batched block) at test speed."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def native_kernels():
    """The native library. Locally its absence skips (with the reason); under CI, where
    ``./install.sh`` builds it, its absence fails."""
    from engine import native
    from tests.conftest import in_ci

    if not native.available():
        msg = f"native kernels unavailable: {native.unavailable_reason()}"
        if in_ci():  # the suite's one reading of CI (tests/conftest.py): CI=false is not CI
            pytest.fail(msg)
        pytest.skip(msg)
    return native


@pytest.fixture(scope="session")
def tiny_q4_gguf(tmp_path_factory):
    """The tiny model's weights written as a Q4_1 GGUF (as llama.cpp's converter lays one out)."""
    gguf = pytest.importorskip("gguf")
    from tests.engine.test_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("tiny-q4") / "tiny-q4_1.gguf"
    write_tiny_gguf(path, gguf.GGMLQuantizationType.Q4_1)
    return path
