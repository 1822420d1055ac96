"""The example prototype patches in config/patches/ against a pristine copy of engine/.

Each patch must apply with ``git apply --check`` to the current engine/ (so a patch can never rot
silently when engine/ changes), and the patched copy must serve the tiny model.
- kv-grow: greedy tokens identical to the baseline, and less KV memory for short sequences.
- int8-kv: 1 + 2/D bytes per KV element instead of the stock cache's 2 (float16, with the native
  kernels) or 4 (float32, without); agreement threshold, teacher-forced over 64 decode steps on the
  tiny model: top-1 agreement >= 95 % of positions and max |logit difference| <= 5 % of the
  baseline logits' standard deviation; and the first 16 greedy tokens identical.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine
from engine import generate
from tests.engine._server import ServerProcess

PATCHES = ["int8-kv", "kv-grow"]
PROMPT = "The example prototype patches must keep the engine serving. " * 6  # > one 256-position chunk


def pristine_copy(repo_root: Path, dest: Path) -> Path:
    shutil.copytree(repo_root / "engine", dest / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def git_apply(patch: Path, cwd: Path, check: bool) -> subprocess.CompletedProcess:
    cmd = ["git", "apply", *(["--check"] if check else []), "--verbose", str(patch)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def patched(repo_root, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in PATCHES:
        root = pristine_copy(repo_root, tmp_path_factory.mktemp(name))
        r = git_apply(repo_root / "config" / "patches" / f"{name}.patch", root, check=False)
        assert r.returncode == 0, f"{name}.patch does not apply:\n{r.stderr}"
        out[name] = root
    return out


@pytest.mark.parametrize("name", PATCHES)
def test_patch_applies_to_pristine_engine(repo_root, tmp_path, name):
    root = pristine_copy(repo_root, tmp_path)
    patch = repo_root / "config" / "patches" / f"{name}.patch"
    r = git_apply(patch, root, check=True)
    assert r.returncode == 0, f"{patch.name} no longer applies to engine/:\n{r.stderr}"
    touched = {line.split(" b/", 1)[1] for line in patch.read_text().splitlines() if line.startswith("diff --git ")}
    assert touched and all(p.startswith("engine/") for p in touched), touched


def test_decode_slowdown_patch_applies_to_the_scheduler_s_decode_step(repo_root, tmp_path):
    """bench/power.py's known effect: every decode step of the server (the scheduler's batched step)
    spins for a fixed fraction of its own time."""
    root = pristine_copy(repo_root, tmp_path)
    patch = repo_root / "bench" / "patches" / "decode-slowdown.patch"
    r = git_apply(patch, root, check=False)
    assert r.returncode == 0, f"{patch.name} no longer applies to engine/:\n{r.stderr}"
    text = (root / "engine" / "scheduler.py").read_text()
    assert "PAIRBENCH_DECODE_SLOWDOWN" in text and "* _SLOW" in text


@pytest.mark.parametrize("name, suffix", [("int8-kv", "+int8kv"), ("kv-grow", "+kvgrow")])
def test_patched_version_string(patched, name, suffix):
    r = subprocess.run([sys.executable, "-m", "engine", "--version"], cwd=patched[name],
                       env=dict(os.environ, PYTHONPATH=str(patched[name])),
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == f"pairbench-engine {engine.__version__}{suffix}"


def serve_and_complete(root: Path, max_tokens: int = 24) -> tuple[dict, dict]:
    srv = ServerProcess(root, "tiny", ["--max-context", "1024"])
    try:
        body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False}
        first = srv.client.post("/v1/completions", json=body).json()
        # A second request that reuses the prefix and grows past it (another chunk for kv-grow).
        again = srv.client.post("/v1/completions", json=dict(body, prompt=PROMPT * 2, cache_prompt=True)).json()
        version = srv.client.get("/version").json()
        return first, dict(again=again, version=version)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def baseline_served(repo_root, tmp_path_factory):
    return serve_and_complete(pristine_copy(repo_root, tmp_path_factory.mktemp("baseline")))


def test_kv_grow_serves_identical_greedy_tokens_with_less_memory(patched, baseline_served):
    base, base_more = baseline_served
    grow, grow_more = serve_and_complete(patched["kv-grow"])
    assert grow_more["version"]["version"].endswith("+kvgrow")
    assert grow["choices"][0]["tokens"] == base["choices"][0]["tokens"]
    assert grow_more["again"]["choices"][0]["tokens"] == base_more["again"]["choices"][0]["tokens"]
    assert grow_more["again"]["tokens_cached"] == base_more["again"]["tokens_cached"] > 0
    # The prompt fits in two 256-position chunks out of the 1024 preallocated by the baseline.
    assert grow["memory"]["kv_bytes"] * 2 == base["memory"]["kv_bytes"]
    assert grow_more["again"]["memory"]["kv_bytes"] > grow["memory"]["kv_bytes"]


def test_int8_kv_serves_with_less_kv_memory(patched, baseline_served):
    from engine import native

    base, _ = baseline_served
    q, q_more = serve_and_complete(patched["int8-kv"])
    assert q_more["version"]["version"].endswith("+int8kv")
    head_dim = engine.load("tiny", max_context=8).config.head_dim
    # int8 data plus one float16 scale per head_dim vector, against the stock cache's float16
    # (native kernels available) or float32.
    stock = 2 if native.available() else 4
    assert base["memory"]["kv_bytes"] / q["memory"]["kv_bytes"] == pytest.approx(stock / (1 + 2 / head_dim))
    assert q["choices"][0]["tokens"][:16] == base["choices"][0]["tokens"][:16]


TEACHER_FORCED = """
import json, sys, torch, engine
from engine import generate
seq, n_prompt = json.loads(sys.argv[1]), int(sys.argv[2])
m = engine.load("tiny", max_context=1024)
rows = [generate.prefill(m.model, seq[:n_prompt], 0)]
for pos in range(n_prompt, len(seq) - 1):
    rows.append(generate.decode_one(m.model, seq[pos], pos))
print(json.dumps(torch.stack(rows).tolist()))
"""


def teacher_forced_logits(root: Path, seq: list[int], n_prompt: int) -> torch.Tensor:
    r = subprocess.run([sys.executable, "-c", TEACHER_FORCED, json.dumps(seq), str(n_prompt)], cwd=root,
                       env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return torch.tensor(json.loads(r.stdout))


def test_int8_kv_agreement_with_baseline(repo_root, patched, tmp_path):
    tiny = engine.load("tiny", max_context=1024)
    prompt = tiny.tokenizer.encode(PROMPT)
    seq = prompt + generate.greedy(tiny, prompt, 64)
    base = teacher_forced_logits(pristine_copy(repo_root, tmp_path), seq, len(prompt))  # (64, V)
    quant = teacher_forced_logits(patched["int8-kv"], seq, len(prompt))
    assert base.shape == quant.shape == (64, tiny.config.vocab_size)
    assert base.argmax(-1).tolist() == seq[len(prompt):]  # the reference really is the greedy path
    agreement = (base.argmax(-1) == quant.argmax(-1)).float().mean().item()
    max_err = ((quant - base).abs().max() / base.std()).item()
    print(f"int8-kv vs baseline, 64 teacher-forced steps: top-1 agreement {agreement:.3f}, "
          f"max |logit diff| / std {max_err:.4f}")
    assert agreement >= 0.95, agreement
    assert max_err <= 0.05, max_err
    assert not torch.equal(base, quant)  # the patch really changed the arithmetic
