"""The gate's decision (pairbench.publish.gate) and its views (pairbench.publish.gateviews).

The summary is a real run's (tests/data/gate/summary.json: tests/config/tiny.yaml, 2 rounds, every
interval unbounded); each test sets the intervals it needs by hand, so every expected outcome is
read from numbers the test chose, not computed by the code under test.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pairbench.core.artifacts import validate
from pairbench.publish import gate as pb_gate
from pairbench.publish import gateviews

SUMMARY = json.loads((Path(__file__).resolve().parents[1] / "data" / "gate" / "summary.json").read_text())
CONDS = ("in400-out8", "in480-out8")
HOST = {"cpu_model": "Test CPU", "cpu_count_logical": 2, "cpu_arch": "x86_64", "memory_total_bytes": 8 << 30,
        "os_family": "Linux", "os_distribution": "Debian GNU/Linux 12 (bookworm)", "gpu_count": 0}
SHA = {"base": "1" * 40, "head": "2" * 40}
ARMS = {name: {"role": "baseline" if name == "baseline" else "candidate", "engine": "embedded", "source": "git",
               "ref": ref, "commit": commit, "tree": "3" * 40, "version": ref, "patches": [], "tree_sha256": "4" * 64}
        for name, ref, commit in (("baseline", "main", SHA["base"]), ("candidate", "feature/x", SHA["head"]))}


def summary_with(**cells) -> dict:
    """The fixture summary with every primary cell's interval set: ``decode=(lo, hi)`` sets decode_tok_s
    at every condition, ``"prefill_tok_s@in480-out8"=(lo, hi)`` one cell; the rest equivalent [0.995, 1.005]."""
    s = copy.deepcopy(SUMMARY)
    pair = s["comparisons"]["candidate"]
    for cond in CONDS:
        for metric in s["params"]["primary"]:
            lo, hi = cells.get(f"{metric}@{cond}", cells.get(metric, (0.995, 1.005)))
            p = pair["paired"][cond][metric]
            p.update(ci_low=lo, ci_high=hi, hl_ratio=None if lo is None else (lo + hi) / 2, n_pairs=6,
                     rounds_needed=None)
    return s


def decide(summary: dict, gate: dict | None = None) -> dict:
    body = pb_gate.decide(summary, gate, label="ci", arms=ARMS, host=HOST, inputs={"summary": "5" * 64})
    validate("gate", {**body, "schema": "pairbench.gate/v2"})  # every record the gate writes is schema-valid
    return body


def outcomes(body: dict) -> dict:
    return {(c["metric"], c["condition"]): c["outcome"] for c in body["cells"]}


def test_an_interval_wholly_below_the_threshold_is_a_regression_exit_1():
    body = decide(summary_with(decode_tok_s=(0.90, 0.95)), {"fail_slower_than": 0.02})
    assert (body["decision"], body["exit_code"]) == ("regression", 1)
    assert outcomes(body)[("decode_tok_s", "in400-out8")] == "regression"
    assert outcomes(body)[("prefill_tok_s", "in400-out8")] == "pass"
    cell = body["cells"][0]
    assert cell["rule"] == "fail_slower_than: the interval lies wholly below 1 - 0.02"
    assert cell["slowdown_bound"] == pytest.approx(0.10)
    assert body["reason"] == ("a slowdown beyond 2%: candidate decode_tok_s at in400-out8 is 0.925x [0.900, 0.950], "
                              "over 6 rounds (and 1 more)")


def test_a_slowdown_smaller_than_the_threshold_passes():
    body = decide(summary_with(decode_tok_s=(0.975, 0.985)), {"fail_slower_than": 0.03})
    assert (body["decision"], body["exit_code"]) == ("pass", 0)
    assert body["reason"] == "all 4 gated cells rule out a slowdown beyond 3%"


def test_the_default_threshold_is_the_runs_noise():
    assert SUMMARY["params"]["noise"] == 0.01
    body = decide(summary_with(decode_tok_s=(0.975, 0.985)))
    assert body["policy"] == {"metrics": ["decode_tok_s", "prefill_tok_s"], "conditions": None,
                              "fail_slower_than": 0.01, "inconclusive": "pass", "cost_metrics": []}
    assert body["exit_code"] == 1 and body["cost"] is None  # no cost channel given: none shown, none gated


def test_time_metrics_are_slower_above_one():
    s = summary_with()
    s["params"]["primary"] = s["comparisons"]["candidate"]["params"]["primary"] = ["ttft_ms"]
    for cond in CONDS:
        p = s["comparisons"]["candidate"]["paired"][cond]["ttft_ms"]
        p.update(ci_low=1.05, ci_high=1.10, hl_ratio=1.07, n_pairs=6, verdict="slower", rounds_needed=None)
    body = decide(s, {"fail_slower_than": 0.02})
    assert body["exit_code"] == 1
    assert body["cells"][0]["rule"] == "fail_slower_than: the interval lies wholly above 1 + 0.02"
    for cond in CONDS:
        s["comparisons"]["candidate"]["paired"][cond]["ttft_ms"].update(ci_low=0.90, ci_high=0.95)
    assert decide(s, {"fail_slower_than": 0.02})["exit_code"] == 0  # a faster TTFT


def test_inconclusive_passes_by_default_and_says_what_it_could_not_rule_out():
    s = summary_with(**{"decode_tok_s@in480-out8": (0.96, 1.01)})
    s["comparisons"]["candidate"]["paired"]["in480-out8"]["decode_tok_s"]["rounds_needed"] = 14
    body = decide(s, {"fail_slower_than": 0.02})
    assert (body["decision"], body["exit_code"]) == ("pass", 0)
    assert body["reason"] == ("no slowdown beyond 2% shown, but 1 of 4 gated cells could not rule out a slowdown "
                              "beyond 2%: candidate decode_tok_s at in480-out8 is 0.985x [0.960, 1.010] over 6 "
                              "rounds; about 14 rounds would resolve it")
    assert outcomes(body)[("decode_tok_s", "in480-out8")] == "inconclusive"


def test_a_policy_that_fails_inconclusive_exits_2():
    body = decide(summary_with(prefill_tok_s=(0.96, 1.01)), {"fail_slower_than": 0.02, "inconclusive": "fail"})
    assert (body["decision"], body["exit_code"]) == ("inconclusive", 2)
    assert body["reason"].endswith("the policy fails an inconclusive result")


def test_an_unbounded_interval_is_inconclusive():
    body = decide(summary_with(decode_tok_s=(None, None)), {"inconclusive": "fail"})
    assert body["exit_code"] == 2
    assert body["cells"][0]["rule"] == "no interval is bounded with 6 pairs: a slowdown is not ruled out"


def test_a_regression_wins_over_an_inconclusive_cell():
    body = decide(summary_with(decode_tok_s=(0.80, 0.85), prefill_tok_s=(0.9, 1.1)), {"inconclusive": "fail"})
    assert body["exit_code"] == 1


def test_only_the_gated_metrics_and_conditions_count():
    s = summary_with(**{"decode_tok_s@in480-out8": (0.5, 0.6)})
    assert decide(s, {"conditions": ["in400-out8"]})["exit_code"] == 0
    assert decide(s, {"metrics": ["prefill_tok_s"]})["exit_code"] == 0
    body = decide(s, {"metrics": ["decode_tok_s"], "conditions": ["in480-out8"]})
    assert body["exit_code"] == 1 and len(body["cells"]) == 1


@pytest.mark.parametrize("gate,problem", [
    ({"metrics": ["ttft_ms"]}, "gate.metrics: ttft_ms is not a tested metric of this run (its primary metrics: "
                               "decode_tok_s, prefill_tok_s)"),
    ({"conditions": ["in999-out8"]}, "gate.conditions: in999-out8 is not a condition of this run"),
    ({"fail_slower_than": 0.005}, "gate.fail_slower_than: 0.005 is below the run's stats.noise 0.01"),
])
def test_a_policy_the_run_cannot_answer_is_invalid_exit_3(gate, problem):
    body = decide(summary_with(decode_tok_s=(0.5, 0.6)), gate)
    assert (body["decision"], body["exit_code"], body["cells"]) == ("invalid", 3, [])
    assert body["problems"][0].startswith(problem)
    assert body["reason"].startswith("the run is not valid: " + problem)


def test_a_summary_without_gated_metrics_is_invalid():
    s = summary_with()
    s["params"]["primary"] = []
    body = decide(s)
    assert body["exit_code"] == 3
    assert body["problems"] == ["the summary has no gated metric: the run tested no primary metric (stats.metrics)"]


def test_failed_validation_and_missing_records_are_invalid_never_a_pass():
    s = summary_with()  # every cell equivalent: a pass, but for its records
    disc = s["comparisons"]["candidate"]["disclosures"]
    disc["excluded"] = [{"row": 3, "arm": "candidate", "condition": "in400-out8", "round": 2, "attempt": 1,
                         "reason": "case python_function fail"},
                        {"row": 4, "arm": "candidate", "condition": "in400-out8", "round": 1, "attempt": 1,
                         "reason": "superseded by retry 1"}]
    body = decide(s)
    assert body["exit_code"] == 3
    assert body["problems"] == ["1 record(s) of candidate failed a gate or a validation case and were excluded "
                                "(first: candidate round 2 at in400-out8: case python_function fail)"]
    # at a condition the policy does not gate, it does not count
    assert decide(s, {"conditions": ["in480-out8"]})["exit_code"] == 0
    s = summary_with()
    s["comparisons"]["candidate"]["disclosures"]["unpaired"] = [{"arm": "baseline", "condition": "in480-out8", "round": 2}]
    assert decide(s)["problems"] == ["missing records: 1 round(s) have one arm only (first: baseline round 2 at "
                                     "in480-out8)"]
    s = summary_with()
    s["comparisons"]["candidate"]["paired"]["in480-out8"]["prefill_tok_s"]["n_pairs"] = 0
    assert decide(s)["problems"] == ["missing records: candidate prefill_tok_s at in480-out8 has no valid pair"]
    s = summary_with()
    s["run"]["rounds"]["run"] = 1
    assert decide(s)["problems"] == ["missing records: 1 of 2 planned rounds were measured"]


@pytest.mark.parametrize("gate,key", [({"inconclusive": "maybe"}, "gate.inconclusive"),
                                      ({"fail_slower_than": 2}, "gate.fail_slower_than"),
                                      ({"metrics": []}, "gate.metrics"), ({"colour": 1}, "gate.colour")])
def test_a_bad_policy_names_its_key(gate, key):
    with pytest.raises(pb_gate.GateError, match=rf"^{key}: "):
        pb_gate.Policy.from_config(gate)


def test_the_published_record_must_recompute():
    body = decide(summary_with(decode_tok_s=(0.90, 0.95)))
    assert pb_gate.gate_problems(body, summary_with(decode_tok_s=(0.90, 0.95))) == []
    forged = copy.deepcopy(body)
    forged.update(decision="pass", exit_code=0)
    forged["cells"][0]["ci_high"] = 1.2
    problems = pb_gate.gate_problems(forged, summary_with(decode_tok_s=(0.90, 0.95)))
    assert "gate.json: decision is 'pass', the measurements give 'regression'" in problems
    assert any(p.startswith("gate.json: cells[0] (candidate decode_tok_s at in400-out8): ci_high is 1.2") for p in problems)


# --- the views --------------------------------------------------------------------------------------

def test_markdown_shows_the_decision_the_cells_the_shas_and_the_report():
    body = decide(summary_with(decode_tok_s=(0.90, 0.95)), {"fail_slower_than": 0.02})
    md = gateviews.markdown(body)
    lines = md.splitlines()
    assert lines[0] == "## pairbench gate `ci`: regression (exit 1)"
    assert lines[2].startswith("A slowdown beyond 2%: candidate decode_tok_s at in400-out8")
    assert ("| candidate | in400-out8 | decode_tok_s (tok/s) | **regression** | inconclusive | 0.925x | "
            "[0.900, 0.950] | 98.75% | 6 | fail_slower_than: the interval lies wholly below 1 - 0.02 |") in lines
    assert "| candidate | candidate | embedded | git | `feature/x` | `222222222222` | — |" in lines
    assert "| baseline | baseline | embedded | git | `main` | `111111111111` | — |" in lines
    assert lines[-1] == "Full report: `results/ci/publish/README.md`"
    assert "http" not in md and "](" not in md  # link-free
    assert "Host: Test CPU, 2 logical CPUs, x86_64, Debian GNU/Linux 12 (bookworm)." in lines


def test_junit_has_one_case_per_cell_and_fails_the_regressions():
    body = decide(summary_with(decode_tok_s=(0.90, 0.95), prefill_tok_s=(0.96, 1.01)),
                  {"fail_slower_than": 0.02, "inconclusive": "fail"})
    root = ET.fromstring(gateviews.junit(body))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "4", "0")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["decode_tok_s at in400-out8", "prefill_tok_s at in400-out8",
                                              "decode_tok_s at in480-out8", "prefill_tok_s at in480-out8"]
    assert [c.find("failure").get("type") for c in cases] == ["regression", "inconclusive"] * 2
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["exit_code"] == "1" and props["arm.candidate"] == f"candidate embedded feature/x {SHA['head']}"
    passing = ET.fromstring(gateviews.junit(decide(summary_with(), {"fail_slower_than": 0.02}))).find("testsuite")
    assert passing.get("failures") == "0" and not passing.findall("testcase/failure")


def test_an_invalid_run_is_one_junit_error():
    body = decide(summary_with(), {"metrics": ["ttft_ms"]})
    suite = ET.fromstring(gateviews.junit(body)).find("testsuite")
    [case] = suite.findall("testcase")
    assert case.get("name") == "run is valid" and case.find("error").get("type") == "invalid"
    assert (suite.get("tests"), suite.get("errors")) == ("1", "1")
    assert gateviews.markdown(body).splitlines()[0] == "## pairbench gate `ci`: run not valid (exit 3)"
