"""The cost channel's verdicts checked after the run: ``verify`` recomputes ``stats/cost.json`` from
its inputs (pairbench.publish.costcheck), and the CI gate shows them beside the wall-clock verdicts
and, only when the policy opts in (gate.cost_metrics), decides on them (pairbench.publish.gate).

The wall-clock summary is a real run's (tests/data/gate/summary.json, as tests/pairbench/test_gate.py
uses it) with intervals set by hand; the counts are chosen here, so every expected verdict is read
from numbers the test chose.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pairbench.analysis import cost as cost_verdicts
from pairbench.core.artifacts import sha256_file, write_artifact
from pairbench.core.metrics import COST_NAMES
from pairbench.measure import cost
from pairbench.publish import costcheck

SUMMARY = json.loads((Path(__file__).resolve().parents[1] / "data" / "gate" / "summary.json").read_text())
CONDS = ("in400-out8", "in480-out8")
ARMS = {"baseline": {"engine": "embedded", "args": [], "env": {}, "threads": 1, "launch": None},
        "candidate": {"engine": "embedded", "args": [], "env": {}, "threads": 1, "launch": None}}
PLAN = {"baseline": "baseline", "candidates": ["candidate"], "arms": ARMS}
BUILDS = {"baseline": {"arm": "baseline", "patched_tree_sha256": "1" * 64},
          "candidate": {"arm": "candidate", "patched_tree_sha256": "2" * 64}}
DECODE, INSTR = COST_NAMES.decode_instructions_per_tok, COST_NAMES.prefill_instructions_per_tok


def summary() -> dict:
    """The fixture summary, every primary cell equivalent [0.995, 1.005] over 6 pairs."""
    s = copy.deepcopy(SUMMARY)
    for cond in CONDS:
        for metric in s["params"]["primary"]:
            s["comparisons"]["candidate"]["paired"][cond][metric].update(
                ci_low=0.995, ci_high=1.005, hl_ratio=1.0, n_pairs=6, rounds_needed=None, verdict="equivalent")
    return s


def counted(arm: str, decode_ir: int, prefill_ir: int = 40_000_000) -> dict:
    """A counted arm's cost body: decode over 8 tokens and prefill over 400, at both conditions."""
    c = cost.ArmCost("valgrind-callgrind", "valgrind-3.19.0", duration_s=30.0, facts={"isa": "avx2"})
    for cond in CONDS:
        c.conditions[cond] = {
            "prefill": cost.PhaseCost(cost.Counts({"Ir": prefill_ir, "Dr": prefill_ir // 4, "Dw": 0}), 400),
            "decode": cost.PhaseCost(cost.Counts({"Ir": decode_ir, "Dr": decode_ir // 4, "Dw": 0}), 8)}
    return {**cost.artifact_body(arm, "embedded", cost.CostOptions(phases=("prefill", "decode")), cost=c), "inputs": {}}


def not_counted(arm: str) -> dict:
    why = cost.CostUnavailable("no_valgrind", "valgrind is not installed (Debian: apt-get install valgrind)")
    return {**cost.artifact_body(arm, "embedded", cost.CostOptions(), unavailable=why), "inputs": {}}


def cost_summary(costs: dict) -> dict:
    return cost_verdicts.summarize(PLAN, summary(), costs, BUILDS)


# --- verify: stats/cost.json recomputed from its inputs ----------------------------------------------

def test_a_cost_summary_recomputes_from_its_inputs_and_a_changed_count_is_named_by_field():
    published = cost_summary({"baseline": counted("baseline", 8_000_000), "candidate": counted("candidate", 8_160_000)})
    assert costcheck.body_problems(published, copy.deepcopy(published)) == []
    # the candidate's counts changed after the verdicts were made: 2% more decode work reads 0% now
    want = cost_summary({"baseline": counted("baseline", 8_000_000), "candidate": counted("candidate", 8_000_000)})
    problems = costcheck.body_problems(published, want)
    i = next(i for i, r in enumerate(want["rows"]) if (r["condition"], r["metric"]) == ("in400-out8", DECODE))
    where = f"stats/cost.json: rows[{i}] (candidate in400-out8 {DECODE})"
    assert f"{where}.verdict is 'slower', the artifacts give 'not exercised'" in problems
    assert any(p.startswith(f"{where}.ratio is 1.02") for p in problems)
    assert any(p.startswith(f"{where}.candidate_per_tok is 1020000") for p in problems)


def test_an_arm_counted_then_not_is_named_with_its_field():
    published = cost_summary({"baseline": counted("baseline", 8_000_000), "candidate": counted("candidate", 8_160_000)})
    want = cost_summary({"baseline": counted("baseline", 8_000_000), "candidate": not_counted("candidate")})
    problems = costcheck.body_problems(published, want)
    assert "stats/cost.json: arms.candidate.status is 'counted', cost/candidate.json gives 'unavailable'" in problems
    assert any(p.startswith("stats/cost.json: rows are (candidate in400-out8") and p.endswith("the artifacts give (none)")
               for p in problems)


def _run_folder(tmp_path: Path, candidate_ir: int = 8_160_000) -> Path:
    """A run folder with the cost channel: its inputs as plain JSON (their own schemas are the audit's
    business; here the recomputation is), the cost artifacts and stats/cost.json as the stages write them."""
    res = tmp_path / "results" / "ci"
    for rel, body in (("plan.json", PLAN), ("stats/summary.json", summary()),
                      *((f"build/{a}.json", b) for a, b in BUILDS.items())):
        (res / rel).parent.mkdir(parents=True, exist_ok=True)
        (res / rel).write_text(json.dumps(body))
    costs = {"baseline": counted("baseline", 8_000_000), "candidate": counted("candidate", candidate_ir)}
    for arm, body in costs.items():
        write_artifact(res / "cost" / f"{arm}.json", "cost", body)
    body = {**cost_summary(costs), "inputs": {
        "plan": sha256_file(res / "plan.json"), "summary": sha256_file(res / "stats/summary.json"),
        **{f"cost.{a}": sha256_file(res / "cost" / f"{a}.json") for a in costs},
        **{f"build.{a}": sha256_file(res / "build" / f"{a}.json") for a in BUILDS}}}
    write_artifact(res / "stats" / "cost.json", "cost_summary", body)
    return res


@pytest.fixture
def plain_inputs(monkeypatch):
    """plan, build and summary read as the plain JSON _run_folder writes (the cost artifacts validated)."""
    real = costcheck.read_artifact
    monkeypatch.setattr(costcheck, "read_artifact", lambda path, kind: real(path, kind) if kind.startswith("cost")
                        else json.loads(Path(path).read_text()))


def test_a_run_folder_s_cost_verdicts_verify_and_a_tampered_cost_artifact_is_named(tmp_path, plain_inputs):
    res = _run_folder(tmp_path)
    assert costcheck.cost_problems(res) == []
    tampered = json.loads((res / "cost" / "candidate.json").read_text())
    for row in tampered["rows"]:
        if row["phase"] == "decode":
            row["events"]["Ir"] = 8_000_000
            row["metrics"][DECODE] = 1_000_000
    (res / "cost" / "candidate.json").write_text(json.dumps(tampered))
    problems = costcheck.cost_problems(res)
    assert problems[0] == ("cost/candidate.json: its sha256 is not the one stats/cost.json was computed from "
                           "(inputs.cost.candidate): the file changed after the cost verdicts were made")
    assert any(p.startswith("stats/cost.json: rows[") and f"(candidate in400-out8 {DECODE}).ratio is 1.02" in p
               for p in problems)


def test_a_run_without_the_cost_channel_has_nothing_to_recompute_but_a_lone_cost_artifact_is_named(tmp_path):
    res = tmp_path / "results" / "plain"
    (res / "stats").mkdir(parents=True)
    assert costcheck.cost_problems(res) == []
    write_artifact(res / "cost" / "baseline.json", "cost", counted("baseline", 8_000_000))
    assert costcheck.cost_problems(res) == ["cost/baseline.json: a cost artifact without stats/cost.json, the verdicts "
                                            "made from it"]
