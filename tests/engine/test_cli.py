"""The engine's command line beyond ``serve``: ``tokenizer-dir`` (a Hugging Face tokenizer directory
for clients such as AIPerf) and ``build-kernels`` (what ./install.sh runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_engine(repo_root, *args, env=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=repo_root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(repo_root), **(env or {})))


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_tokenizer_dir_loads_in_transformers_with_the_same_ids(repo_root, tmp_path, model, request):
    transformers = pytest.importorskip("transformers")
    from engine.weights import load_tokenizer

    spec = str(request.getfixturevalue("smollm2_gguf")) if model == "smollm2" else "tiny"
    r = run_engine(repo_root, "tokenizer-dir", spec, str(tmp_path / "tok"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "tok")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    ours, name, ctx = load_tokenizer(spec)
    text = "Hello world 12345 <|im_start|>user\nhé 🙂 def f(x):\n    return x"
    assert hf(text)["input_ids"] == ours.encode(text, add_special=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert list(ids) == ours.encode_chat(messages)
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == ctx and config["name_or_path"] == name


def test_tokenizer_dir_names_a_bad_model(repo_root, tmp_path):
    r = run_engine(repo_root, "tokenizer-dir", str(tmp_path / "missing.gguf"), str(tmp_path / "out"))
    assert r.returncode == 2 and "missing.gguf" in r.stderr


def test_build_kernels_prints_the_library_or_warns(repo_root, tmp_path):
    from engine import native

    r = run_engine(repo_root, "build-kernels")
    if native.available():
        assert r.returncode == 0 and r.stdout.strip().endswith("libpairbench_kernels.so"), r.stderr
    # A compiler that fails: a warning naming the fp16 fallback, exit 1, never a traceback.
    r = run_engine(repo_root, "build-kernels", env={"CXX": "false", "PAIRBENCH_NATIVE_CACHE": str(tmp_path)})
    assert r.returncode == 1 and "fp16 path" in r.stderr and "Traceback" not in r.stderr
