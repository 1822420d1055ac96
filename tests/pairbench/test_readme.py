"""The README's first screen (everything above "## Set up") says only what is true: each claim is
checked here, or printed by a command it names (the plan: tests/recovery/test_dag.py; the verdict
table's shape: the report's own code; the times: docs/perf.md, where they were measured)."""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
FIRST = README[: README.index("## Set up")]


def test_the_first_screen_comes_in_the_newcomers_order():
    marks = ["**Does my patch make this LLM inference engine faster, slower, or no different?**",
             "./install.sh ", "snakemake --cores 1 ", "lands in `results/<label>/publish/README.md`",
             "| candidate | condition | metric | verdict |", "- **faster** / **slower**", "### Your patch",
             "### Words", "More: every config key"]
    at = [FIRST.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), dict(zip(marks, at))
    assert len(FIRST.split()) < 700, "the first screen is read in about a minute"


def test_the_times_are_the_measured_ones():
    perf = (REPO / "docs/perf.md").read_text()
    stated = re.search(r"snakemake --cores 1 +# the default comparison: (\d+ min \d+ s) to (\d+ min \d+ s) on a "
                       r"2-core CPU \(docs/perf.md\)", FIRST)
    assert stated, "the run command states its time"
    for t in stated.groups():
        assert f"**{t}**" in perf, f"{t} is not a measured time in docs/perf.md"
    # both with today's maximum of 18 rounds (config/config.yaml)
    assert yaml.safe_load((REPO / "config/config.yaml").read_text())["rounds"]["max"] == 18
    assert "(36 visits) took **5 min 35 s**" in perf and "**6 min 51 s** for 18 rounds" in perf


def test_the_default_comparison_is_the_default_config():
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert (cfg["lengths"], cfg["output_tokens"]) == ([256, 1024], 64)
    assert cfg["arms"]["candidate"]["patches"] == ["config/patches/int8-kv.patch"] and cfg["model"] == "smollm2-135m"
    assert "at 256 and 1024 input tokens and 64 output tokens" in FIRST and "int8 KV cache patch" in FIRST


def test_the_verdict_table_excerpt_has_the_reports_shape_and_the_tiny_runs_conditions():
    from pairbench.publish.stats_section import verdict_table

    rows = [line for line in FIRST.splitlines() if line.startswith("|")]
    assert rows[:2] == verdict_table({"candidates": [], "comparisons": {}})
    tiny = yaml.safe_load((REPO / "tests/config/tiny.yaml").read_text())
    conds = {f"in{n}-out{tiny['output_tokens']}" for n in tiny["lengths"]}
    for row in rows[2:]:
        m = re.fullmatch(r"\| `candidate` \| `(in\d+-out\d+)` \| `(\w+)` \| \*\*(\w+)\*\* \| (\d\.\d{4}) \| unbounded "
                         r"\| (\d+) \|", row)
        assert m, row
        assert m[1] in conds and m[2] in tiny.get("stats", {}).get("metrics", ["decode_tok_s", "prefill_tok_s"])
        # 2 rounds: 2 pairs, and no interval can be bounded, so no claim (what the label says)
        assert int(m[5]) == tiny["rounds"] and m[3] == "inconclusive"
    assert "`snakemake --cores 1 --configfile tests/config/tiny.yaml` (the tiny test model, 2 rounds" in \
        FIRST.replace("\n", " ")


def test_one_line_per_verdict_word_and_the_threshold_is_the_default():
    from pairbench.analysis.verdicts import CLAIMS

    verdicts = FIRST.split("| **inconclusive** |")[-1].split("### Your patch", 1)[0]
    words = re.findall(r"^- \*\*(\w+)\*\*(?: / \*\*(\w+)\*\*)?:", verdicts, re.M)
    listed = [w for pair in words for w in pair if w]
    assert sorted(listed) == sorted([*CLAIMS, "inconclusive"])
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["stats"]["properties"]["noise"]["default"] == 0.01
    assert FIRST.count("1 ± 1%") == 2


def your_patch() -> dict:
    block = FIRST.split("### Your patch", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


def test_your_patch_is_a_valid_config_about_a_dozen_lines(smollm2_gguf):
    from pairbench.arms.llamacpp_tree import DEFAULT_VERSION, tag_name
    from pairbench.stages import runconfig
    from pairbench.stages.summary import plan_summary

    section = FIRST.split("### Your patch", 1)[1].split("### Words", 1)[0]
    assert len(section.strip().splitlines()) <= 25
    cfg = your_patch()
    assert runconfig.problems(cfg, REPO) == []
    for arm in cfg["arms"].values():
        assert arm["source"]["tag"] == tag_name(DEFAULT_VERSION)
        assert all((REPO / p).is_file() for p in arm.get("patches", []))
    plan = plan_summary(cfg)
    assert "llama-server in arm(s) baseline, candidate: allowed (allow_external: true)" in plan
    assert "--llama-cpp" in (REPO / "install.sh").read_text().split("set -euo", 1)[0]
    for command in ("./install.sh --llama-cpp", "snakemake -n --configfile my.yaml",
                    "snakemake --cores 1 --configfile my.yaml"):
        assert command in section


@pytest.mark.parametrize("term", ["arm", "baseline", "candidate", "condition", "round", "visit", "steady request",
                                  "primary metric"])
def test_the_glossary_defines(term):
    assert re.search(rf"^- \*\*{term}\*\*: ", FIRST, re.M)


def test_every_link_and_named_file_exists():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert (REPO / target).exists(), target
    for named in re.findall(r"`((?:config|docs|tests/config)/[\w./-]+\.(?:yaml|md|patch))`", FIRST):
        assert (REPO / named).is_file(), named
