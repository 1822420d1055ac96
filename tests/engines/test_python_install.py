"""Every arm runs the source it claims: a Python engine's arm is installed from its own exported,
patched tree into a virtual environment of its own, and its server runs from there.

The engine is real and pip-installable: the fake OpenAI-compatible server as a package
(tests/fakes/fake_serve), at a git tag, with tests/engines/profiles/fake-serve.yaml as its profile
(an editable install, offline: ``--no-deps --no-build-isolation --no-index``). The candidate's patch
makes it version 1.1.0, answering ``b + a`` at 25 ms a token. The last test runs the whole pipeline.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pairbench.arms.build import BuildError, build_arm
from pairbench.arms.source import export_source
from pairbench.core.artifacts import read_artifact, validate
from pairbench.core.config import ConfigError
from pairbench.engines import profiles
from pairbench.engines.adapter import for_arm
from pairbench.engines.policy import check_engines
from pairbench.engines.profiles import load_profile
from pairbench.publish.verify import verify_bundle

from .conftest import free_port
from .fake_serve_support import PATCH, PROFILES, TAG, make_repo
from .hf_model import make_tiny_hf
from .pipeline_support import copy_checkout, snakemake

SHIPPED = Path(profiles.__file__).resolve().parents[3] / "config" / "engines"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Both arms exported from one repository at tag v1.0.0 (the candidate patched) and built by the
    fake-serve profile: ``(root, {arm: build body})``."""
    root = tmp_path_factory.mktemp("root")
    make_repo(root / "repo")
    shutil.copy(PATCH, root / "slower.patch")
    make_tiny_hf(root / "tiny-hf")
    profile = load_profile("fake-serve", root=PROFILES)
    bodies = {}
    for arm, patches in (("baseline", []), ("candidate", ["slower.patch"])):
        bodies[arm] = build(root, profile, arm, patches)
    return root, bodies


def build(root: Path, profile, arm: str, patches: list[str]) -> dict:
    tree = root / "src" / arm
    source = export_source(arm, {"git": "repo", "tag": TAG}, patches, tree, root, plan_sha256="0" * 64)
    recipe = profile.build_recipe({"source": {"git": "repo", "tag": TAG}}, src=tree, commit=source["git"]["commit"],
                                  tag=source["git"]["tag"])
    body = build_arm(arm, tree, recipe, source=source, model={"name": "tiny-hf", "kind": "hf",
                                                               "path": str(root / "tiny-hf")},
                     cache_dir=root / "cache", log=root / f"{arm}.log", source_sha256="b" * 64, root=root)
    validate("build", {"schema": "pairbench.build/v3", **body})
    return {**body, "source": source}


def test_each_arm_is_installed_from_its_own_tree_into_its_own_environment(built):
    root, bodies = built
    base, cand = bodies["baseline"], bodies["candidate"]
    assert [s["step"] for s in cand["steps"]] == ["venv", "install", "environment", "version"]
    assert cand["steps"][0]["argv"] == ["python", "-m", "venv", "--clear", "--system-site-packages", "--without-pip",
                                        ".venv"]
    for arm, body, version in (("baseline", base, "1.0.0"), ("candidate", cand, "1.1.0")):
        env = body["environment"]
        assert env == {"kind": "venv", "path": f"src/{arm}/.venv", "python": f"src/{arm}/.venv/bin/python",
                       "python_version": sys.version.split()[0], "system_site_packages": True,
                       "package": "pairbench-fake-serve", "version": version, "module": "fake_serve",
                       "imports_from": "tree", "module_path": "fake_serve/__init__.py",
                       "tree_sha256": body["source"]["patched"]["tree_sha256"]}
        assert body["native_version"] == f"fake-serve {version}"  # the profile's version command, in the env
        assert body["tree_outputs"] == [".venv"]  # an editable install leaves the tree as exported
        assert body["model"] == {"name": "tiny-hf", "kind": "hf", "arg": "tiny-hf"}
    # the tag, not the later commit (9.9.9); and the candidate's tree is the patched one
    assert base["environment"]["tree_sha256"] == base["source"]["pristine"]["tree_sha256"]
    assert cand["environment"]["tree_sha256"] != base["environment"]["tree_sha256"]
    assert cand["source"]["patched"]["changed"] == ["fake_serve/__init__.py", "fake_serve/openai_compat.py",
                                                    "pyproject.toml"]


def test_the_arm_is_served_from_its_environment(built, launch, monkeypatch, tmp_path):
    root, bodies = built
    engines = tmp_path / "engines"
    shutil.copytree(SHIPPED, engines)
    shutil.copy(PROFILES / "fake-serve.yaml", engines)
    monkeypatch.setattr(profiles, "PROFILE_DIR", engines)
    arm_cfg = {"engine": "fake-serve", "source": {"git": "repo", "tag": TAG}}
    plan = {"arms": {"candidate": arm_cfg}, "max_context": 600, "allow_external": True}
    engine = for_arm(arm_cfg, build=bodies["candidate"], plan=plan, arm_dir=root / "src" / "candidate",
                     server_cfg={"threads": None}, root=root)
    spec = engine.launch(free_port())
    venv = root / "src" / "candidate" / ".venv"
    assert spec.argv[0] == str(venv / "bin" / "fake-serve")
    # as if activated: a bare program name in an arm's launch override finds the arm's install first
    assert spec.env["PATH"].split(os.pathsep)[0] == str(venv / "bin") and spec.env["VIRTUAL_ENV"] == str(venv)
    assert spec.public()["argv"][:3] == ["fake-serve", "--flavor", "vllm"]
    srv = launch(spec)
    assert srv.http.get(spec.url + "/version").json() == {"version": "1.1.0"}
    pieces, _ = srv.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 19,
                                                    "ignore_eos": True, "stream": True})
    assert "".join(pieces) == "def add(a, b):\n    return b + a\n"[:19]


def test_a_copy_that_shadows_the_installed_tree_fails_the_build(built, monkeypatch, tmp_path):
    """An editable install's import hook comes after every path entry: a fake_serve on PYTHONPATH (or
    installed beside pairbench) would be served instead, and both arms would run it."""
    root, _ = built
    shadow = tmp_path / "shadow" / "fake_serve"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('__version__ = "0.0.1"\n')
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    with pytest.raises(BuildError, match=r"^arm shadowed: its environment imports 'fake_serve' from "
                                         rf"{shadow}/__init__\.py, not from the arm's tree or environment: another "
                                         r"copy shadows the installed one .*; see .*shadowed\.log$"):
        build(root, load_profile("fake-serve", root=PROFILES), "shadowed", [])


@pytest.fixture
def preinstalled(monkeypatch, tmp_path):
    """The shipped profiles plus fake-serve and fake-serve-preinstalled (fake-serve without an
    install: it runs the fake-serve installed beside pairbench, as vllm.yaml did before)."""
    engines = tmp_path / "engines"
    shutil.copytree(SHIPPED, engines)
    shutil.copy(PROFILES / "fake-serve.yaml", engines)
    data = yaml.safe_load((PROFILES / "fake-serve.yaml").read_text())
    data["name"] = "fake-serve-preinstalled"
    del data["build"]["install"]
    (engines / "fake-serve-preinstalled.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(profiles, "PROFILE_DIR", engines)
    make_tiny_hf(tmp_path / "tiny-hf")
    return tmp_path


def config(**arms) -> dict:
    return {"label": "t", "model": "tiny-hf", "arms": arms, "lengths": [300], "output_tokens": 8, "rounds": 2}


def test_a_source_or_patches_the_engine_would_never_run_are_refused(preinstalled):
    git = {"git": "repo", "tag": TAG}
    engines = preinstalled / "engines"
    with pytest.raises(ConfigError, match=r"^arms\.candidate\.patches: engine fake-serve-preinstalled installs no "
                                          rf"source: its profile \({engines}/fake-serve-preinstalled\.yaml\) has no "
                                          r"build\.install, and its server runs an installed program, not the arm's "
                                          r"tree, so its patches would never run"):
        check_engines(config(baseline={"engine": "fake-serve-preinstalled"},
                             candidate={"engine": "fake-serve-preinstalled", "source": git, "patches": ["p.patch"]}),
                      preinstalled)
    with pytest.raises(ConfigError, match=r"^arms\.baseline\.source: engine fake-serve-preinstalled installs no "
                                          r"source: .* so tag v1\.0\.0 would never run"):
        check_engines(config(baseline={"engine": "fake-serve-preinstalled", "source": git},
                             candidate={"engine": "fake-serve-preinstalled"}), preinstalled)
    with pytest.raises(ConfigError, match=r"^arms\.candidate\.source: .* so its source would never run"):
        check_engines(config(baseline={"engine": "fake-serve-preinstalled"},
                             candidate={"engine": "fake-serve-preinstalled", "source": {"path": "engine"}}),
                      preinstalled)
    with pytest.raises(ConfigError, match=r"^arms\.candidate\.source: engine fake-serve installs its arm from a "
                                          r"git tag .* Commit the tree and name the tag"):
        check_engines(config(baseline={"engine": "fake-serve", "source": git},
                             candidate={"engine": "fake-serve", "source": {"path": "engine"}}), preinstalled)
    # arms of the installed engine that differ in settings only; and arms the profile installs
    check_engines(config(baseline={"engine": "fake-serve-preinstalled", "threads": 1},
                         candidate={"engine": "fake-serve-preinstalled", "threads": 2}), preinstalled)
    check_engines(config(baseline={"engine": "fake-serve", "source": git},
                         candidate={"engine": "fake-serve", "source": git, "patches": ["p.patch"]}), preinstalled)
    for engine in ("vllm", "sglang"):  # the shipped Python engines install their arms' trees
        check_engines(config(a={"engine": engine, "source": git}, b={"engine": engine, "source": git,
                                                                    "patches": ["p.patch"]}), preinstalled)


@pytest.mark.slow
def test_the_patched_candidate_serves_its_patch_through_the_whole_pipeline(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    shutil.copy(PROFILES / "fake-serve.yaml", checkout / "config" / "engines")
    make_repo(checkout / "fake-serve-repo")
    make_tiny_hf(checkout / "tiny-hf")
    cfg = "tests/engines/fake_serve.yaml"
    run = snakemake(checkout, "--configfile", cfg)
    assert run.returncode == 0, run.stderr[-3000:]
    res = checkout / "results" / "fake-serve"
    plan = read_artifact(res / "plan.json", "plan")
    assert plan["model"] == {"name": "tiny-hf", "kind": "hf"}
    builds = {a: read_artifact(res / "build" / f"{a}.json", "build") for a in ("baseline", "candidate")}
    for arm, version in (("baseline", "1.0.0"), ("candidate", "1.1.0")):
        env = builds[arm]["environment"]
        assert env["python"] == f"results/fake-serve/src/{arm}/.venv/bin/python" and env["version"] == version
        assert env["imports_from"] == "tree" and env["tree_sha256"] == builds[arm]["patched_tree_sha256"]
        assert builds[arm]["native_version"] == f"fake-serve {version}"
        assert builds[arm]["model"] == {"name": "tiny-hf", "kind": "hf", "arg": "tiny-hf"}
    assert builds["baseline"]["patched_tree_sha256"] != builds["candidate"]["patched_tree_sha256"]
    # the fixtures were counted with the model directory's tokenizer.json: no server tokenized them
    fixture = read_artifact(res / "fixtures" / f"{plan['conditions'][0]['id']}.json", "fixture")
    assert fixture["checked_by"] == ["baseline", "candidate"]
    server_logs = "".join(p.read_text() for p in (res / "private" / "logs").rglob("*.log"))
    assert "POST /v1/chat/completions" in server_logs and "/tokenize" not in server_logs
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        version = "1.1.0" if v["arm"] == "candidate" else "1.0.0"
        assert m["native_version"] == f"fake-serve {version}" and m["server"]["argv"][0] == "fake-serve"
        for rec in m["records"]:
            # every reply's prompt count equals the directory tokenizer's: the gate checks it
            assert rec["ok"] and rec["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
            if v["arm"] == "candidate":  # 25 ms a token at least: at most 40 tokens a second
                assert rec["decode_tok_s"] <= 40
        out = json.loads((res / "private" / "outputs" / f"{v['id']}-{plan['conditions'][0]['id']}.json").read_text())
        assert out["text"] == "def add(a, b):\n    return " + ("a + b\n" if v["arm"] == "baseline" else "b + a\n")
    audit = json.loads((res / "audit.json").read_text())
    assert audit["ok"] is True, audit
    assert verify_bundle(res / "publish") == []
    report = (res / "publish" / "README.md").read_text()
    assert "| `candidate` | `pairbench-fake-serve` 1.1.0 | Python " in report  # the report's build section
    # a source the engine would never run is refused before anything runs
    data = yaml.safe_load((PROFILES / "fake-serve.yaml").read_text())
    data["name"] = "fake-serve-preinstalled"
    del data["build"]["install"]
    (checkout / "config" / "engines" / "fake-serve-preinstalled.yaml").write_text(yaml.safe_dump(data))
    refused = snakemake(checkout, "-n", "--configfile", cfg, "--config", "label=refused")
    assert refused.returncode == 0  # the same config with the installing profile is fine
    text = (checkout / cfg).read_text().replace("engine: fake-serve", "engine: fake-serve-preinstalled")
    (checkout / "refused.yaml").write_text(text)
    refused = snakemake(checkout, "-n", "--configfile", "refused.yaml")
    assert refused.returncode != 0
    assert ("arms.baseline.source: engine fake-serve-preinstalled installs no source" in refused.stdout + refused.stderr)
    assert not (checkout / "results" / "refused").exists()
