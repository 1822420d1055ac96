"""Where a config key came from (file and line, or --config), YAML syntax errors with their line, and
--config lists and maps read as YAML; then every config problem at once, each at its file and line."""

import textwrap
from pathlib import Path

import pytest

from pairbench.core import configsource as cs
from pairbench.stages import runconfig

REPO = Path(__file__).resolve().parents[2]


def report(files, cli=None) -> list[str]:
    """The lines a user sees for the config *files* and ``--config`` pairs *cli* ([] when it loads)."""
    try:
        runconfig.load_config(files, cli, root=REPO)
    except runconfig.ConfigErrors as exc:
        return str(exc).splitlines()
    return []


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_every_key_and_list_item_has_its_line(tmp_path):
    path = write(tmp_path, "c.yaml", """\
        # a comment
        label: x
        arms:
          baseline: {}
          candidate:
            patches:
              - a.patch
              - b.patch
        lengths: [256, 1024]
        """)
    data, lines = cs.load_with_lines(path)
    assert data["arms"]["candidate"]["patches"] == ["a.patch", "b.patch"]
    assert lines[("label",)] == 2
    assert lines[("arms", "baseline")] == 4
    assert lines[("arms", "candidate", "patches", 1)] == 8
    assert lines[("lengths", 1)] == 9


@pytest.mark.parametrize("text, where, problem", [
    ("label: x\nlengths: [256, 1024\nrounds: 2\n", ":3:7:", "expected ',' or ']', but got ':' (while parsing a flow "
                                                            "sequence opened at line 2, column 10)"),
    ("label: x\narms:\n  a: {}\n\tb: {}\n", ":4:1:", "found character '\\t' that cannot start any token"),
])
def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path, text, where, problem):
    path = write(tmp_path, "bad.yaml", text)
    assert cs.yaml_syntax_error(path) == f"{path}{where} YAML syntax error: {problem}"
    assert cs.yaml_syntax_error(REPO / "config/config.yaml") is None


def test_key_text_and_parse_key_are_inverse():
    for text, key in [("arms.candidate.patches[0]", ("arms", "candidate", "patches", 0)), ("lengths[1]", ("lengths", 1)),
                      ("rounds", ("rounds",)), ("resources.gpus.cand", ("resources", "gpus", "cand"))]:
        assert cs.parse_key(text) == key and cs.key_text(key) == text
    assert cs.parse_key("lengths.1") == ("lengths", 1)  # jsonschema's spelling of an index


def test_a_config_error_carries_its_key_and_where_it_was_given(tmp_path):
    from pairbench.core.config import ConfigError

    e = ConfigError(("arms", "b", "patchez"), "unknown key", schema=True, rule="unknown")
    assert (str(e), e.key, e.rule, e.where) == ("config key 'arms.b.patchez': unknown key", ("arms", "b", "patchez"),
                                               "unknown", None)
    e = ConfigError("arms.b.patches[0]", "patch file x does not exist")
    assert (str(e), e.key) == ("arms.b.patches[0]: patch file x does not exist", ("arms", "b", "patches", 0))
    assert str(ConfigError((), "{} is not valid", schema=True)) == "config key '<root>': {} is not valid"
    # the key is never read back from the text: a message that looks like another key changes nothing
    assert ConfigError("lengths", "arms.x: not a key").key == ("lengths",)
    path = write(tmp_path, "c.yaml", "label: x\narms:\n  a: {}\n  b: {patches: [nope.patch]}\n")
    try:
        runconfig.load_config([path], root=REPO)
    except runconfig.ConfigErrors as exc:
        [err] = exc.errors
    assert (err.key, err.where) == (("arms", "b", "patches", 0), f"{path}:4")
    import pickle

    assert pickle.loads(pickle.dumps(err)).__dict__ == err.__dict__


def test_a_key_is_located_in_the_last_source_that_set_it(tmp_path):
    a = write(tmp_path, "a.yaml", "label: a\nserver:\n  threads: 1\n  pin: false\nlengths: [256]\n")
    b = write(tmp_path, "b.yaml", "server:\n  pin: true\n")
    src = cs.Sources.read([a, b], {"lengths": ["256", "9000"], "stats": {"noise": "0.02"}})
    assert src.locate(("server", "pin")) == f"{b}:2"              # b overrides a's
    assert src.locate(("server", "threads")) == f"{a}:3"          # only a has it (maps merge)
    assert src.locate(("lengths", 1)) == "--config lengths"       # --config replaced the list
    assert src.locate(("stats", "noise")) == "--config stats"
    assert src.locate(("stats", "alpha")) == str(b)               # a default: no source has it
    assert src.describe() == f"{a}, {b}, --config lengths stats"


def test_config_lists_and_maps_read_as_yaml():
    # what Snakemake's --config hands over: YAML's BaseLoader, whose scalars are all strings
    assert cs.coerce_cli(["256", "9000"]) == [256, 9000]
    assert cs.coerce_cli({"min": "8", "max": "18", "target_halfwidth": "0.02"}) == {"min": 8, "max": 18,
                                                                                 "target_halfwidth": 0.02}
    assert cs.coerce_cli({"a": {"patches": ["x.patch"], "threads": "null", "env": {"K": "on"}}}) == \
        {"a": {"patches": ["x.patch"], "threads": None, "env": {"K": "on"}}}  # YAML 1.2: "on" stays a string
    assert cs.coerce_cli("007") == "007"  # a top-level value is Snakemake's to parse


def test_every_problem_at_once_each_at_its_line(tmp_path):
    path = write(tmp_path, "bad.yaml", """\
        label: bad one
        model: tiny
        colour: blue
        arms:
          baseline: {}
          candidate: {patches: [config/patches/missing.patch], patchez: []}
        lengths: [400, 9000]
        rounds: 0
        stats: {metrics: [prefill_tok_s, ttft_ms]}
        """)
    assert report([path]) == [
        "pairbench: 7 config errors (nothing was run):",
        f"  {path}:1: config key 'label': 'bad one' is not a label: letters, digits and _ . - only, starting with "
        "a letter or digit (it names the folder results/<label>/)",
        f"  {path}:3: config key 'colour': unknown key (allowed: allow_external, arms, baseline, candidate, "
        "candidates, cost, crosscheck, gate, gates, label, lengths, load, model, order, output_tokens, repeats, resources, retries, "
        "rounds, seed, server, stats, validate)",
        f"  {path}:6: config key 'arms.candidate.patchez': unknown key (allowed: args, build, engine, engine_options, "
        "env, launch, patches, source, threads)",
        f"  {path}:6: arms.candidate.patches[0]: patch file config/patches/missing.patch does not exist",
        f"  {path}:7: lengths[1]: 9000 input + 64 output tokens (+16 margin) exceed the context of model 'tiny' (8192)",
        f"  {path}:8: config key 'rounds': 0 is less than the minimum of 1",
        f"  {path}:9: stats.metrics: prefill_tok_s and ttft_ms answer the same question (prefill); test one of "
        "them and list the other under stats.secondary, where it is shown but not tested again",
    ]


def test_only_the_arms_are_required(tmp_path):
    path = write(tmp_path, "empty.yaml", "# nothing\n")
    assert report([path]) == [
        "pairbench: 1 config error (nothing was run):",
        f"  {path}: config key 'arms': missing; it has no default (the arms to compare, e.g. arms: {{baseline: "
        "{}, candidate: {patches: [my.patch]}})"]


def test_a_string_where_a_list_belongs_says_how_to_write_one():
    assert report([REPO / "tests/config/tiny.yaml"], {"lengths": "400,480"})[1] == (
        "  --config lengths: config key 'lengths': '400,480' is not of type 'array' "
        "(write a list as --config \"lengths=[256, 1024]\", quoted)")
    config = runconfig.load_config([REPO / "tests/config/tiny.yaml"], {"lengths": ["400", "512"]}, root=REPO)
    assert config["lengths"] == [400, 512]


def test_an_unknown_engine_is_named_with_its_arm(tmp_path):
    path = write(tmp_path, "e.yaml", "model: tiny\narms:\n  a: {}\n  b: {engine: tgi}\n")
    lines = report([path])
    assert len(lines) == 2 and lines[1].startswith(f"  {path}:4: arms.b.engine: ") and "tgi" in lines[1]


def test_a_file_that_is_not_yaml_or_not_a_map_is_one_error_at_its_line(tmp_path):
    bad = write(tmp_path, "bad.yaml", "label: x\nlengths: [256, 1024\n")
    assert report([bad]) == ["pairbench: 1 config error (nothing was run):",
                             f"  {bad}:3:1: YAML syntax error: expected ',' or ']', but got '<stream end>' (while "
                             "parsing a flow sequence opened at line 2, column 10)"]
    listed = write(tmp_path, "list.yaml", "- a\n- b\n")
    assert report([listed])[1] == f"  {listed}: not a map of keys (it holds a list)"


def test_the_schema_runs_once_and_the_config_comes_back_whole(monkeypatch):
    import jsonschema

    runs = []
    real = jsonschema.Draft202012Validator.iter_errors

    def counted(self, *a, **k):  # the config schema's own runs (not an engine profile's, nor a descent)
        runs.extend([1] if self.schema.get("required") == ["arms"] and a and isinstance(a[0], dict) else [])
        return real(self, *a, **k)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "iter_errors", counted)
    cfg = runconfig.load_config([REPO / "tests/config/tiny.yaml"], root=REPO)
    assert len(runs) == 1
    # read, defaulted (the schema's defaults, each arm's too) and normalized, in one call
    assert cfg["label"] == "tiny" and cfg["rounds"] == 2 and cfg["order"] == "abba"
    assert cfg["arms"]["baseline"] == {"source": "engine", "patches": [], "args": [], "env": {}, "engine": "embedded",
                                       "threads": None, "build": None, "launch": None,
                                       "engine_options": {"fused_decode": "auto"}}
    assert cfg["server"]["request_timeout_s"] == 300 and "load" not in cfg
