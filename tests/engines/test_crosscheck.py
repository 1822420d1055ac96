"""The llama-bench cross-check: running the tool from an arm's tree (pairbench.measure.toolbench), and
its comparison with pairbench (pairbench.analysis.crosscheck).

A fake ``llama-bench`` (a script in a throwaway tree's build/bin/) prints the recorded outputs in
tests/data/crosscheck/, chosen by its own arguments, as the real one prints them with ``-o json``.
"""

import json
import stat
import sys
from pathlib import Path

import pytest

from pairbench.analysis import crosscheck as ac
from pairbench.core.artifacts import schema_id, validate
from pairbench.measure import toolbench as tb
from pairbench.publish.bundle import CATEGORICAL_FIELDS, json_field_problems

DATA = Path(__file__).resolve().parents[1] / "data" / "crosscheck"
ARM = {"engine": "llama-server", "threads": 1}


def fake_tree(tmp_path: Path, arm: str) -> Path:
    tree = tmp_path / arm
    (tree / "build" / "bin").mkdir(parents=True)
    tool = tree / "build" / "bin" / "llama-bench"
    tool.write_text(f"""#!{sys.executable}
import pathlib, sys
args = sys.argv[1:]
pathlib.Path("calls.txt").open("a").write(" ".join(args) + "\\n")
part = "pp" if args[args.index("--n-gen") + 1] == "0" else "tg"
sys.stdout.write(pathlib.Path({str(DATA)!r}, "{arm}-" + part + ".json").read_text())
""")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tree


def run(tmp_path, rounds=2):
    arms = {a: {"config": ARM, "src_dir": fake_tree(tmp_path, a), "model": str(tmp_path / "models" / "m.gguf")}
            for a in ("baseline", "candidate")}
    bodies = tb.run_toolbench(arms, lengths=[256, 1024], output_tokens=[64], rounds=rounds,
                               raw_out={a: tmp_path / f"raw-{a}.json" for a in arms}, log=tmp_path / "tool.log")
    return arms, {a: {**b, "inputs": {}} for a, b in bodies.items()}


def test_runs_the_profiles_two_commands_per_arm_in_alternating_rounds(tmp_path):
    arms, bodies = run(tmp_path, rounds=3)
    model = str(tmp_path / "models" / "m.gguf")
    calls = (arms["baseline"]["src_dir"] / "calls.txt").read_text().splitlines()
    assert calls == 3 * [
        f"--model {model} --threads 1 --n-prompt 256,1024 --n-gen 0 --repetitions 1 --output json --prio 3",
        f"--model {model} --threads 1 --n-prompt 0 --n-gen 64 --n-depth 256,1024 --repetitions 1 --output json --prio 3",
    ]
    body = bodies["baseline"]
    assert body["order"] == [["baseline", "candidate"], ["candidate", "baseline"], ["baseline", "candidate"]]
    assert [r["round"] for r in body["runs"]] == [1, 1, 2, 2, 3, 3]
    # each round's run is one sample; the fixture prints the same rates every time
    assert [(t["test"], t["n_depth"], t["avg_tok_s"], t["stddev_tok_s"]) for t in body["tests"]] == [
        ("pp256", 0, 150.0, 0.0), ("pp1024", 0, 120.0, 0.0), ("tg64", 256, 55.0, 0.0), ("tg64", 1024, 50.0, 0.0)]
    assert body["tests"][0]["samples_tok_s"] == [150.0, 150.0, 150.0] and body["tests"][0]["n_ubatch"] == 512
    validate("crosscheck", {"schema": "pairbench.crosscheck/v2", **body, "exercise": None})
    # the artifact names files, never their folders; the raw output (model path, CPU) stays private
    public = json.dumps(body)
    assert str(tmp_path) not in public and "Example CPU" not in public
    assert body["runs"][0]["argv"][:3] == ["llama-bench", "--model", "m.gguf"]
    raw = json.loads((tmp_path / "raw-baseline.json").read_text())
    assert len(raw) == 6 and raw[0][0]["cpu_info"] == "Example CPU"


def test_a_failing_tool_names_the_arm(tmp_path):
    tree = fake_tree(tmp_path, "baseline")
    arms = {"baseline": {"config": ARM, "src_dir": tree, "model": "m.gguf"}}
    kw = dict(lengths=[256], output_tokens=[64], rounds=1, raw_out={"baseline": tmp_path / "raw.json"},
              log=tmp_path / "x.log")
    (tree / "build" / "bin" / "llama-bench").write_text(f"#!{sys.executable}\nraise SystemExit(2)\n")
    with pytest.raises(tb.ToolbenchError, match=r"arm baseline: llama-bench exited with status 2; see "):
        tb.run_toolbench(arms, **kw)
    (tree / "build" / "bin" / "llama-bench").unlink()
    with pytest.raises(tb.ToolbenchError, match=r"llama-bench not found; does the build compile it"):
        tb.run_toolbench(arms, **kw)


def cell(verdict, hl, lo, hi):
    return {"verdict": verdict, "hl_ratio": hl, "ci_low": lo, "ci_high": hi}


def summary(paired: dict) -> dict:
    """A run summary whose candidate ``candidate`` has these paired cells; another candidate beside it
    (not cross-checked) has none of them."""
    conds = [{"id": c, "input_tokens": int(c[2:c.index("-")]), "output_tokens": 64} for c in paired]
    return {"baseline": "baseline", "candidates": ["other", "candidate"], "params": {"noise": 0.01},
            "comparisons": {"candidate": {"paired": paired, "conditions": conds},
                            "other": {"paired": {}, "conditions": []}}}


SUMMARY = summary({
    "in256-out64": {"engine_prefill_tok_s": cell("faster", 1.48, 1.45, 1.52),
                    "engine_decode_tok_s": cell("equivalent", 1.001, 0.995, 1.006)},
    "in1024-out64": {"engine_prefill_tok_s": cell("faster", 1.30, 1.25, 1.36),       # tool: 1.40, outside
                     "decode_tok_s": cell("inconclusive", 0.99, 0.95, 1.03)},          # no engine decode metric
})


def test_compare_judges_direction_and_size_per_condition(tmp_path):
    _, bodies = run(tmp_path)
    body = ac.compare(SUMMARY, bodies["baseline"], bodies["candidate"])
    got = [(r["condition"], r["quantity"], r["test"], r["metric"], round(r["tool_ratio"], 4), r["tool_direction"],
            r["direction"], r["size"]) for r in body["rows"]]
    assert got == [
        ("in256-out64", "prefill", "pp256", "engine_prefill_tok_s", 1.5, "faster", "agree", "within CI"),
        ("in256-out64", "decode", "tg64", "engine_decode_tok_s", 1.0036, "equivalent", "agree", "within CI"),
        ("in1024-out64", "prefill", "pp1024", "engine_prefill_tok_s", 1.4, "faster", "agree", "outside CI"),
        ("in1024-out64", "decode", "tg64", "decode_tok_s", 0.998, "equivalent", "undecided", "within CI"),
    ]
    assert round(body["rows"][2]["size_gap"], 4) == round(1.4 / 1.30 - 1, 4)
    assert body["direction_counts"] == {"agree": 3, "disagree": 0, "undecided": 1} and body["size_within_ci"] == 3
    assert ac.statement(body) == (
        "llama-bench and pairbench agree on the direction of the effect in 3 of 4 comparisons; "
        "1 undecided (pairbench was inconclusive there, or the metric is not tested). "
        "llama-bench's ratio lies inside pairbench's confidence interval in 3 of 4.")
    published = {"schema": schema_id("crosscheck_summary"), "inputs": {}, **body}
    validate("crosscheck_summary", published)
    assert json_field_problems("tables/crosscheck.json", published, CATEGORICAL_FIELDS) == []


def test_a_tool_that_contradicts_pairbench_is_a_disagreement(tmp_path):
    _, bodies = run(tmp_path)
    s = summary({"in256-out64": {"engine_prefill_tok_s": cell("slower", 0.9, 0.85, 0.95)}})
    body = ac.compare(s, bodies["baseline"], bodies["candidate"])
    assert [(r["direction"], r["size"]) for r in body["rows"]] == [("disagree", "outside CI")]
    assert "disagree in 1" in ac.statement(body)


def test_the_tools_ratio_is_the_median_of_its_paired_rounds():
    def arm(samples, name):
        return {"arm": name, "tool": "llama-bench", "rounds": 3, "tests": [
            {"test": "pp256", "kind": "pp", "n_prompt": 256, "n_gen": 0, "n_depth": 0,
             "avg_tok_s": sum(samples) / 3, "stddev_tok_s": 0.0, "samples_tok_s": samples}]}
    # round 2 ran while the machine was busy for both arms: paired, it cancels; unpaired, it would not
    base, cand = arm([100.0, 50.0, 100.0], "baseline"), arm([150.0, 75.0, 160.0], "candidate")
    s = summary({"in256-out64": {"engine_prefill_tok_s": cell("faster", 1.5, 1.45, 1.55)}})
    row = ac.compare(s, base, cand)["rows"][0]
    assert row["tool_ratio"] == 1.5 and row["size"] == "within CI"


def test_an_inconclusive_verdict_is_not_a_claim_the_tool_can_contradict(tmp_path):
    _, bodies = run(tmp_path)
    # pairbench could not tell at 256 prefill (wide CI); the tool sees 1.5: undecided, and the size
    # column says the tool's ratio is consistent with pairbench's interval
    s = summary({"in256-out64": {"engine_prefill_tok_s": cell("inconclusive", 1.39, 1.02, 1.73)}})
    row = ac.compare(s, bodies["baseline"], bodies["candidate"])["rows"][0]
    assert (row["tool_direction"], row["direction"], row["size"]) == ("faster", "undecided", "within CI")
    # pairbench claims faster; the tool sees nothing: that is a disagreement
    s = summary({"in256-out64": {"engine_decode_tok_s": cell("faster", 1.2, 1.1, 1.3)}})
    row = ac.compare(s, bodies["baseline"], bodies["candidate"])["rows"][0]
    assert (row["tool_direction"], row["direction"], row["size"]) == ("equivalent", "disagree", "outside CI")
