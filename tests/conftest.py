"""Shared pytest fixtures, and the rule for skips under CI.

Skips under CI: with ``CI`` set (``.ci/run`` sets ``CI=true``), every skip fails the test, unless its
reason starts with :data:`CI_CANNOT_MEET`, which declares that no CI machine can meet it (the kernel
lacks a feature, the machine is too busy to measure on). A missing model, tool, package or native
build is something CI installs (``./install.sh --test``), so a test simply skips with a reason that
names it, and the hooks below turn that skip into a failure under CI: ``pytest.skip``, ``skipif``
and ``importorskip`` alike, in a test, a fixture or at module level (a collection error).

Tests that need the real SmolLM2 GGUF use the ``smollm2_gguf`` fixture; without the file they skip
with a pointer to ./install.sh (so under CI they fail).
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_GGUF = REPO / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# A skip whose reason starts with this is one no CI machine can meet; any other skip fails under CI.
CI_CANNOT_MEET = "CI cannot meet: "


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_ci_could_meet(report) -> str | None:
    """The reason of *report*'s skip when it is one CI could have met and CI is on; else None."""
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    return None if reason.startswith(CI_CANNOT_MEET) else reason


def _fail_skip(report):
    reason = _skip_ci_could_meet(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI={os.environ['CI']} for a reason CI can meet: {reason}\n"
                           f"(./install.sh --test installs what the suite needs; a reason that no CI machine "
                           f"can meet starts with {CI_CANNOT_MEET!r}, see tests/conftest.py)")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return _fail_skip((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return _fail_skip((yield))


def pytest_collection_modifyitems(config, items):
    """tests/engine/ runs the native kernels in this process, through ctypes: a deadlock there never
    returns to Python, so pytest-timeout's signal method (pyproject.toml) could not end it. Its
    thread method can (the call released the GIL): it dumps every thread's stack and ends the run."""
    engine = REPO / "tests" / "engine"
    for item in items:
        if item.path.is_relative_to(engine):
            own = item.get_closest_marker("timeout")  # keep a test's own limit
            limit = own.kwargs.get("timeout", own.args[0] if own.args else None) if own else None
            item.add_marker(pytest.mark.timeout(limit, method="thread"), append=False)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    if not SMOLLM2_GGUF.exists():
        pytest.skip(f"{SMOLLM2_GGUF} is missing: run ./install.sh")
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
