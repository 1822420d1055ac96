"""The cost channel's runner (pairbench.measure.cost): callgrind's output read back, the cycle
formula, and the faults that skip the channel. The simulated runs themselves are
tests/pairbench/test_cost_simulated.py."""

from pathlib import Path

import pytest

from pairbench.measure import cost

REPO = Path(__file__).resolve().parents[2]

# A callgrind dump as callgrind 3.19 writes one (header, then cost lines), cut short; the totals line
# leaves the trailing zero events out, as callgrind does.
DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 21718
cmd:  /usr/bin/python3 cost_driver.py request.json
part: 2


desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 8388608 B, 64 B, 16-way associative

desc: Timerange: Basic block 533520946 - 562920426
desc: Trigger: Client Request: in256-out64:decode

positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 0

ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(1) ???
fn=(1) memcpy
0 1000 300 100 10 20 5 2 8 1
totals: 1000 300 100 10 20 5 2 8
"""


def test_a_dump_reads_back_as_its_label_and_totals_with_the_missing_trailing_event_as_zero():
    label, counts = cost.parse_callgrind(DUMP)
    assert label == "in256-out64:decode"
    assert counts.events == {"Ir": 1000, "Dr": 300, "Dw": 100, "I1mr": 10, "D1mr": 20, "D1mw": 5, "ILmr": 2,
                             "DLmr": 8, "DLmw": 0}


def test_estimated_cycles_are_l1_hits_plus_5_ll_hits_plus_35_ram_accesses():
    c = cost.Counts({"Ir": 1000, "Dr": 300, "Dw": 100, "I1mr": 10, "D1mr": 20, "D1mw": 5, "ILmr": 2, "DLmr": 8,
                     "DLmw": 1})
    # 1400 accesses; 35 missed L1, of which 11 missed the last level too:
    # L1 hits 1365, last-level hits 24, RAM 11 -> 1365 + 5 * 24 + 35 * 11 = 1870
    assert c.levels() == {"l1_hits": 1365, "ll_hits": 24, "ram": 11}
    assert c.estimated_cycles() == 1870
    assert c.instructions == 1000


def test_without_the_cache_simulated_there_are_instructions_and_no_cycles():
    label, counts = cost.parse_callgrind("events: Ir\ndesc: Trigger: Client Request: x:prefill\ntotals: 4242\n")
    assert (label, counts.instructions, counts.estimated_cycles(), counts.levels()) == ("x:prefill", 4242, None, None)


def test_a_dump_made_by_dump_after_is_labelled_by_its_trigger():
    text = "desc: Trigger: --dump-after=llama_process\nevents: Ir\nsummary: 7\n"
    assert cost.parse_callgrind(text) == ("--dump-after=llama_process", cost.Counts({"Ir": 7}))


def test_a_file_with_no_totals_is_unreadable():
    with pytest.raises(cost.CostUnavailable) as e:
        cost.parse_callgrind("events: Ir\n")
    assert e.value.reason == "unreadable"


def test_dumps_are_read_in_the_order_written_the_final_one_last(tmp_path: Path):
    for name, n in [("callgrind.out.10", 10), ("callgrind.out.2", 2), ("callgrind.out", 99), ("callgrind.out.1", 1)]:
        (tmp_path / name).write_text(f"events: Ir\ndesc: Trigger: Client Request: d{n}\ntotals: {n}\n")
    assert [label for label, _ in cost.read_dumps(tmp_path, "callgrind.out")] == ["d1", "d2", "d10", "d99"]


def test_phase_costs_are_per_token():
    pc = cost.PhaseCost(cost.Counts({"Ir": 800, "Dr": 0, "Dw": 0, "I1mr": 0, "D1mr": 0, "D1mw": 0, "ILmr": 0,
                                     "DLmr": 0, "DLmw": 0}), 8)
    assert pc.per_token()["instructions"] == 100
    assert pc.per_token()["estimated_cycles"] == 100


def test_the_command_line_pins_the_simulated_caches_and_counts_only_where_told(tmp_path: Path):
    argv = cost.callgrind_argv(tmp_path / "out", cost.CostOptions(cache_sim=True), instr_atstart=False)
    assert "--instr-atstart=no" in argv and "--cache-sim=yes" in argv
    assert {"--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64"} <= set(argv)
    argv = cost.callgrind_argv(tmp_path / "out", cost.CostOptions(cache_sim=False), toggle_collect="f",
                               dump_after="f")
    assert "--cache-sim=yes" not in argv and "--toggle-collect=f" in argv and "--dump-after=f" in argv


def test_no_valgrind_on_the_path_is_a_reason_not_a_crash(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(cost.CostUnavailable) as e:
        cost.valgrind_version()
    assert e.value.reason == "no_valgrind" and "valgrind" in str(e.value)


def test_hardware_counters_say_why_not_when_perf_is_missing(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cost.hardware_counters() == "perf is not installed"


# --- the artifact, the verdicts beside wall time, the report ------------------------------------------

from pairbench.analysis import cost as cost_verdicts  # noqa: E402
from pairbench.core.artifacts import read_artifact, write_artifact  # noqa: E402
from pairbench.core.metrics import COST_NAMES  # noqa: E402
from pairbench.publish.report import cost_section  # noqa: E402


def _events(ir: int) -> dict:
    return {"Ir": ir, "Dr": ir // 4, "Dw": ir // 10, "I1mr": 0, "D1mr": 0, "D1mw": 0, "ILmr": 0, "DLmr": 0, "DLmw": 0}


def _arm(decode_ir: int, prefill_ir: int = 40_000_000) -> cost.ArmCost:
    c = cost.ArmCost("valgrind-callgrind", "valgrind-3.19.0", duration_s=12.5, facts={"isa": "avx2", "src": "/home/x"})
    c.conditions["in256-out8"] = {"prefill": cost.PhaseCost(cost.Counts(_events(prefill_ir)), 256),
                                  "decode": cost.PhaseCost(cost.Counts(_events(decode_ir)), 8)}
    return c


def _body(arm: str, decode_ir: int) -> dict:
    return cost.artifact_body(arm, "embedded", cost.CostOptions(phases=("prefill", "decode")), cost=_arm(decode_ir))


def test_a_counted_arm_is_a_schema_checked_artifact_of_counts_per_token(tmp_path: Path):
    body = {**_body("baseline", 8_000_000), "inputs": {}}
    write_artifact(tmp_path / "cost.json", "cost", body)
    back = read_artifact(tmp_path / "cost.json", "cost")
    decode = next(r for r in back["rows"] if r["phase"] == "decode")
    # no cache misses: every access an L1 hit, so cycles = Ir + Dr + Dw = 8M + 2M + 0.8M, over 8 tokens
    assert decode["metrics"] == {COST_NAMES.decode_instructions_per_tok: 1_000_000,
                                 COST_NAMES.decode_cycles_per_tok: 1_350_000}
    assert back["status"] == "counted" and back["facts"] == {"isa": "avx2"}  # no paths


def test_an_arm_not_counted_says_why_without_the_host_s_paths(tmp_path: Path):
    why = cost.CostUnavailable("failed", "the cost driver exited with status 1; see /home/alice/run/logs/cost/tool.log")
    body = {**cost.artifact_body("candidate", "embedded", cost.CostOptions(), unavailable=why), "inputs": {}}
    write_artifact(tmp_path / "cost.json", "cost", body)
    assert (body["status"], body["reason"], body["rows"]) == ("unavailable", "failed", [])
    assert body["message"] == "the cost driver exited with status 1; see tool.log"


SUMMARY = {"baseline": "baseline", "params": {"noise": 0.01},
           "comparisons": {"candidate": {"paired": {"in256-out8": {"decode_tok_s": {"verdict": "inconclusive",
                                                                                     "hl_ratio": 0.985}}}}}}


def _rows(body: dict, metric: str) -> dict:
    return next(r for r in body["rows"] if r["metric"] == metric)


def test_the_cost_verdict_sits_beside_the_wall_clock_metric_the_run_tests():
    # config/llama-cpp.yaml tests the engine's own timings; the client's are shown untested (verdict None)
    paired = {"decode_tok_s": {"verdict": None, "hl_ratio": 1.05},
              "engine_decode_tok_s": {"verdict": "inconclusive", "hl_ratio": 1.052}}
    summary = {**SUMMARY, "comparisons": {"candidate": {"paired": {"in256-out8": paired}}}}
    body = cost_verdicts.compare(summary, {"baseline": _body("baseline", 8_000_000), "candidate": _body("candidate", 8_160_000)},
                                 same={"candidate": False})
    row = _rows(body, COST_NAMES.decode_instructions_per_tok)
    assert (row["wall_metric"], row["wall_verdict"], row["wall_ratio"]) == ("engine_decode_tok_s", "inconclusive", 1.052)
    # where the run tests the client's figure, that one (the default config)
    row = _rows(cost_verdicts.compare(SUMMARY, {"baseline": _body("baseline", 8_000_000),
                                                "candidate": _body("candidate", 8_160_000)}, same={"candidate": False}),
                COST_NAMES.decode_instructions_per_tok)
    assert row["wall_metric"] == "decode_tok_s"


def test_arms_counted_two_ways_compare_instructions_but_not_simulated_cycles():
    base, cand = _body("baseline", 8_000_000), _body("candidate", 8_160_000)
    base["facts"], cand["facts"] = {"counting": "wrapped"}, {"counting": "toggle-collect"}
    body = cost_verdicts.compare(SUMMARY, {"baseline": base, "candidate": cand}, same={"candidate": False})
    assert _rows(body, COST_NAMES.decode_instructions_per_tok)["verdict"] == "slower"
    cycles = _rows(body, COST_NAMES.decode_cycles_per_tok)
    assert cycles["verdict"] == "inconclusive" and "counted differently" in cycles["reason"]


def test_two_percent_more_decode_instructions_is_slower_where_wall_time_is_inconclusive():
    body = cost_verdicts.compare(SUMMARY, {"baseline": _body("baseline", 8_000_000), "candidate": _body("candidate", 8_160_000)},
                                 same={"candidate": False})
    row = _rows(body, COST_NAMES.decode_instructions_per_tok)
    assert row["ratio"] == pytest.approx(1.02) and row["verdict"] == "slower"
    assert (row["wall_metric"], row["wall_verdict"], row["wall_ratio"], row["agreement"]) == \
        ("decode_tok_s", "inconclusive", 0.985, "undecided")
    # the prompt's counts are the same in both arms that differ: the change runs no counted prefill instruction
    assert _rows(body, COST_NAMES.prefill_instructions_per_tok)["verdict"] == "not exercised"


def test_an_a_a_pair_counts_the_same_and_is_equivalent():
    body = cost_verdicts.compare(SUMMARY, {"baseline": _body("baseline", 8_000_000), "candidate": _body("candidate", 8_000_000)},
                                 same={"candidate": True})
    assert {r["verdict"] for r in body["rows"]} == {"equivalent"}
    assert all(r["ratio"] == 1.0 for r in body["rows"])


def test_both_channels_claiming_differently_is_a_disagreement():
    summary = {**SUMMARY, "comparisons": {"candidate": {"paired": {"in256-out8": {
        "decode_tok_s": {"verdict": "faster", "hl_ratio": 1.2}}}}}}
    body = cost_verdicts.compare(summary, {"baseline": _body("baseline", 8_000_000), "candidate": _body("candidate", 8_400_000)},
                                 same={"candidate": False})
    row = _rows(body, COST_NAMES.decode_instructions_per_tok)
    assert (row["verdict"], row["wall_verdict"], row["agreement"]) == ("slower", "faster", "disagree")
    assert body["agreement_counts"]["disagree"] == 2  # instructions and cycles


def test_an_arm_not_counted_gives_no_rows_and_the_report_names_it_with_its_reason(tmp_path: Path):
    why = cost.CostUnavailable("no_valgrind", "valgrind is not installed (Debian: apt-get install valgrind)")
    costs = {"baseline": _body("baseline", 8_000_000),
             "candidate": cost.artifact_body("candidate", "embedded", cost.CostOptions(), unavailable=why)}
    body = {**cost_verdicts.compare(SUMMARY, costs, same={"candidate": False}), "inputs": {}}
    write_artifact(tmp_path / "cost_summary.json", "cost_summary", body)
    assert body["rows"] == []
    text = "\n".join(cost_section(body))
    assert "`candidate` (embedded): **not counted** (no_valgrind): valgrind is not installed" in text
    assert "not counted `candidate` (no_valgrind" in text.replace("Not counted: ", "not counted ")


def test_the_report_shows_each_cost_verdict_beside_the_wall_clock_one():
    body = cost_verdicts.compare(SUMMARY, {"baseline": _body("baseline", 8_000_000), "candidate": _body("candidate", 8_160_000)},
                                 same={"candidate": False})
    text = "\n".join(cost_section(body))
    assert "| `candidate` | `in256-out8` | instructions per decode token (simulated) | 1,000,000 | 1,020,000 | 1.0200 | " \
           "slower | `decode_tok_s` inconclusive (0.985) | undecided |" in text
    assert "AVX-512" in text and "not exercised" in text


def test_the_cost_channel_counts_planned_conditions_only():
    from pairbench.stages.measure import CostChannel

    plan = {"conditions": [{"id": "in256-out8", "input_tokens": 256, "output_tokens": 8},
                           {"id": "in1024-out8", "input_tokens": 1024, "output_tokens": 8}]}
    opts = dict(phases=["decode"], decode_tokens=8, cache_sim=True, timeout_s=900)
    assert [c.id for c in CostChannel.from_rule({**opts, "conditions": ["in1024-out8"]}).selected(plan)] == ["in1024-out8"]
    with pytest.raises(ValueError, match="in512-out8 not planned"):
        CostChannel.from_rule({**opts, "conditions": ["in512-out8"]}).selected(plan)
    # "shortest" follows the lengths: the default config names no id, so `--config lengths=[...]` works
    plan_rev = {"conditions": plan["conditions"][::-1]}
    for p in (plan, plan_rev):
        assert [c.id for c in CostChannel.from_rule({**opts, "conditions": "shortest"}).selected(p)] == ["in256-out8"]
    assert len(CostChannel.from_rule({**opts, "conditions": None}).selected(plan)) == 2


def test_the_default_config_counts_its_shortest_condition_and_a_wrong_word_is_named():
    from pairbench.core.configsource import ConfigErrors
    from pairbench.stages.runconfig import load_config

    cfg = load_config([REPO / "config/config.yaml"], root=REPO)
    assert cfg["cost"]["enabled"] is True and cfg["cost"]["conditions"] == "shortest"
    # names no condition id, so other lengths need no other cost key
    assert load_config([REPO / "config/config.yaml"], {"lengths": [512, 64]}, root=REPO)["lengths"] == [512, 64]
    with pytest.raises(ConfigErrors, match="cost.conditions"):
        load_config([REPO / "config/config.yaml"], {"cost": {"conditions": "longest"}}, root=REPO)


def test_the_cost_job_s_scratch_is_removed_without_touching_what_its_links_name(tmp_path: Path):
    """private/cost/work holds a copy of an arm's tree, a link to the model and callgrind's dumps: the
    job removes it as it ends, and the model behind the link survives."""
    from pairbench.stages.measure import drop_scratch

    model = tmp_path / "resources" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"weights")
    work = tmp_path / "private" / "cost" / "work"
    (work / "src" / "engine").mkdir(parents=True)
    (work / "src" / "engine" / "kernel.py").write_text("x = 1\n")
    (work / "callgrind.out.1").write_text("events: Ir\n")
    (work / "model").symlink_to(model)
    (work / "src" / "tree").symlink_to(tmp_path / "resources", target_is_directory=True)
    drop_scratch(work)
    assert not (tmp_path / "private" / "cost").exists() and (tmp_path / "private").is_dir()
    assert model.read_bytes() == b"weights"
    # a private/cost that holds something else is kept; a second call (nothing left) is harmless
    work.mkdir(parents=True)
    (tmp_path / "private" / "cost" / "note").write_text("kept")
    drop_scratch(work)
    drop_scratch(work)
    assert not work.exists() and (tmp_path / "private" / "cost" / "note").read_text() == "kept"
