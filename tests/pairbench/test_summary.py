"""The plan in words (what `snakemake` and `snakemake -n` print first, and `python -m pairbench plan`),
and the command line's plain help and version."""

import re
from pathlib import Path

import yaml

from pairbench import __main__ as cli
from pairbench.stages.summary import FIXED_S, VISIT_S, plan_summary

REPO = Path(__file__).resolve().parents[2]


def load(rel):
    return yaml.safe_load((REPO / rel).read_text())


def test_the_default_plan_in_words():
    assert plan_summary(load("config/config.yaml"), "config/config.yaml").splitlines() == [
        "pairbench plan 'default' -> results/default/ (config: config/config.yaml)",
        "  arm baseline (baseline): embedded engine, source engine/, no patches",
        "  arm candidate (candidate): embedded engine, source engine/, patch config/patches/int8-kv.patch",
        "  conditions (2): in256-out64, in1024-out64; model smollm2-135m",
        "  rounds: 8, then blocks of 2 until every primary interval is within +-2%, at most 18 (order abba)",
        "  visits: 16 to 36, 1 steady request(s) per condition each",
        "  external engines: none (nothing outside this repository is built or launched)",
        "  time: about 3.2 to 5.5 min (~80 s + ~7 s a visit: the default config's cost on a 2-core CPU, docs/perf.md); "
        "where visits are slower, at most ~9.3 min (rounds.max_minutes 8)",
        "    plus the cost channel after the visits: 2 arm(s) x in256-out64 under callgrind, decode counted "
        "(~90 s an arm at a 256-token prompt, more as the prompt grows: docs/cost.md)",
    ]


def test_the_estimate_is_the_stated_cost_per_visit():
    # 80 s + 16 visits x 7 s = 192 s = 3.2 min; 80 s + 36 x 7 s = 332 s = 5.5 min (the line above)
    assert (FIXED_S, VISIT_S) == (80, 7)
    # and the two runs it was read from (docs/perf.md): 28 visits in 4 min 38 s, 36 in 5 min 35 s
    perf = (REPO / "docs/perf.md").read_text()
    assert "28 visits" in perf and "4 min 38 s" in perf and "5 min 35 s" in perf
    for visits, seconds in ((28, 4 * 60 + 38), (36, 5 * 60 + 35)):
        assert abs(FIXED_S + VISIT_S * visits - seconds) / seconds < 0.03


def test_an_aa_run_says_so():
    lines = plan_summary(load("config/aa.yaml")).splitlines()
    assert lines[-1] == ("  A/A: every candidate is identical to the baseline (engine, source, patches, flags): "
                         "no verdict should read faster or slower")
    assert not any("A/A" in line for line in plan_summary(load("config/config.yaml")).splitlines())
    three = {"arms": {"a": {}, "b": {}, "c": {"patches": ["config/patches/int8-kv.patch"]}}}
    assert plan_summary(three).splitlines()[-1] == "  A/A: b identical to the baseline (engine, source, patches, flags)"


def test_external_engines_need_consent_and_bring_their_build_and_cross_check():
    cfg = load("config/llama-cpp.yaml")
    lines = plan_summary(cfg).splitlines()
    assert "  external engines: llama-server in arm(s) baseline, candidate: allowed (allow_external: true)" in lines
    # 24 visits at 20-36 s each, plus 80 s: 560-944 s
    assert lines[-4:-1] == ["  time: about 9.3 to 16 min (~80 s + 20-36 s a visit: llama-server's, measured at load 4-8 "
                            "on 2 cores, docs/engines.md)",
                            "    plus a CMake build per arm (llama.cpp: 497-991 s with a cold ccache, 39-104 s warm)",
                            "    plus llama-bench after the visits, 3 rounds (llama-bench's 3 took ~5 min at load 4-8)"]
    assert lines[-1].startswith("    plus the cost channel after the visits: 2 arm(s) x in256-out64 under callgrind, "
                                "prefill and decode counted (")
    cfg["allow_external"] = False
    assert ("  external engines: llama-server in arm(s) baseline, candidate: NOT allowed: the run stops at its "
            "first engine job; review this plan, then add --config allow_external=true") in plan_summary(cfg).splitlines()


def test_plan_command_prints_the_plan_or_every_error(tmp_path, capsys):
    assert cli.main(["plan", str(REPO / "tests/config/tiny.yaml"), "--root", str(REPO)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pairbench plan 'tiny' -> results/tiny/ (config: ")
    assert "  conditions (2): in400-out8, in480-out8; model tiny\n" in out

    assert cli.main(["plan", str(REPO / "tests/config/tiny.yaml"), "--root", str(REPO),
                     "--config", "lengths=[400, 9000]", "--config", "rounds=0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["pairbench: 2 config errors (nothing was run):",
                   "  --config lengths: lengths[1]: 9000 input + 8 output tokens (+16 margin) exceed the context of "
                   "model 'tiny' (8192)",
                   "  --config rounds: config key 'rounds': 0 is less than the minimum of 1"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("arms:\n  a: {}\n  b: {patches: [x.patch]\n")
    assert cli.main(["plan", str(bad)]) == 2
    assert capsys.readouterr().err == ("pairbench: 1 config error (nothing was run):\n"
                                       f"  {bad}:4:1: YAML syntax error: expected ',' or '}}', but got "
                                       "'<stream end>' (while parsing a flow mapping opened at line 3, column 6)\n")


def test_help_is_plain_text_naming_the_run_command_and_version_works(capsys):
    for argv in (["--help"], ["--version"]):
        try:
            cli.main(argv)
        except SystemExit as exc:
            assert exc.code == 0
    out = capsys.readouterr().out
    assert "snakemake --cores 1" in out and "plan" in out
    assert not re.search(r"``|:func:|:data:", out), "raw reStructuredText in --help"
    assert out.rstrip().endswith("pairbench 0.1.0")
