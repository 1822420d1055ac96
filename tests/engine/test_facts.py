"""The engine's effective facts (engine/facts.py, GET /props) and the faults that change them: no
native kernels, a kernels build that fails, a CPU without any native path, an instruction-set cache
made on another CPU model. In each the engine says which, runs the portable path, and the facts say
what ran."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from engine import native
from tests.engine._server import ServerProcess

needs_native = pytest.mark.usefixtures("native_kernels")

FACTS = """
import json, sys, engine
from engine.facts import engine_facts
m = engine.load(sys.argv[1], max_context=64)
print(json.dumps(engine_facts(m, prefill_threads=1, decode_threads=1)))
"""


def facts_of(repo_root, gguf, env: dict) -> tuple[subprocess.CompletedProcess, dict | None]:
    r = subprocess.run([sys.executable, "-c", FACTS, str(gguf)], cwd=repo_root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(repo_root), **env))
    return r, (json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 else None)


@needs_native
def test_props_gives_what_runs(repo_root, tiny_q4_gguf):
    server = ServerProcess(repo_root, str(tiny_q4_gguf), extra=["--max-context", "64", "--decode-threads", "1"])
    try:
        facts = server.client.get("/props").json()["engine_facts"]
        log = server.output()
    finally:
        server.stop()
    source = (repo_root / "engine" / "csrc" / "kernels.cpp").read_bytes()
    assert facts["native"]["available"] and facts["native"]["reason"] is None
    assert facts["native"]["kernels_sha256"] == hashlib.sha256(source).hexdigest()
    assert facts["native"]["isa"] in native.ISAS
    assert facts["native"]["isa_source"] in ("env", "cache", "measured", "only")  # a model load chose it
    assert facts["linear"] == "gguf" and facts["kv_dtype"] == "f16" and facts["torch"] == torch.__version__
    assert facts["threads"] == {"prefill": 1, "decode": 1} and facts["slots"] == 1
    fp = facts["fast_paths"]
    assert fp["mode"] == "auto" and fp["fused_decode"]["on"] and fp["fused_decode"]["layers"] == 2
    assert fp["weight_formats"] == {"on": True, "linear": "gguf", "differs": [], "why": None}
    assert f"linear gguf ({facts['native']['isa']}" in log and "fused decode on [fused_decode auto]" in log


@pytest.mark.parametrize("fault, env, reason", [
    ("disabled", {"PAIRBENCH_ENGINE_NATIVE": "0"}, "PAIRBENCH_ENGINE_NATIVE=0"),
    ("build fails", {"CXX": "false", "PAIRBENCH_NATIVE_CACHE": "{tmp}"}, "compiling kernels.cpp failed"),
])
def test_without_native_kernels_the_facts_say_why_and_the_portable_path_runs(repo_root, tmp_path, tiny_q4_gguf,
                                                                              fault, env, reason):
    env = {k: v.format(tmp=tmp_path / "cache") for k, v in env.items()}
    r, facts = facts_of(repo_root, tiny_q4_gguf, env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("native kernels unavailable") == 1 and reason in r.stderr
    n = facts["native"]
    assert not n["available"] and reason in n["reason"] and n["isa"] is None
    assert n["kernels_sha256"]  # the source is there, whatever became of its build
    assert facts["linear"] == "fp16" and facts["kv_dtype"] == "f32"
    assert not facts["fast_paths"]["fused_decode"]["on"]
    assert "native kernels are unavailable" in facts["fast_paths"]["fused_decode"]["why"]


@needs_native
def test_a_cpu_without_any_native_path_runs_the_portable_path(monkeypatch, tiny_q4_gguf, capsys):
    """The library builds, but this CPU cannot run it (no AVX2/FMA/F16C): the same fallback."""
    import engine
    from engine.facts import engine_facts

    real_bind = native._bind

    def bind_on_an_old_cpu(path):
        lib = real_bind(path)
        lib.pb_cpu_supported = lambda: 0
        return lib

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_bind", bind_on_an_old_cpu)
    m = engine.load(str(tiny_q4_gguf), max_context=64)
    facts = engine_facts(m, prefill_threads=1, decode_threads=1)
    assert "this CPU lacks AVX2/FMA/F16C" in capsys.readouterr().err
    assert facts["native"]["reason"] == "this CPU lacks AVX2/FMA/F16C" and m.linear == "fp16"
    assert not facts["fast_paths"]["fused_decode"]["on"]


@needs_native
def test_an_isa_cache_from_another_cpu_model_is_measured_over(repo_root, tmp_path, tiny_q4_gguf):
    """End to end, in a cache folder of its own: the build measures this CPU; that entry is then made
    another CPU's; the next load says so, measures this CPU again, and keeps both entries."""
    env = dict(os.environ, PYTHONPATH=str(repo_root), PAIRBENCH_NATIVE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "engine", "build-kernels", "--model", str(tiny_q4_gguf)],
                       cwd=repo_root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (cache,) = (tmp_path / "cache").glob("*/isa.json")
    doc = json.loads(cache.read_text())
    (key, entry), = doc["cpus"].items()
    if len(key.rsplit("; ", 1)[1].split("+")) < 2:
        pytest.skip("CI cannot meet: this CPU runs one instruction-set path, so there is nothing to choose or cache")
    doc["cpus"] = {"GenuineIntel Some Other CPU (family 6 model 1 stepping 1; avx2+avx512vnni)": entry}
    cache.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-c", FACTS, str(tiny_q4_gguf)], cwd=repo_root, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout.splitlines()[-1])
    assert "Some Other CPU" in r.stderr and "measuring" in r.stderr
    assert facts["native"]["isa_source"] == "measured" and facts["native"]["cpu"] == key
    assert set(json.loads(cache.read_text())["cpus"]) == {key, *doc["cpus"]}
