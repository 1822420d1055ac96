"""What you patch is what runs, through the pipeline (issue 35; docs/fidelity.md).

One snakemake run, up to the warmups, of three embedded-engine arms serving the tiny model as a
Q4_1 GGUF (the engine's production decode path, the native fused block, at test speed):

- ``slow_ffn`` patches ``FeedForward.forward`` to sleep 20 ms per block: its build records that the
  fused decode does not stand in for its code, its warmup's facts say the fused decode is off
  because ``FeedForward`` differs, and its first request decodes at least 20 ms per block per token:
  the patched Python code ran in every decode step (the native block would have skipped it);
- ``baseline`` (stock) is launched with the fused decode turned off for the comparison, and says why;
- ``comment`` changes only a comment and a docstring of ``FeedForward``: its build finds nothing
  different (a patch that changes no code disables nothing).

About a minute: two builds' conversions, three short-lived servers for the fixtures and three for the
warmups, no visit.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from pairbench.core.artifacts import read_artifact
from tests.workflow.test_pipeline import copy_repo, snakemake

pytestmark = pytest.mark.slow

FFN = """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (B, T, hidden) each
        return self.w2(F.silu(gate) * up)
"""
SLOW_FFN = """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(0.02)  # a prototype that costs 20 ms per block per step
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (B, T, hidden) each
        return self.w2(F.silu(gate) * up)
"""
COMMENT_FFN = """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        \"\"\"SwiGLU, reworded.\"\"\"
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # gate and up, (B, T, hidden) each
        return self.w2(F.silu(gate) * up)
"""
SLEEP_S, BLOCKS = 0.02, 2  # tiny has two blocks


def write_patch(work: Path, name: str, new: str) -> str:
    """A unified diff of engine/model.py with the stock FeedForward.forward replaced by *new*."""
    old_text = (work / "engine" / "model.py").read_text()
    assert old_text.count(FFN) == 1, "FeedForward.forward is not what this test patches: update FFN"
    diff = difflib.unified_diff(old_text.splitlines(keepends=True), old_text.replace(FFN, new).splitlines(keepends=True),
                                "a/engine/model.py", "b/engine/model.py")
    path = work / "patches" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(diff))
    return f"patches/{name}"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    from tests.engine.test_gguf import write_tiny_gguf

    work = copy_repo(tmp_path_factory.mktemp("fidelity"))
    (work / "models").mkdir()
    write_tiny_gguf(work / "models" / "tiny-q4_1.gguf", gguf.GGMLQuantizationType.Q4_1)
    config = {"label": "fidelity", "model": "models/tiny-q4_1.gguf", "lengths": [400], "output_tokens": 8,
              "rounds": 2, "seed": 0, "validate": {"cases": ["token_counts"], "retries": 0},
              "arms": {"baseline": {"patches": []},
                       "slow_ffn": {"patches": [write_patch(work, "slow-ffn.patch", SLOW_FFN)]},
                       "comment": {"patches": [write_patch(work, "comment-ffn.patch", COMMENT_FFN)]}}}
    (work / "fidelity.yaml").write_text(json.dumps(config))  # JSON is YAML
    res = work / "results" / "fidelity"
    snakemake(work, *(f"results/fidelity/warmup/{a}.json" for a in config["arms"]), "--cores", "2",
              "--configfile", "fidelity.yaml")
    return res


def test_the_build_records_which_fast_paths_each_arms_code_permits(warmed):
    checks = {a: read_artifact(warmed / "build" / f"{a}.json", "build")["fast_paths"]
              for a in ("baseline", "slow_ffn", "comment")}
    assert all(c["matches"] for c in checks["baseline"].values())
    assert all(c["matches"] for c in checks["comment"].values())  # a comment and a docstring change no code
    assert checks["slow_ffn"]["fused_decode"] == {"matches": False, "differs": ["FeedForward"], "error": None,
                                                  "objects": checks["baseline"]["fused_decode"]["objects"]}
    assert checks["slow_ffn"]["native_kv"]["matches"] and checks["slow_ffn"]["weight_formats"]["matches"]


def test_the_patched_feedforward_runs_in_decode_and_every_arm_decodes_on_the_python_path(warmed):
    warm = {a: read_artifact(warmed / "warmup" / f"{a}.json", "warmup") for a in ("baseline", "slow_ffn", "comment")}
    for arm, w in warm.items():
        fused = w["engine_facts"]["fast_paths"]["fused_decode"]
        assert not fused["on"] and fused["layers"] == 0, (arm, fused)
        assert w["engine_facts"]["linear"] == "gguf"  # the weight formats stay: their code is unpatched
    patched = warm["slow_ffn"]
    assert patched["fast_paths"] == {"mode": "auto", "off": [], "why": {}}  # its engine turned it off itself
    assert patched["engine_facts"]["fast_paths"]["fused_decode"]["differs"] == ["FeedForward"]
    for arm in ("baseline", "comment"):
        assert warm[arm]["fast_paths"] == {"mode": "auto", "off": ["fused_decode"],
                                           "why": {"fused_decode": "arm slow_ffn's code differs: FeedForward"}}
        assert warm[arm]["engine_facts"]["fast_paths"]["fused_decode"]["why"] == "turned off (fast_paths_off)"
    # the patched code ran in every decode step: 20 ms per block per generated token after the first
    first = patched["first_request"]
    decode_s = (first["e2e_ms"] - first["ttft_ms"]) / 1e3
    assert first["completion_tokens"] == 8 and decode_s >= 7 * BLOCKS * SLEEP_S, first
    base = warm["baseline"]["first_request"]
    assert (base["e2e_ms"] - base["ttft_ms"]) / 1e3 < decode_s / 2, (base, first)
    # the warmup job's log says why (logs/<label>/warmup/<arm>.log)
    log = warmed.parents[1] / "logs" / "fidelity" / "warmup" / "baseline.log"
    assert "arm baseline: fast path fused_decode off for the comparison (arm slow_ffn's code differs: " \
           "FeedForward)" in log.read_text()
