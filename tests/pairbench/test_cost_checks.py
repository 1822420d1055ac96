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
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pairbench.analysis import cost as cost_verdicts
from pairbench.core.artifacts import sha256_file, validate, write_artifact
from pairbench.core.metrics import COST_NAMES
from pairbench.measure import cost
from pairbench.publish import costcheck, gateviews
from pairbench.publish import gate as pb_gate

SUMMARY = json.loads((Path(__file__).resolve().parents[1] / "data" / "gate" / "summary.json").read_text())
CONDS = ("in400-out8", "in480-out8")
HOST = dict.fromkeys(pb_gate.HOST_FACTS)
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


def decide(gate: dict | None = None, cost_body: dict | None = None) -> dict:
    body = pb_gate.decide(summary(), gate, label="ci", arms={}, host=HOST, inputs={}, cost=cost_body)
    validate("gate", {**body, "schema": "pairbench.gate/v2"})  # every record the gate writes is schema-valid
    return body


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


def test_verify_asks_for_the_cost_verdicts_where_the_bundle_publishes_them(tmp_path):
    from pairbench.publish.report import cost_section

    bundle = tmp_path / "results" / "ci" / "publish"
    bundle.mkdir(parents=True)
    (bundle / "README.md").write_text("# pairbench\n\n## Statistics\n")
    assert costcheck.published_by(bundle) is None  # a stale stats/cost.json would be no figure of it
    (bundle / "README.md").write_text("\n".join(cost_section(cost_summary({"baseline": counted("baseline", 8_000_000),
                                                                           "candidate": not_counted("candidate")}))))
    assert costcheck.published_by(bundle) == "README.md"
    (bundle / "gate.json").write_text(json.dumps({"inputs": {"summary": "5" * 64, "cost_summary": "6" * 64}}))
    assert costcheck.published_by(bundle) == "gate.json"
    assert costcheck.cost_problems(bundle.parent, published_by="gate.json") == [
        "stats/cost.json: missing, but gate.json publishes the cost channel's verdicts"]


# --- the gate: shown beside wall time, deciding only when asked --------------------------------------

SLOWER = {"baseline": counted("baseline", 8_000_000), "candidate": counted("candidate", 8_400_000)}  # decode +5%


def test_a_slower_cost_verdict_is_shown_and_named_but_does_not_fail_the_gate_by_default():
    body = decide(None, cost_summary(SLOWER))
    assert (body["decision"], body["exit_code"]) == ("pass", 0)
    shown = {(c["condition"], c["metric"]): (c["verdict"], c["gated"], c["outcome"]) for c in body["cost"]["cells"]}
    assert shown[("in400-out8", DECODE)] == ("slower", False, None)
    assert shown[("in400-out8", INSTR)] == ("not exercised", False, None)  # prompts count the same in both arms
    assert (f"the cost channel (shown, not gated: gate.cost_metrics) calls candidate {DECODE} at in400-out8 "
            "(1.0500x) slower (and 1 more)") in body["reason"]
    assert f"the cost channel cannot see the change in candidate {INSTR} at in400-out8 (1.0000x) (and 1 more) (not exercised)" in body["reason"]


def test_a_slower_cost_verdict_fails_the_gate_when_the_policy_opts_in():
    body = decide({"cost_metrics": [DECODE], "fail_slower_than": 0.02}, cost_summary(SLOWER))
    assert (body["decision"], body["exit_code"]) == ("regression", 1)
    assert body["reason"].startswith(f"a slowdown beyond 2% in the cost channel (gate.cost_metrics): candidate {DECODE} "
                                     "at in400-out8 counts 1.0500x the baseline's per token (wall time: equivalent)")
    gated = [c for c in body["cost"]["cells"] if c["gated"]]
    assert [(c["condition"], c["outcome"]) for c in gated] == [("in400-out8", "regression"), ("in480-out8", "regression")]
    # a threshold above the ratio passes it: the count is exact, so nothing is left inconclusive
    assert decide({"cost_metrics": [DECODE], "fail_slower_than": 0.06}, cost_summary(SLOWER))["decision"] == "pass"
    suite = ET.fromstring(gateviews.junit(body)).find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("6", "2")  # 4 wall-clock cells + 2 gated cost cells
    md = gateviews.markdown(body)
    assert f"Cost channel (simulated counts per token, docs/cost.md): {DECODE} decide beside the wall-clock cells" in md
    assert f"| candidate | in400-out8 | {DECODE} | **regression** | slower | 1.0500x | decode_tok_s equivalent |" in md


def test_the_cli_exit_code_and_message_of_an_opted_in_cost_regression(tmp_path, monkeypatch, capsys):
    """python -m pairbench gate over a run whose check passes: the exit status and the stderr line."""
    from pairbench import __main__ as cli
    from pairbench.integrity import gate as integrity_gate

    record = {**decide({"cost_metrics": [DECODE]}, cost_summary(SLOWER)), "schema": "pairbench.gate/v2"}
    monkeypatch.setattr(integrity_gate, "check_run", lambda *a, **k: integrity_gate.GateResult(record, published=True))
    assert cli.main(["gate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pairbench gate: regression (exit 1): a slowdown beyond 1% in the cost channel")


def test_not_exercised_and_not_counted_gated_cells_are_inconclusive_never_a_pass():
    both = {"baseline": counted("baseline", 8_000_000), "candidate": not_counted("candidate")}
    body = decide({"cost_metrics": [DECODE, INSTR]}, cost_summary(both))
    assert body["decision"] == "pass"  # inconclusive passes by default, and says so
    assert body["reason"].startswith("no slowdown beyond 1% shown, but 4 of 8 gated cells could not rule out a "
                                     f"slowdown beyond 1%: the cost channel's candidate {DECODE} at in400-out8 is "
                                     "unavailable: the cost channel did not count it: candidate not counted (no_valgrind)")
    assert body["reason"].endswith("; the cost channel did not count candidate (no_valgrind)")
    strict = decide({"cost_metrics": [INSTR], "inconclusive": "fail"}, cost_summary(SLOWER))
    assert (strict["decision"], strict["exit_code"]) == ("inconclusive", 2)
    assert "(1.0000x) is not exercised: the change runs nothing the simulator counts" in strict["reason"]


def test_gating_on_a_cost_channel_the_run_does_not_have_is_invalid():
    body = decide({"cost_metrics": [DECODE]}, None)
    assert (body["decision"], body["exit_code"]) == ("invalid", 3)
    assert "gate.cost_metrics: decode_instructions_per_tok gated, but the run has no cost channel" in body["reason"]
    assert decide(None, None)["cost"] is None  # a run without the channel: the record says so, the rest as before


@pytest.mark.parametrize("value", [["decode_tok_s"], "decode_instructions_per_tok", [DECODE, DECODE]])
def test_a_bad_cost_policy_names_its_key(value):
    with pytest.raises(pb_gate.GateError, match=r"^gate.cost_metrics: "):
        pb_gate.Policy.from_config({"cost_metrics": value})


def test_the_published_cost_cells_must_recompute():
    costs = cost_summary(SLOWER)
    body = decide({"cost_metrics": [DECODE]}, costs)
    assert pb_gate.gate_problems(body, summary(), costs) == []
    assert pb_gate.gate_problems(body, summary()) == []  # a bundle alone: its cost cells judged again
    forged = copy.deepcopy(body)
    forged.update(decision="pass", exit_code=0)
    i = next(i for i, c in enumerate(forged["cost"]["cells"]) if c["gated"])
    forged["cost"]["cells"][i]["outcome"] = "pass"
    problems = pb_gate.gate_problems(forged, summary(), costs)
    assert "gate.json: decision is 'pass', the measurements give 'regression'" in problems
    assert (f"gate.json: cost.cells[{i}] (candidate {DECODE} at in400-out8): outcome is 'pass', the cost channel's "
            "verdicts give 'regression'") in problems
