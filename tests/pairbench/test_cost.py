"""The cost channel's runner (pairbench.measure.cost): callgrind's output read back, the cycle
formula, and the faults that skip the channel. The simulated runs themselves are
tests/pairbench/test_cost_simulated.py."""

from pathlib import Path

import pytest

from pairbench.measure import cost

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
