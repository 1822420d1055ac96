"""Arm-level config for real engines (engine, source {git, tag} | null, threads, allow_external) and
the git-tag export + patch path through pairbench.arms.source."""

from pathlib import Path

import jsonschema
import pytest
import yaml

from pairbench.core import config as pb_config
from pairbench.core.configschema import format_schema_error
from pairbench.arms.source import PatchError, export_source
from pairbench.engines.policy import check_engines

from .test_gitsource import git

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def cfg(**arms):
    return {"label": "t", "model": "smollm2-135m", "arms": arms, "lengths": [160], "output_tokens": 8,
            "rounds": 2, "seed": 0}


def schema_errors(c):
    return [format_schema_error(e) for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(c)]


def test_schema_accepts_engine_arms_and_rejects_half_a_git_source():
    ok = cfg(a={"engine": "llama-server", "source": {"git": "https://example.invalid/x.git", "tag": "b1"},
                "threads": 2, "build": ["make"], "launch": ["x", "{port}"]},
             b={"engine": "llama-cpp-python", "source": None}, c={"source": {"path": "engine"}})
    assert schema_errors({**ok, "allow_external": "true"}) == []
    assert schema_errors(cfg(a={"source": {"git": "x"}}, b={}))  # no tag
    assert any("allow_external" in e for e in schema_errors({**ok, "allow_external": "yes"}))


def test_normalized_defaults_for_engines():
    c = pb_config.normalized({**cfg(a={"engine": "vllm"}, b={"source": {"path": "engine"}}), "allow_external": "true"})
    assert c["arms"]["a"]["source"] is None and c["arms"]["a"]["threads"] is None
    assert c["arms"]["b"]["source"] == "engine" and c["arms"]["b"]["engine"] == "embedded"
    assert c["allow_external"] is True
    assert pb_config.normalized(cfg(a={}, b={}))["allow_external"] is False


def test_check_config_names_the_culprit(smollm2_gguf):
    # the engine's profile is the engines layer's to check (core/ knows no profile); common.smk runs both
    with pytest.raises(pb_config.ConfigError, match=r"arms\.b\.engine: .*no profile 'tgi'"):
        check_engines(cfg(a={}, b={"engine": "tgi"}))
    check_engines(cfg(a={}, b={"engine": "vllm"}))
    with pytest.raises(pb_config.ConfigError, match=r"arms\.b\.patches: engine vllm has no source to patch"):
        pb_config.check_config(cfg(a={}, b={"engine": "vllm", "patches": ["p.patch"]}), REPO)
    # which engine reads which model is its profile's to say (model_formats): checked with the engines
    tiny = {**cfg(a={"engine": "llama-cpp-python"}, b={"engine": "llama-cpp-python"}), "model": "tiny", "lengths": [400]}
    pb_config.check_config(tiny, REPO)
    with pytest.raises(pb_config.ConfigError, match=r"^model: 'tiny' is a named built-in model, but arm a's engine "
                                                    r"llama-cpp-python reads a GGUF file only \(model_formats in "
                                                    r"config/engines/llama-cpp-python\.yaml\)$"):
        check_engines(tiny)
    pb_config.check_config(cfg(a={"engine": "llama-cpp-python", "threads": 1},
                               b={"engine": "llama-cpp-python", "threads": 2}), REPO)


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "llama"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "src").mkdir()
    (repo / "src" / "kv.c").write_text("int kv_bits = 16;\nint other = 0;\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "tag", "b100")
    (repo / "src" / "kv.c").write_text("int kv_bits = 16;\nint other = 1;\n")
    git(repo, "commit", "-q", "-am", "later")
    return repo


def write_patch(root: Path, name: str, old: str, new: str) -> str:
    (root / name).write_text(f"--- a/src/kv.c\n+++ b/src/kv.c\n@@ -1,2 +1,2 @@\n-{old}\n+{new}\n int other = 0;\n")
    return name


def test_git_source_exported_at_tag_then_patched(upstream, tmp_path):
    patch = write_patch(tmp_path, "kv8.patch", "int kv_bits = 16;", "int kv_bits = 8;")
    body = export_source("candidate", {"git": str(upstream), "tag": "b100"}, [patch], tmp_path / "src" / "candidate",
                         tmp_path, plan_sha256="0" * 64)
    assert (tmp_path / "src" / "candidate" / "src" / "kv.c").read_text() == "int kv_bits = 8;\nint other = 0;\n"
    assert body["git"]["commit"] == git(upstream, "rev-parse", "b100") and body["version"] == "b100"
    assert body["patched"]["changed"] == ["src/kv.c"] and body["source"] == {"git": str(upstream), "tag": "b100"}
    assert git(upstream, "status", "--porcelain") == ""  # the user's checkout untouched


def test_git_source_under_home_is_written_with_a_tilde(upstream, tmp_path, monkeypatch):
    # config/llama-cpp.yaml names ~/.cache/pairbench/llama.cpp; the tilde is the user's home, not a
    # folder called "~" under the checkout
    monkeypatch.setenv("HOME", str(upstream.parent))
    body = export_source("a", {"git": "~/llama", "tag": "b100"}, [], tmp_path / "checkout" / "src" / "a",
                         tmp_path / "checkout", plan_sha256="0" * 64)
    assert body["git"]["commit"] == git(upstream, "rev-parse", "b100") and body["source"]["git"] == "~/llama"


def test_git_source_patch_that_does_not_apply_names_hunk(upstream, tmp_path):
    patch = write_patch(tmp_path, "stale.patch", "int kv_bits = 32;", "int kv_bits = 8;")
    with pytest.raises(PatchError, match=r"patches\[0\]: patch stale.patch does not apply: first failure at src/kv.c"):
        export_source("candidate", {"git": str(upstream), "tag": "b100"}, [patch], tmp_path / "src" / "c",
                      tmp_path, plan_sha256="0" * 64)


def test_installed_engine_has_an_empty_tree(tmp_path):
    body = export_source("a", None, [], tmp_path / "src" / "a", tmp_path, plan_sha256="0" * 64)
    assert body["source"] is None and body["version"] == "installed" and body["pristine"]["files"] == 0


def test_engine_options_fused_decode_takes_auto_on_off_and_names_the_key_otherwise():
    assert schema_errors(cfg(a={"engine_options": {"fused_decode": "off"}}, b={"engine_options": {}})) == []
    assert schema_errors(cfg(a={"engine_options": {"fused_decode": False}}, b={})) == []  # YAML's bare off
    errors = schema_errors(cfg(a={"engine_options": {"fused_decode": "fast"}}, b={}))
    assert errors and errors[0].startswith("config key 'arms.a.engine_options.fused_decode'") and "'fast'" in errors[0]
    assert schema_errors(cfg(a={"engine_options": {"fused": "on"}}, b={}))  # an unknown option
    c = pb_config.normalized(cfg(a={"engine_options": {"fused_decode": False}}, b={"engine_options": {"fused_decode": True}},
                                 c={}))
    assert [c["arms"][n]["engine_options"]["fused_decode"] for n in "abc"] == ["off", "on", "auto"]


def test_engine_options_on_an_engine_without_fast_paths_names_the_key():
    with pytest.raises(pb_config.ConfigError, match=r"arms\.b\.engine_options\.fused_decode: engine llama-server "
                                                    r"has no native fast paths.*fused_decode off"):
        check_engines({**cfg(a={}, b={"engine": "llama-server", "engine_options": {"fused_decode": False}}),
                       "model": None})
    check_engines({**cfg(a={"engine_options": {"fused_decode": "on"}}, b={"engine": "llama-server"}), "model": None})
