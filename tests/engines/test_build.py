"""One build path for every engine: pairbench.arms.build.build_arm runs the recipe that the arm's
engine profile renders (EngineProfile.build_recipe), whether the embedded engine (byte-compile, a
cached model conversion, a required version) or an external one (a build command or CMake, an
optional version). The embedded builds run the fake engine (tests/fakes/engine) as the exported
``engine/`` package: it byte-compiles, 'converts' a model by writing one file, and prints its version.
"""

import hashlib
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pairbench.arms.build import BuildError, build_arm, conversion_key
from pairbench.core.artifacts import validate
from pairbench.core.trees import manifest, tree_sha256
from pairbench.engines.profiles import load_profile

FAKE_ENGINE = Path(__file__).resolve().parents[1] / "fakes" / "engine"


def exported(tmp_path: Path, name: str = "cand") -> Path:
    """``src/<arm>/`` of an embedded arm: the fake engine as ``engine/``."""
    tree = tmp_path / "src" / name
    shutil.copytree(FAKE_ENGINE, tree / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def source_of(tree: Path) -> dict:
    """The ``source`` record of *tree* as exported, without patches (what the build checks the tree
    against): the embedded engine's is its ``engine/`` folder, any other's the tree itself."""
    embedded = (tree / "engine").is_dir()
    man = manifest(tree / "engine" if embedded else tree)
    return {"source": "engine" if embedded else {"git": "repo", "tag": "t1"}, "version": "0.1.0-fake",
            "pristine": {"files": len(man), "tree_sha256": tree_sha256(man), "manifest": man}, "patches": [],
            "patched": {"files": len(man), "tree_sha256": tree_sha256(man), "changed": []}}


def run(tmp_path, arm_cfg, tree, model, *, recipe=None, log="b.log", commit=None, source=None):
    recipe = recipe or load_profile(arm_cfg.get("engine", "embedded")).build_recipe(arm_cfg, src=tree, commit=commit)
    body = build_arm("cand", tree, recipe, source=source or source_of(tree), model=model, cache_dir=tmp_path / "cache",
                     log=tmp_path / log, source_sha256="b" * 64, root=tmp_path)
    validate("build", {"schema": "pairbench.build/v2", **body})
    return body


def gguf(tmp_path) -> dict:
    path = tmp_path / "models" / "m.gguf"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"GGUF fake weights")
    return {"name": "m", "kind": "gguf", "path": str(path)}


def test_each_profile_renders_its_own_recipe():
    emb = load_profile("embedded").build_recipe({}, src="/t")
    assert emb.command == (sys.executable, "-m", "compileall", "-q", "engine") and emb.command_step == "byte_compile"
    assert emb.convert == (sys.executable, "-m", "engine", "convert") and emb.cmake is None
    assert emb.version == (sys.executable, "-m", "engine", "--version") and emb.version_required
    assert emb.engine is None and emb.timeout_s == 3600
    ls = load_profile("llama-server").build_recipe({"threads": 2}, src="/t", commit="0123456789abcdef")
    assert ls.command is None and ls.convert is None and not ls.version_required
    assert ls.cmake["targets"] == ["llama-server", "llama-bench"] and "-DLLAMA_BUILD_COMMIT=0123456" in ls.cmake["flags"]
    assert ls.version == ("/t/build/bin/llama-server", "--version") and ls.engine["engine"] == "llama-server"
    # the arm's own build argv wins over the profile's CMake build (a step named 'build')
    own = load_profile("llama-server").build_recipe({"build": ["make", "-j{threads}"], "threads": 3}, src="/t")
    assert own.command == ("make", "-j3") and own.command_step == "build" and own.cmake is None
    installed = load_profile("vllm").build_recipe({}, src="/t")
    assert installed.command is None and installed.cmake is None and installed.convert is None


def test_embedded_converts_once_per_tree_and_model_and_hands_the_server_the_converted_folder(tmp_path):
    tree, model = exported(tmp_path), gguf(tmp_path)
    tree_sha = source_of(tree)["patched"]["tree_sha256"]
    first = run(tmp_path, {}, tree, model)
    assert [s["step"] for s in first["steps"]] == ["byte_compile", "convert", "version"]
    assert first["steps"][0]["argv"] == ["python", "-m", "compileall", "-q", "engine"]
    assert first["steps"][1]["argv"][-2] == "m.gguf"  # file names only: the paths are private
    assert first["native_version"] == "fake-engine 0.1.0-fake" and all(s["exit_code"] == 0 for s in first["steps"])
    key = conversion_key(tree_sha, hashlib.sha256(b"GGUF fake weights").hexdigest())
    assert first["conversion"] == {"key": key, "cached": False, "path": f"cache/{key}",
                                   "model_sha256": hashlib.sha256(b"GGUF fake weights").hexdigest()}
    assert (tmp_path / "cache" / key / "config.json").is_file() and (tmp_path / "cache" / key / ".complete").is_file()
    assert first["model"] == {"name": "m", "kind": "gguf", "arg": None}  # the server gets conversion.path
    assert first["toolchain"] is None and "engine" not in first  # only external engines' evidence is described
    # byte-code is no output: the tree is the exported one, as the audit will find it
    assert first["tree_outputs"] == [] and first["environment"] is None
    assert any(p.suffix == ".pyc" for p in (tree / "engine").rglob("*.pyc"))
    again = run(tmp_path, {}, tree, model, log="b2.log")
    assert [s["step"] for s in again["steps"]] == ["byte_compile", "version"] and again["conversion"]["cached"]
    assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" / key]  # no partial folder left behind


def test_embedded_named_model_is_not_converted_and_its_name_is_the_argument(tmp_path):
    body = run(tmp_path, {}, exported(tmp_path), {"name": "tiny", "kind": "named", "path": None})
    assert [s["step"] for s in body["steps"]] == ["byte_compile", "version"]
    assert body["conversion"] is None and body["model"]["arg"] == "tiny"


def test_a_required_version_that_prints_nothing_fails_the_build(tmp_path):
    tree = exported(tmp_path)
    recipe = replace(load_profile("embedded").build_recipe({}, src=tree), version=(sys.executable, "-c", "pass"))
    with pytest.raises(BuildError, match=r"arm cand: build step 'version': `python -c pass` printed nothing; see .*b\.log"):
        run(tmp_path, {}, tree, {"name": "tiny", "kind": "named", "path": None}, recipe=recipe)
    (tree / "engine" / "server.py").write_text("def main(:\n")  # a patch that broke the syntax
    with pytest.raises(BuildError, match=r"arm cand: build step 'byte_compile' exited with status 1; see .*b\.log"):
        run(tmp_path, {}, tree, {"name": "tiny", "kind": "named", "path": None})


def test_external_runs_its_build_command_then_an_optional_version(tmp_path):
    tree = tmp_path / "src" / "cand"
    tree.mkdir(parents=True)
    model = gguf(tmp_path)
    arm = {"engine": "llama-server", "threads": 2,
           "build": ["{python}", "-c", "import pathlib; pathlib.Path('built').write_text('{threads}')"]}
    body = run(tmp_path, arm, tree, model)
    assert (tree / "built").read_text() == "2" and body["tree_outputs"] == ["built"]
    assert [s["step"] for s in body["steps"]] == ["build", "version"]
    # no llama-server binary yet: the version is unknown, not a failure (launch will tell)
    assert body["steps"][1] == {**body["steps"][1], "exit_code": 127, "argv": ["llama-server"]}
    assert body["native_version"] == "unknown" and body["conversion"] is None
    assert body["model"]["arg"] == "models/m.gguf"  # the server reads the GGUF itself
    assert body["engine"]["cold_cache_proof"] == "strong" and body["toolchain"] is None
    with pytest.raises(BuildError, match=r"arm cand: build step 'build' exited with status 3; see .*b2\.log"):
        run(tmp_path, {**arm, "build": ["{python}", "-c", "raise SystemExit(3)"]}, tree, model, log="b2.log")


def test_an_installed_engine_builds_nothing_and_an_optional_version_may_fail_or_print_on_stderr(tmp_path):
    tree = tmp_path / "src" / "cand"
    tree.mkdir(parents=True)
    profile = load_profile("llama-cpp-python")
    recipe = profile.build_recipe({}, src=tree)
    assert recipe.command is None and recipe.cmake is None and recipe.version[:2] == (sys.executable, "-c")
    failing = replace(recipe, version=(sys.executable, "-c", "import sys; sys.exit(4)"))
    body = run(tmp_path, {}, tree, gguf(tmp_path), recipe=failing)
    assert [(s["step"], s["exit_code"]) for s in body["steps"]] == [("version", 4)]
    assert body["native_version"] == "unknown" and body["engine"]["engine"] == "llama-cpp-python"
    assert "(exit status 4: the version is left unknown)" in (tmp_path / "b.log").read_text()
    stderr = replace(recipe, version=(sys.executable, "-c", "import sys; sys.stderr.write('version: 1 (abc)\\nmore')"))
    assert run(tmp_path, {}, tree, gguf(tmp_path), recipe=stderr, log="b2.log")["native_version"] == "version: 1 (abc)"
