"""One build path for every engine: pairbench.arms.build.build_arm runs the recipe that the arm's
engine profile renders (EngineProfile.build_recipe), whether the embedded engine (byte-compile, a
cached model conversion, a required version) or an external one (a build command or CMake, an
optional version). The embedded builds run the fake engine (tests/fakes/engine) as the exported
``engine/`` package: it byte-compiles, 'converts' a model by writing one file, and prints its version.
"""

import hashlib
import shutil
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from pairbench.arms.build import BuildError, build_arm, conversion_key
from pairbench.core.artifacts import validate
from pairbench.core.trees import build_outputs, manifest, tree_sha256
from pairbench.engines.profiles import InstallRecipe, load_profile

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
    validate("build", {"schema": "pairbench.build/v3", **body})
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
    installed = load_profile("vllm").build_recipe({}, src="/t")  # no source: the vllm beside pairbench
    assert installed.command is None and installed.cmake is None and installed.convert is None
    assert installed.install is None and installed.version == (f"{sysconfig.get_path('scripts')}/vllm", "--version")


def test_a_python_engine_with_a_source_is_installed_into_the_arms_own_environment():
    arm = {"source": {"git": "https://example.invalid/vllm.git", "tag": "v0.10.1"}}
    vllm = load_profile("vllm").build_recipe(arm, src="/t", commit="0123456789", tag="v0.10.1")
    assert vllm.command is None and vllm.cmake is None
    assert vllm.install == InstallRecipe(
        env_dir="/t/.venv", python="/t/.venv/bin/python", system_site_packages=True,
        command=("/t/.venv/bin/python", "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                 "--config-settings", "editable_mode=compat", "-e", "."),
        env={"VLLM_USE_PRECOMPILED": "1", "SETUPTOOLS_SCM_PRETEND_VERSION": "v0.10.1"}, package="vllm", module="vllm")
    assert vllm.version == ("/t/.venv/bin/vllm", "--version")  # {bin}: the environment's scripts
    untagged = load_profile("vllm").build_recipe({"source": "somewhere"}, src="/t")
    assert untagged.install.env == {"VLLM_USE_PRECOMPILED": "1"}  # {tag} without a tag: left unset
    # the arm's own build replaces the install command, in the same environment
    full = load_profile("vllm").build_recipe({**arm, "build": ["{python}", "-m", "pip", "install", "-e", "."]}, src="/t")
    assert full.install.command == ("/t/.venv/bin/python", "-m", "pip", "install", "-e", ".") and full.command is None
    sglang = load_profile("sglang").build_recipe(arm, src="/t")
    assert sglang.install.command[-2:] == ("-e", "python") and sglang.version[0] == "/t/.venv/bin/python"
    lcp = load_profile("llama-cpp-python").build_recipe(arm, src="/t")
    assert (lcp.install.package, lcp.install.module) == ("llama-cpp-python", "llama_cpp")


def test_embedded_converts_once_per_tree_and_model_and_hands_the_server_the_converted_folder(tmp_path):
    tree, model = exported(tmp_path), gguf(tmp_path)
    tree_sha = source_of(tree)["patched"]["tree_sha256"]
    first = run(tmp_path, {}, tree, model)
    assert [s["step"] for s in first["steps"]] == ["byte_compile", "convert", "version", "fast_paths"]
    assert first["steps"][0]["argv"] == ["python", "-m", "compileall", "-q", "engine"]
    assert first["steps"][1]["argv"][-2] == "m.gguf"  # file names only: the paths are private
    assert first["native_version"] == "fake-engine 0.1.0-fake" and all(s["exit_code"] == 0 for s in first["steps"][:3])
    # the fake engine, like an engine from before the fast-paths check, has none: unjudged, and said
    assert first["fast_paths"] is None and first["steps"][3]["exit_code"] != 0
    assert "no fast-paths check in this tree" in (tmp_path / "b.log").read_text()
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
    assert [s["step"] for s in again["steps"]] == ["byte_compile", "version", "fast_paths"]
    assert again["conversion"]["cached"]
    # no partial folder left behind (the key's lock file stays: taking turns needs it to exist)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([key, f".{key}.lock"])


def test_embedded_named_model_is_not_converted_and_its_name_is_the_argument(tmp_path):
    body = run(tmp_path, {}, exported(tmp_path), {"name": "tiny", "kind": "named", "path": None})
    assert [s["step"] for s in body["steps"]] == ["byte_compile", "version", "fast_paths"]
    assert body["conversion"] is None and body["model"]["arg"] == "tiny"


def test_the_fast_paths_check_is_recorded_as_the_engine_prints_it(tmp_path):
    """The embedded profile's check (python -m engine fastpaths) prints each fast path against the
    arm's code; the build records it as printed (here a stand-in that prints one differing class)."""
    check = {"fused_decode": {"matches": False, "differs": ["FeedForward"], "error": None, "objects": ["FeedForward"]},
             "native_kv": {"matches": True, "differs": [], "error": None, "objects": ["KVCache"]}}
    tree = exported(tmp_path)
    emb = load_profile("embedded").build_recipe({}, src=tree)
    assert emb.fast_paths == (sys.executable, "-m", "engine", "fastpaths")
    recipe = replace(emb, fast_paths=(sys.executable, "-c", f"import json; print(json.dumps({check!r}))"))
    body = run(tmp_path, {}, tree, {"name": "tiny", "kind": "named", "path": None}, recipe=recipe)
    assert body["fast_paths"] == check and body["steps"][-1]["step"] == "fast_paths"
    # a check that prints something else is no check: unjudged
    recipe = replace(emb, fast_paths=(sys.executable, "-c", "print('{\"fused_decode\": 1}')"))
    assert run(tmp_path, {}, tree, {"name": "tiny", "kind": "named", "path": None}, recipe=recipe,
               log="c.log")["fast_paths"] is None
    assert load_profile("llama-server").build_recipe({}, src=tree).fast_paths is None


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


def test_a_build_that_changes_the_source_it_builds_fails_naming_the_file(tmp_path):
    tree = tmp_path / "src" / "cand"
    (tree / "util").mkdir(parents=True)
    (tree / "kv.c").write_text("int kv_bits = 16;\n")
    (tree / "util" / "a.c").write_text("int a;\n")
    source = source_of(tree)
    arm = {"engine": "llama-server", "build": ["{python}", "-c", "open('kv.c', 'a').write('int sneaky;')"]}
    with pytest.raises(BuildError, match=r"^arm cand: the build changed the source it builds \(kv\.c in .*cand\); a "
                                         r"build may add files to its tree, never change the exported ones; see .*b\.log$"):
        run(tmp_path, arm, tree, gguf(tmp_path), source=source)


def test_what_a_build_added_is_named_by_its_topmost_new_folder_or_by_itself(tmp_path):
    source = ["top.txt", "vllm/__init__.py", "vllm/ops/a.py"]
    added = [".venv/bin/python", ".venv/lib/python3.11/site-packages/x.py", "vllm/_C.abi3.so", "vllm/ops/gen/b.py",
             "build/CMakeFiles/x.o", "vllm.egg-info/PKG-INFO", "vllm/__pycache__/x.cpython-311.pyc"]
    for rel in source + added:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert build_outputs(tmp_path, source) == [".venv", "build", "vllm.egg-info", "vllm/_C.abi3.so", "vllm/ops/gen"]
    assert sorted(manifest(tmp_path, build_outputs(tmp_path, source))) == source


# --- the conversion cache under concurrent builds ----------------------------------------------------

SLOW_CONVERT = (
    "import sys, time, pathlib\n"
    "gguf, out = sys.argv[1], pathlib.Path(sys.argv[2])\n"
    "with open(pathlib.Path(gguf).parent / 'conversions.txt', 'a') as fh:\n"
    "    fh.write(out.name + '\\n')\n"
    "(out / 'part1').write_text('1')\n"
    "time.sleep(SLEEP_S)\n"
    "(out / 'config.json').write_text('{}')\n"
)


def _convert_args(tmp_path, sleep_s: float):
    from pairbench.arms import build

    tree = exported(tmp_path)
    model = Path(gguf(tmp_path)["path"])
    # a converter taking (gguf, out) last, as the engine's does, that writes its output in two parts
    argv = [sys.executable, "-c", SLOW_CONVERT.replace("SLEEP_S", repr(sleep_s))]
    return build, tree, model, argv


def test_two_builds_of_one_key_convert_once_and_neither_removes_the_others_folder(tmp_path):
    """Issue 38: the cache's rmtree raced a concurrent build of the same key (one build could delete
    the folder the other had just finished, or fail renaming onto it). Two builds at once: the
    converter runs once, both get the same complete folder, one of them as cached."""
    import threading

    build, tree, model, argv = _convert_args(tmp_path, 1.0)
    source = source_of(tree)
    results, errors = [], []

    def one(i):
        try:
            results.append(build._convert("cand", argv, model, source, arm_dir=tree, cache_dir=tmp_path / "cache",
                                          log=tmp_path / f"b{i}.log", timeout_s=60, root=tmp_path))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sorted(r[0]["cached"] for r in results) == [False, True]
    assert (model.parent / "conversions.txt").read_text().count("\n") == 1  # converted once
    key = results[0][0]["key"]
    out = tmp_path / "cache" / key
    assert sorted(p.name for p in out.iterdir()) == [".complete", "config.json", "part1"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([key, f".{key}.lock"])


def test_a_crashed_conversions_leftover_is_replaced_and_a_failed_one_leaves_nothing(tmp_path):
    build, tree, model, argv = _convert_args(tmp_path, 0.0)
    source = source_of(tree)
    key = conversion_key(source["patched"]["tree_sha256"], hashlib.sha256(b"GGUF fake weights").hexdigest())
    leftover = tmp_path / "cache" / key
    leftover.mkdir(parents=True)
    (leftover / "part1").write_text("half")  # no .complete: a conversion that died
    rec, step = build._convert("cand", argv, model, source, arm_dir=tree, cache_dir=tmp_path / "cache",
                               log=tmp_path / "b.log", timeout_s=60, root=tmp_path)
    assert rec["cached"] is False and step["exit_code"] == 0
    assert sorted(p.name for p in leftover.iterdir()) == [".complete", "config.json", "part1"]
    assert (leftover / "part1").read_text() == "1"
    other = tmp_path / "other"
    other.mkdir()
    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]
    src2 = {**source, "patched": {**source["patched"], "tree_sha256": "f" * 64}}
    with pytest.raises(BuildError, match="convert"):
        build._convert("cand", failing, model, src2, arm_dir=tree, cache_dir=other, log=tmp_path / "b2.log",
                       timeout_s=60, root=tmp_path)
    assert [p.name for p in other.iterdir() if not p.name.endswith(".lock")] == []
