"""Shared pytest fixtures.

Tests that need the real SmolLM2 GGUF use the ``smollm2_gguf`` fixture. Locally, without the file,
they skip with a pointer to ./install.sh; under CI (``CI`` set) a missing model is a hard failure,
so the correctness tests can never be silently skipped there.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_GGUF = REPO / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    if not SMOLLM2_GGUF.exists():
        msg = f"{SMOLLM2_GGUF} is missing: run ./install.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return SMOLLM2_GGUF


@pytest.fixture
def embedded_engine():
    """A factory: the embedded engine's adapter (pairbench.engines.adapter.ArmEngine) for a source
    tree, e.g. the fake engine in tests/fakes: ``embedded_engine(src, "--hang", env={...})``."""
    from pairbench.engines.adapter import arm_adapter

    def make(src, *args, env=None, model="tiny", ctx=512, threads=None):
        return arm_adapter({"args": list(args), "env": env or {}, "threads": threads}, model=model, model_path=None,
                           ctx=ctx, src_dir=src)

    return make


SPIN = """\
import sys, time
deadline = time.monotonic() + float(sys.argv[1])  # stops itself, whatever happens to the test
print("spinning", flush=True)
while time.monotonic() < deadline:
    pass
"""


@pytest.fixture
def synthetic_load():
    """A factory: ``start(n, life_s=180)`` starts n CPU-bound processes and returns once each has
    said it runs (a handshake on its stdout, not a sleep). Each stops itself after *life_s*; all are
    killed at teardown."""
    import subprocess
    import sys

    procs = []

    def start(n: int, life_s: float = 180.0) -> list:
        new = [subprocess.Popen([sys.executable, "-c", SPIN, str(life_s)], stdout=subprocess.PIPE, text=True)
               for _ in range(n)]
        procs.extend(new)
        for p in new:
            assert p.stdout.readline().strip() == "spinning", "a load process did not start"
        return new

    yield start
    for p in procs:
        p.kill()
        p.wait()
        p.stdout.close()
