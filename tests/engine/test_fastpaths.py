"""Fidelity of the native fast paths (engine/fastpaths.py): a patch to the model's Python code runs,
in decode too; a patch that changes no code (a comment, a docstring) disables nothing.

Each patched tree is a copy of engine/ with one edit, loaded in a subprocess (the copy's own
engine.model is what gets fingerprinted), serving the tiny model as a Q4_1 GGUF: the production
decode path (native weights, the fused block) at test speed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import fastpaths

needs_native = pytest.mark.usefixtures("native_kernels")

# A patched FeedForward that counts its calls in a module-level counter: the test reads how often
# the patched code ran during a decode step.
COUNTING_FFN = '''    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global FFN_CALLS
        FFN_CALLS += 1
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (B, T, hidden) each
        return self.w2(F.silu(gate) * up)
'''
ORIGINAL_FFN = '''    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # (B, T, hidden) each
        return self.w2(F.silu(gate) * up)
'''

PROBE = """
import json, sys, torch, engine
from engine import generate, model
mode = sys.argv[2] if len(sys.argv) > 2 else None
m = engine.load(sys.argv[1], max_context=64, fused_decode=mode)
ids = generate.greedy(m, [5, 80, 120, 33], 2)  # the prefill, then one decode step
before = getattr(model, "FFN_CALLS", None)
generate.decode_one(m.model, ids[-1], 6)
after = getattr(model, "FFN_CALLS", None)
print(json.dumps({"linear": m.linear, "kv": m.kv_dtype, "fast_paths": m.fast_paths,
                  "ffn_calls_in_one_decode_step": None if before is None else after - before}))
"""


def patched_tree(tmp_path: Path, repo_root: Path, old: str, new: str, append: str = "") -> Path:
    """A copy of engine/ whose engine/model.py has ``old`` replaced by ``new`` (once) and ``append`` added."""
    root = tmp_path / "tree"
    shutil.copytree(repo_root / "engine", root / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    model = root / "engine" / "model.py"
    text = model.read_text()
    assert text.count(old) == 1, f"the edit's anchor is not unique in engine/model.py: {old!r}"
    model.write_text(text.replace(old, new) + append)
    return root


def probe(root: Path, gguf: Path, mode: str | None = None, env: dict | None = None):
    r = subprocess.run([sys.executable, "-c", PROBE, str(gguf), *([mode] if mode else [])], cwd=root,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root), **(env or {})))
    return r, (json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 else None)


def test_the_committed_record_matches_the_committed_model_code():
    """engine/csrc/fastpaths.json is the fingerprint of engine/model.py as committed (after changing
    both together: python -m engine fastpaths --record)."""
    checks = fastpaths.check()
    assert set(checks) == {"fused_decode", "native_kv", "weight_formats"}
    assert all(c.matches for c in checks.values()), {n: c.why() for n, c in checks.items() if not c.matches}
    assert checks["fused_decode"].objects == ("Attention", "Block.forward", "FeedForward", "RMSNorm", "apply_rope")


def test_fingerprints_ignore_comments_docstrings_and_layout_but_not_code():
    base = 'def f(x):\n    """Doc."""\n    y = x * 2  # twice\n    return y + 1\n'
    same = [
        'def f(x):\n    """Another docstring."""\n    y = x * 2\n    return y + 1\n',  # docstring, comment
        'def f(x):\n\n    # a new comment\n    y = (x\n         * 2)\n\n    return y + 1\n',  # layout, no docstring
        '    def f(x):\n        y = x * 2\n        return y + 1\n',  # indented (a method's source)
    ]
    other = [
        'def f(x):\n    y = x * 3\n    return y + 1\n',  # a constant
        'def f(x):\n    y = x * 2\n    return y - 1\n',  # an operator
        'def f(z):\n    y = z * 2\n    return y + 1\n',  # a name
        'def f(x):\n    y = x * 2\n    return (y + 1) * 1.0\n',
    ]
    want = fastpaths.fingerprint_source(base)
    assert all(fastpaths.fingerprint_source(s) == want for s in same)
    assert len({fastpaths.fingerprint_source(s) for s in other} | {want}) == len(other) + 1


def test_the_canonical_form_leaves_empty_fields_out():
    """A field a newer Python adds empty (3.12's type_params) or that is None does not change it."""
    import ast

    tree = ast.parse("def f(x):\n    return x\n")
    text = fastpaths.canonical(tree)
    assert "type_params" not in text and "None" not in text and "decorator_list" not in text
    assert text.startswith("Module(body=[FunctionDef(name='f',args=arguments(args=[arg(arg='x')])")


@needs_native
def test_a_patch_to_feedforward_runs_in_decode(tmp_path, repo_root, tiny_q4_gguf):
    """The patched FeedForward.forward runs in every block of every decode step (the fused native
    block, which would skip it, is off and says why); unpatched, the fused block runs."""
    stock, facts = probe(repo_root, tiny_q4_gguf)
    assert stock.returncode == 0, stock.stderr
    assert facts["fast_paths"]["fused_decode"]["on"] and facts["fast_paths"]["fused_decode"]["layers"] == 2
    root = patched_tree(tmp_path, repo_root, ORIGINAL_FFN, COUNTING_FFN, append="\nFFN_CALLS = 0\n")
    r, facts = probe(root, tiny_q4_gguf)
    assert r.returncode == 0, r.stderr
    fused = facts["fast_paths"]["fused_decode"]
    assert facts["ffn_calls_in_one_decode_step"] == 2  # tiny has 2 blocks
    assert not fused["on"] and not fused["attention_kernel"] and fused["differs"] == ["FeedForward"]
    assert "FeedForward" in fused["why"] and facts["linear"] == "gguf"  # the weight formats stay
    assert facts["kv"] == "f32"  # the KV dtype of the Python path (what `off` gives every arm)
    assert "warning: fused decode off" in r.stderr and "FeedForward" in r.stderr


@needs_native
def test_fused_decode_on_refuses_a_patched_tree_naming_the_class(tmp_path, repo_root, tiny_q4_gguf):
    root = patched_tree(tmp_path, repo_root, ORIGINAL_FFN, COUNTING_FFN, append="\nFFN_CALLS = 0\n")
    r, _ = probe(root, tiny_q4_gguf, "on")
    assert r.returncode != 0 and "FastPathRefused" in r.stderr and "FeedForward" in r.stderr


@needs_native
def test_a_comment_or_docstring_patch_disables_nothing(tmp_path, repo_root, tiny_q4_gguf):
    old = '''class FeedForward(nn.Module):
    def __init__'''
    new = '''class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): a docstring a patch added."""

    # and a comment
    def __init__'''
    root = patched_tree(tmp_path, repo_root, old, new)
    r, facts = probe(root, tiny_q4_gguf, "on")  # `on` would refuse if anything counted as changed
    assert r.returncode == 0, r.stderr
    assert facts["fast_paths"]["fused_decode"]["on"] and facts["fast_paths"]["weight_formats"]["on"]
    assert "warning" not in r.stderr


@needs_native
def test_a_method_rebound_at_import_counts_as_a_change(tmp_path, repo_root, tiny_q4_gguf):
    """``FeedForward.forward = faster`` below the class leaves the class statement as recorded, but
    the code that runs is another: the fused block is off, naming the rebinding."""
    append = ("\n\nFFN_CALLS = 0\n_stock_ffn = FeedForward.forward\n\n\ndef counting_forward(self, x):\n"
              "    global FFN_CALLS\n    FFN_CALLS += 1\n    return _stock_ffn(self, x)\n\n\n"
              "FeedForward.forward = counting_forward\n")
    root = patched_tree(tmp_path, repo_root, "import torch\n", "import torch\n", append=append)
    r, facts = probe(root, tiny_q4_gguf)
    assert r.returncode == 0, r.stderr
    assert facts["ffn_calls_in_one_decode_step"] == 2
    assert facts["fast_paths"]["fused_decode"]["differs"] == ["FeedForward.forward (rebound to counting_forward)"]


@needs_native
def test_a_patch_to_linear_runs_in_fp32_unless_a_format_is_asked_for(tmp_path, repo_root, tiny_q4_gguf):
    """The weight formats stand in for Linear/linear: a patch there makes ``linear auto`` take fp32
    (the patched code's own path), and the fused block, which needs native weights, goes with it."""
    old = "    return F.linear(x, weight)\n"
    root = patched_tree(tmp_path, repo_root, old, "    return F.linear(x, weight) * 1.0\n")
    r, facts = probe(root, tiny_q4_gguf)
    assert r.returncode == 0, r.stderr
    wf = facts["fast_paths"]["weight_formats"]
    assert facts["linear"] == "fp32" and not wf["on"] and wf["differs"] == ["linear"]
    assert not facts["fast_paths"]["fused_decode"]["on"]
    assert "weight formats off" in r.stderr
    r, _ = probe(root, tiny_q4_gguf, "on")
    assert r.returncode != 0 and "weight formats cannot run" in r.stderr and "linear" in r.stderr


@needs_native
def test_off_runs_the_python_path_on_stock_code(repo_root, tiny_q4_gguf):
    r, facts = probe(repo_root, tiny_q4_gguf, "off")
    assert r.returncode == 0, r.stderr
    fused = facts["fast_paths"]["fused_decode"]
    assert facts["fast_paths"]["mode"] == "off" and not fused["on"] and fused["why"] == "fused_decode: off"
    assert facts["linear"] == "gguf" and "warning" not in r.stderr
    r, facts = probe(repo_root, tiny_q4_gguf, env={"PAIRBENCH_ENGINE_FUSED_DECODE": "off"})
    assert r.returncode == 0 and facts["fast_paths"]["mode"] == "off"
    r, _ = probe(repo_root, tiny_q4_gguf, env={"PAIRBENCH_ENGINE_FUSED_DECODE": "sometimes"})
    assert r.returncode != 0 and "PAIRBENCH_ENGINE_FUSED_DECODE" in r.stderr and "sometimes" in r.stderr


@needs_native
def test_without_a_record_no_fast_path_runs_under_auto(tmp_path, repo_root, tiny_q4_gguf):
    """A tree whose record is gone (or unreadable) cannot show its code is the kernels' code."""
    root = patched_tree(tmp_path, repo_root, "import torch\n", "import torch\n")
    (root / "engine" / "csrc" / "fastpaths.json").write_text("{not json")
    r, facts = probe(root, tiny_q4_gguf)
    assert r.returncode == 0, r.stderr
    assert facts["linear"] == "fp32" and not facts["fast_paths"]["fused_decode"]["on"]
    assert "fastpaths.json" in facts["fast_paths"]["fused_decode"]["why"]


def test_fused_decode_on_without_native_kernels_is_refused(repo_root, tiny_q4_gguf):
    r, _ = probe(repo_root, tiny_q4_gguf, "on", env={"PAIRBENCH_ENGINE_NATIVE": "0"})
    assert r.returncode != 0 and "native kernels are unavailable" in r.stderr
    assert "PAIRBENCH_ENGINE_NATIVE=0" in r.stderr
    r, facts = probe(repo_root, tiny_q4_gguf, env={"PAIRBENCH_ENGINE_NATIVE": "0"})  # auto: the portable path
    assert r.returncode == 0 and facts["linear"] == "fp16"
    assert "native kernels are unavailable" in facts["fast_paths"]["fused_decode"]["why"]


def test_the_cli_reports_each_check_and_records(tmp_path, repo_root):
    root = patched_tree(tmp_path, repo_root, ORIGINAL_FFN, COUNTING_FFN, append="\nFFN_CALLS = 0\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "engine", "fastpaths", *a], cwd=root,  # noqa: E731
                                    capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root)))
    r = run()
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["fused_decode"]["differs"] == ["FeedForward"] and out["weight_formats"]["matches"]
    r = run("--record")  # the kernels follow the new code: its fingerprint becomes the record
    assert r.returncode == 0 and json.loads(r.stdout)["fused_decode"]["matches"]
    stock = json.loads((repo_root / "engine" / "csrc" / "fastpaths.json").read_text())
    new = json.loads((root / "engine" / "csrc" / "fastpaths.json").read_text())
    changed = {k for k, v in new["fast_paths"]["fused_decode"]["stands_in_for"].items()
               if v != stock["fast_paths"]["fused_decode"]["stands_in_for"][k]}
    assert changed == {"FeedForward"}


@needs_native
def test_serve_fused_decode_on_exits_naming_the_class_and_auto_serves_the_patch(tmp_path, repo_root, tiny_q4_gguf):
    """``python -m engine serve --fused-decode on`` on a patched tree: exit 2, one line naming the
    class; under auto the server starts, says so in its ready line and in /props."""
    from tests.engine._server import ServerProcess, free_port

    root = patched_tree(tmp_path, repo_root, ORIGINAL_FFN, COUNTING_FFN, append="\nFFN_CALLS = 0\n")
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", str(tiny_q4_gguf), "--port",
                        str(free_port()), "--max-context", "64", "--fused-decode", "on"], cwd=root, timeout=120,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 2 and "cannot load model: fused_decode on" in r.stderr and "FeedForward" in r.stderr
    assert "Traceback" not in r.stderr
    server = ServerProcess(root, str(tiny_q4_gguf), extra=["--max-context", "64"])
    try:
        fused = server.client.get("/props").json()["engine_facts"]["fast_paths"]["fused_decode"]
        log = server.output()
    finally:
        server.stop()
    assert not fused["on"] and fused["differs"] == ["FeedForward"]
    assert "warning: fused decode off" in log and "fused decode off (the code it stands in for differs" in log


@needs_native
def test_the_int8_kv_patch_keeps_the_fused_blocks_and_calls_its_own_kv_update(tmp_path, repo_root, tiny_q4_gguf):
    """config/patches/int8-kv.patch changes KVCache only: each block stays fused and calls the
    patched KVCache.update between its native halves; the one-call step (whose native KV write would
    skip the patch) is off, naming KVCache; `on` refuses it."""
    root = tmp_path / "tree"
    shutil.copytree(repo_root / "engine", root / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(["git", "apply", str(repo_root / "config" / "patches" / "int8-kv.patch")], cwd=root,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r, facts = probe(root, tiny_q4_gguf)
    assert r.returncode == 0, r.stderr
    fp = facts["fast_paths"]
    assert fp["fused_decode"]["on"] and fp["weight_formats"]["on"] and "warning" not in r.stderr
    assert not fp["native_kv"]["on"] and fp["native_kv"]["differs"] == ["KVCache"]
    assert "KVCache" in fp["native_kv"]["why"]
    r, _ = probe(root, tiny_q4_gguf, "on")
    assert r.returncode != 0 and "native KV write cannot run" in r.stderr and "KVCache" in r.stderr


@needs_native
def test_an_unknown_fast_path_name_is_refused_naming_it(repo_root, tiny_q4_gguf):
    r, _ = probe(repo_root, tiny_q4_gguf, env={"PAIRBENCH_ENGINE_FAST_PATHS_OFF": "native_kv,warp_drive"})
    assert r.returncode != 0 and "warp_drive" in r.stderr and "native_kv" in r.stderr
    r, facts = probe(repo_root, tiny_q4_gguf, env={"PAIRBENCH_ENGINE_FAST_PATHS_OFF": "native_kv"})
    assert r.returncode == 0 and facts["fast_paths"]["off"] == ["native_kv"]
    assert not facts["fast_paths"]["native_kv"]["on"] and facts["fast_paths"]["fused_decode"]["on"]
