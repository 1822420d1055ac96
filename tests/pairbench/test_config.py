"""Config checks: the schema (as snakemake.utils.validate applies it) and what the schema cannot say."""

import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from pairbench.core import config as pb_config
from pairbench.core import configschema, ggufheader, models

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())


def base_config(**over):
    cfg = {"label": "t", "model": "tiny", "arms": {"baseline": {"patches": []}, "candidate": {"patches": []}},
           "lengths": [400, 480], "output_tokens": 8, "rounds": 2, "seed": 0}
    cfg.update(over)
    return cfg


def schema_message(cfg):
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    return configschema.format_schema_error(errors[0]) if errors else None


def test_every_schema_key_has_description_and_default():
    def walk(node, path):
        for key, sub in (node.get("properties") or {}).items():
            assert "description" in sub, f"{path}{key} has no description"
            assert "default" in sub, f"{path}{key} has no default"
            walk(sub, f"{path}{key}.")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}<name>.")

    walk(SCHEMA, "")


def test_default_config_is_schema_valid():
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert schema_message(cfg) is None


@pytest.mark.parametrize("cfg, key", [
    (base_config(rounds=0), "rounds"),
    (base_config(rounds="six"), "rounds"),
    (base_config(lengths=[400, "x"]), "lengths.1"),
    (base_config(colour="blue"), "colour"),
    (base_config(arms={"baseline": {"patchez": []}, "candidate": {}}), "arms.baseline.patchez"),
    (base_config(server={"threads": 0}), "server.threads"),
    (base_config(server={"pin": "sometimes"}), "server.pin"),
    (base_config(rounds={"min": 6, "max": 12}), "rounds"),
    (base_config(repeats=0), "repeats"),
    (base_config(stats={"metrics": ["decode_tok_s", "decode_tok_s"]}), "stats.metrics"),
    (base_config(stats={"multiplicity": "sidak"}), "stats.multiplicity"),
    (base_config(gates={"allow_unproven_cold_cache": "yes"}), "gates.allow_unproven_cold_cache"),
])
def test_schema_errors_name_the_key(cfg, key):
    msg = schema_message(cfg)
    assert msg is not None and msg.startswith(f"config key '{key}'"), msg


@pytest.mark.parametrize("over, match", [
    (dict(stats={"metrics": ["prefill_tok_s", "ttft_ms"]}),
     r"^stats\.metrics: prefill_tok_s and ttft_ms answer the same question \(prefill\)"),
    (dict(stats={"metrics": ["decode_tok_s"], "secondary": ["decode_tok_s"]}),
     r"^stats\.secondary: decode_tok_s is already a primary metric"),
    (dict(rounds={"min": 8, "max": 6, "target_halfwidth": 0.02}), r"^rounds\.max: 6 is less than rounds\.min \(8\)"),
    (dict(rounds={"min": 7, "max": 12, "target_halfwidth": 0.02}),
     r"^rounds\.min: 7 is not a multiple of 2, the counterbalanced block of order 'abba' with 2 arms"),
    # three arms under williams: a block is 2 x 3 rounds, so 9 (a multiple of the arms) is not whole
    (dict(arms={"a": {}, "b": {}, "c": {}}, order="williams", rounds={"min": 6, "max": 9, "target_halfwidth": 0.02}),
     r"^rounds\.max: 9 is not a multiple of 6, the counterbalanced block of order 'williams' with 3 arms"),
    (dict(rounds=6, stats={"trim": 3}), r"^stats\.trim: trimming 3 from each end leaves nothing of 6 rounds"),
])
def test_config_errors_a_schema_cannot_express_name_the_key(over, match):
    cfg = base_config(**over)
    cfg["stats"] = {**pb_config.STATS_DEFAULTS, **cfg.get("stats", {})}
    with pytest.raises(pb_config.ConfigError, match=match):
        pb_config.check_config(cfg, REPO)


def test_adaptive_rounds_plan_every_visit_up_to_max():
    from pairbench.core import plan as pb_plan

    cfg = base_config(rounds={"min": 4, "max": 8, "target_halfwidth": 0.03}, repeats=3)
    assert pb_plan.adaptive(cfg) == {"min": 4, "max": 8, "block": 2, "target_halfwidth": 0.03, "max_minutes": None}
    budget = {**cfg, "rounds": {**cfg["rounds"], "max_minutes": 7.5}}
    assert pb_plan.adaptive(budget)["max_minutes"] == 7.5
    visits = pb_plan.visits(cfg)
    assert len(visits) == 16 and visits[-1]["id"] == "r08-baseline"  # abba: even rounds are candidate first
    body = pb_plan.make_plan(cfg, REPO)
    assert (body["rounds"], body["repeats"]) == (8, 3)
    assert {c: len(by_round) for c, by_round in body["salts"].items()} == {"in400-out8": 8, "in480-out8": 8}
    assert pb_plan.adaptive(base_config()) is None and pb_plan.make_plan(base_config(), REPO)["adaptive"] is None
    # the stopping rule's inputs are not part of the plan: changing the target re-plans, stats do not
    assert pb_plan.config_sha256(cfg) != pb_plan.config_sha256({**cfg, "rounds": {**cfg["rounds"], "min": 6}})
    assert pb_plan.config_sha256(cfg) == pb_plan.config_sha256({**cfg, "stats": {"noise": 0.05},
                                                                 "gates": {"allow_unproven_cold_cache": True}})


def test_fewer_than_two_arms():
    with pytest.raises(pb_config.ConfigError, match=r"^arms: .*at least two arms, got 1"):
        pb_config.check_config(base_config(arms={"baseline": {}}), REPO)


def test_missing_patch_names_the_key_and_file():
    cfg = base_config(arms={"baseline": {}, "candidate": {"patches": ["config/patches/nope.patch"]}})
    with pytest.raises(pb_config.ConfigError, match=r"^arms\.candidate\.patches\[0\]: .*nope\.patch does not exist"):
        pb_config.check_config(cfg, REPO)


def test_length_above_the_model_context():
    with pytest.raises(pb_config.ConfigError, match=r"^lengths\[1\]: 9000 input .* exceed the context of model 'tiny' \(8192\)"):
        pb_config.check_config(base_config(lengths=[400, 9000]), REPO)
    pb_config.check_config(base_config(lengths=[400, 8192 - 8 - 16]), REPO)  # the longest that fits


def test_the_named_model_s_context_is_the_engine_s():
    # one table of named contexts in pairbench (core/models.py), checked against the model itself
    from engine.weights import NAMED_MODELS

    assert models.NAMED_CONTEXT["tiny"] == NAMED_MODELS["tiny"].context_length == 8192


def test_unknown_model_and_baseline_names():
    with pytest.raises(pb_config.ConfigError, match=r"^model: 'gpt-9'"):
        pb_config.check_config(base_config(model="gpt-9"), REPO)
    with pytest.raises(pb_config.ConfigError, match=r"^baseline: 'other'"):
        pb_config.check_config(base_config(baseline="other"), REPO)


def test_gguf_context_read_from_metadata(smollm2_gguf):
    assert models.model_context("smollm2-135m", REPO) == 8192


def test_normalized_fills_arm_defaults():
    cfg = pb_config.normalized(base_config(arms={"a": {}, "b": {"patches": ["p"]}}))
    assert cfg["arms"]["a"] == {"source": "engine", "patches": [], "args": [], "env": {}, "engine": "embedded",
                                "threads": None, "build": None, "launch": None, "engine_options": {"fused_decode": "auto"}}
    assert cfg["arms"]["b"]["patches"] == ["p"]
    assert pb_config.baseline_arm(cfg) == "a" and pb_config.candidate_arms(cfg) == ["b"]


def test_gguf_header_reader_matches_the_gguf_package(smollm2_gguf):
    from gguf import GGUFReader

    meta = ggufheader.metadata(smollm2_gguf)
    reader = GGUFReader(str(smollm2_gguf))
    for key in ("general.architecture", "llama.context_length", "llama.embedding_length", "llama.block_count"):
        field = reader.fields[key]
        value = field.parts[field.data[0]]
        expected = bytes(value).decode() if key == "general.architecture" else int(value[0])
        assert meta[key] == expected, key


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 20)
    with pytest.raises(pb_config.ConfigError, match=r"^model: .* is not a GGUF file"):
        models.gguf_context(bad)


THREE = {"a": {}, "b": {}, "c": {}}


@pytest.mark.parametrize("over, match", [
    (dict(candidate="b", candidates=["b", "c"]), r"^candidates: give either candidates \(a list\) or candidate"),
    (dict(candidates=["b", "z"]), r"^candidates\[1\]: 'z' is not one of the arms \(a, b, c\)"),
    (dict(candidates=["c", "c"]), r"^candidates\[1\]: 'c' is listed twice"),
    (dict(candidates=["b", "a"]), r"^candidates\[1\]: 'a' is the baseline"),
    (dict(baseline="b", candidates=["b"]), r"^candidates\[0\]: 'b' is the baseline"),
    (dict(candidate="a"), r"^candidate: 'a' is the baseline"),
    (dict(candidate="q"), r"^candidate: 'q' is not one of the arms"),
])
def test_candidate_errors_name_the_key(over, match):
    with pytest.raises(pb_config.ConfigError, match=match):
        pb_config.check_config(base_config(arms=THREE, **over), REPO)


@pytest.mark.parametrize("over, want", [
    ({}, ["b", "c"]),                               # every arm but the baseline, config order
    ({"baseline": "b"}, ["a", "c"]),
    ({"candidates": ["c", "b"]}, ["c", "b"]),       # the listed order is the tables' order
    ({"candidate": "c"}, ["c"]),                    # the one-element shorthand
])
def test_candidates_default_and_shorthand(over, want):
    cfg = pb_config.normalized(base_config(arms=THREE, **over))
    pb_config.check_config(cfg, REPO)
    assert pb_config.candidate_arms(cfg) == want


def test_an_empty_candidates_list_is_a_schema_error():
    assert schema_message(base_config(arms=THREE, candidates=[])).startswith("config key 'candidates'")


def test_resources_become_the_slurm_executors_resources():
    # a partial `measure` gets measure's defaults (the schema's default map of the section), not a generic job's
    cfg = base_config(resources={"partition": "gpu", "measure": {"cpus": 8}, "gpus": {"candidate": 2}})
    cfg = pb_config.normalized(cfg)
    assert pb_config.job_resources(cfg, "measure", ["baseline", "candidate"]) == {
        "cpus_per_task": 8, "mem_mb": 4096, "runtime": 5, "slurm_partition": "gpu", "gpu": 2}
    assert pb_config.job_resources(cfg, "other", []) == {"cpus_per_task": 1, "mem_mb": 2048, "runtime": 30,
                                                         "slurm_partition": "gpu"}


def test_resource_errors_name_the_key():
    assert schema_message(base_config(resources={"measure": {"cpus": 0}})) == \
        "config key 'resources.measure.cpus': 0 is less than the minimum of 1"
    with pytest.raises(pb_config.ConfigError, match=r"^resources\.gpus\.cand: not one of the arms"):
        pb_config.check_config(base_config(resources={"gpus": {"cand": 1}}), REPO)


def test_two_arms_patches_of_one_file_name_but_other_content_are_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "fix.patch").write_text("one\n")
    (tmp_path / "b" / "fix.patch").write_text("two\n")
    shutil.copytree(REPO / "engine", tmp_path / "engine")
    arms = {"base": {}, "x": {"patches": ["a/fix.patch"]}, "y": {"patches": ["b/fix.patch"]}}
    with pytest.raises(pb_config.ConfigError, match=r"^arms\.y\.patches\[0\]: b/fix\.patch has the file name"):
        pb_config.check_config(base_config(arms=arms), tmp_path)
    (tmp_path / "b" / "fix.patch").write_text("one\n")  # the same patch twice is one file
    pb_config.check_config(base_config(arms=arms), tmp_path)


def test_documented_defaults_are_defaults_and_only_arms_is_required():
    assert SCHEMA["required"] == ["arms"]
    cfg = pb_config.normalized({"arms": {"baseline": {}, "candidate": {"patches": ["config/patches/kv-grow.patch"]}}})
    assert {k: cfg[k] for k in ("label", "model", "lengths", "output_tokens", "rounds", "seed", "allow_external")} == {
        "label": "default", "model": "smollm2-135m", "lengths": [256, 1024], "output_tokens": 64, "rounds": 6,
        "seed": 0, "allow_external": False}
    # every key the schema gives a default has it after normalizing (a load section only in a load run);
    # the arms are never defaulted
    assert set(SCHEMA["properties"]) - set(cfg) == {"load"} and set(cfg["arms"]) == {"baseline", "candidate"}
    assert cfg["server"]["request_timeout_s"] == 300 and cfg["stats"]["alpha"] == 0.05
    assert pb_config.normalized({})["arms"] == {} and pb_config.normalized(cfg) == cfg  # idempotent
    assert schema_message({}) == "config key '<root>': 'arms' is a required property"
    assert [str(e) for e in configschema.schema_errors({})] == [
        "config key 'arms': missing; it has no default (the arms to compare, e.g. arms: {baseline: {}, "
        "candidate: {patches: [my.patch]}})"]


def test_a_minimal_config_plans_and_checks(smollm2_gguf):
    from pairbench.core import plan as pb_plan

    cfg = {"arms": {"baseline": {}, "candidate": {"patches": ["config/patches/kv-grow.patch"]}}}
    pb_config.check_config(cfg, REPO)
    body = pb_plan.make_plan(cfg, REPO)
    assert (body["label"], body["rounds"], [c["id"] for c in body["conditions"]]) == (
        "default", 6, ["in256-out64", "in1024-out64"])


def test_every_problem_is_found_at_once():
    cfg = base_config(arms={"a": {}, "b": {"patches": ["nope.patch", "config/patches/also-nope.patch"]}},
                      lengths=[400, 9000], rounds={"min": 7, "max": 5, "target_halfwidth": 0.02},
                      stats={**pb_config.STATS_DEFAULTS, "metrics": ["prefill_tok_s", "ttft_ms"]},
                      resources={"gpus": {"c": 1}})
    assert [e.key for e in pb_config.config_errors(cfg, REPO)] == [
        ("arms", "b", "patches", 0), ("arms", "b", "patches", 1), ("resources", "gpus", "c"), ("lengths", 1),
        ("stats", "metrics"), ("rounds", "max"), ("rounds", "min"), ("rounds", "max")]
    # a key the schema rejected leaves out the checks that read it, and only those
    assert [e.key for e in pb_config.config_errors(cfg, REPO, skip={"rounds", "lengths"})] == [
        ("arms", "b", "patches", 0), ("arms", "b", "patches", 1), ("resources", "gpus", "c"), ("stats", "metrics")]
    bad = {**base_config(colour="x", zzz=1), "rounds": 0}
    assert [str(e) for e in configschema.schema_errors(bad)][:2] == [
        "config key 'colour': unknown key (allowed: allow_external, arms, baseline, candidate, candidates, cost, crosscheck, "
        "gate, gates, label, lengths, load, model, order, output_tokens, repeats, resources, retries, rounds, seed, server, "
        "stats, validate)",
        "config key 'zzz': unknown key (allowed: allow_external, arms, baseline, candidate, candidates, cost, crosscheck, "
        "gate, gates, label, lengths, load, model, order, output_tokens, repeats, resources, retries, rounds, seed, server, "
        "stats, validate)"]


def schema_keys(node=SCHEMA, path=""):
    """Every key path of the schema: ``arms.<name>.source.git``, ``rounds.min``, ``server.pin``..."""
    out = []
    branches = [node] + [b for b in node.get("oneOf", []) if isinstance(b, dict)]
    for branch in branches:
        for key, sub in (branch.get("properties") or {}).items():
            out.append(f"{path}{key}")
            out += schema_keys(sub, f"{path}{key}.")
    if isinstance(node.get("additionalProperties"), dict):
        out += schema_keys(node["additionalProperties"], f"{path}<name>.")
    return out


def readme_rows():
    text = (REPO / "config/README.md").read_text()
    keys_section = text.split("## Keys", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2] for m in re.finditer(r"^\| `([^`]+)` \| (.*?) \|", keys_section, re.M)}


def test_config_readme_lists_every_schema_key_and_no_other():
    rows = readme_rows()
    keys = schema_keys()
    sections = {k for k in keys if any(other.startswith(k + ".") for other in keys)}
    # a section (server, stats...) is listed through its keys; one whose value is itself a shape
    # (arms, rounds, arms.<name>.source, resources.measure) has a row of its own too
    missing = [k for k in keys if k not in rows and k not in sections - {"arms", "rounds", "arms.<name>.source"}]
    assert missing == []
    assert sorted(set(rows) - set(keys)) == []


def test_config_readme_defaults_are_the_schemas():
    def walk(node, path=""):
        for key, sub in (node.get("properties") or {}).items():
            yield f"{path}{key}", sub
            yield from walk(sub, f"{path}{key}.")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}<name>.")

    rows = readme_rows()
    # the README says what null means where the schema's null stands for a value chosen later
    explained = {"arms", "server.startup_timeout_s"}
    wrong = []
    for key, sub in walk(SCHEMA):
        if key in rows and key not in explained and isinstance(sub.get("default"), (int, float, str, list, type(None))):
            # "`0` (default config: `30`)": the schema's default, then what config/config.yaml sets
            cell = re.sub(r"\s*\(default config: `[^`]*`\)$", "", rows[key].strip())
            if not (cell.startswith("`") and cell.endswith("`")):
                wrong.append(f"{key}: {cell}")
                continue
            if yaml.safe_load(cell.strip("`")) != sub["default"]:
                wrong.append(f"{key}: README {cell}, schema {sub['default']!r}")
    assert wrong == []
