"""engine/isa.py: the instruction-set path is chosen by measurement and cached per CPU model.

The cache tests are hermetic: the CPU, the cache file and the measurement are stand-ins (a table
with exact figures), so what is checked is the choice and the cache's handling, not this machine.
One test times the real kernels on tiny shapes, for the shape of what ``measure`` returns.
"""

from __future__ import annotations

import json

import pytest

from engine import isa, native

needs_native = pytest.mark.usefixtures("native_kernels")

HERE = {"vendor": "GenuineIntel", "model_name": "Xeon Test", "family": "6", "model": "143", "stepping": "8",
        "paths": ["avx2", "avx512vnni"]}
ELSEWHERE = {**HERE, "vendor": "AuthenticAMD", "model_name": "EPYC Test", "family": "25", "model": "17"}
# The Intel host of issue 35: AVX-512 VNNI the slowest of the paths it runs.
TABLE = {"avx2": {"rows1_ms": 8.4, "rows8_ms": 26.9}, "avx512vnni": {"rows1_ms": 11.4, "rows8_ms": 34.4}}


def test_the_fastest_path_is_the_least_time_relative_to_the_best_at_both_row_counts():
    assert isa.fastest(TABLE) == "avx2"
    # each wins one row count: the sum of the relative times decides
    split = {"avx2": {"rows1_ms": 10.0, "rows8_ms": 33.0}, "avxvnni": {"rows1_ms": 10.5, "rows8_ms": 30.0}}
    assert isa.fastest(split) == "avxvnni"  # avx2: 1 + 1.1 = 2.1; avxvnni: 1.05 + 1 = 2.05
    tie = {"avx512vnni": {"rows1_ms": 5.0, "rows8_ms": 5.0}, "avx2": {"rows1_ms": 5.0, "rows8_ms": 5.0}}
    assert isa.fastest(tie) == "avx2"  # a tie goes to the narrower path


@pytest.fixture()
def rig(tmp_path, monkeypatch):
    """isa.choose against a cache file in tmp_path, a stand-in CPU, a measurement that returns TABLE
    (counted), and a path setter that records what it was asked for."""
    calls = {"measure": 0, "set": []}
    monkeypatch.setattr(native, "lib", lambda: object())
    monkeypatch.setattr(native, "isa_forced", lambda: False)
    monkeypatch.setattr(native, "isa", lambda: calls["set"][-1] if calls["set"] else "avx512vnni")
    monkeypatch.setattr(native, "set_default_isa", lambda name: calls["set"].append(name) or True)
    monkeypatch.setattr(isa, "cache_path", lambda: tmp_path / "isa.json")
    monkeypatch.setattr(isa, "cpu", lambda: dict(HERE))

    def measure(step, paths, reps=5, budget_s=6.0):
        calls["measure"] += 1
        return {p: TABLE[p] for p in paths}

    monkeypatch.setattr(isa, "measure", measure)
    monkeypatch.setattr(isa, "_state", {"source": None, "table": None, "cpu": None})
    return calls, tmp_path / "isa.json"


STEP = [("q4_1", None, 960, 576)]


def test_a_cpu_without_an_entry_is_measured_once_then_read_from_the_cache(rig):
    calls, path = rig
    facts = isa.choose(STEP)
    assert facts["isa"] == "avx2" and facts["source"] == "measured" and calls["measure"] == 1
    doc = json.loads(path.read_text())
    entry = doc["cpus"][isa.cpu_key(HERE)]
    assert doc["schema"] == isa.CACHE_SCHEMA and entry["choice"] == "avx2" and entry["table_ms"] == TABLE
    assert entry["shapes"] == "1x q4_1 960x576"
    facts = isa.choose(STEP)
    assert facts["source"] == "cache" and calls["measure"] == 1 and calls["set"] == ["avx2", "avx2"]
    assert isa.choose(STEP, remeasure=True)["source"] == "measured" and calls["measure"] == 2


def test_a_cache_from_another_cpu_model_is_not_used_and_is_kept(rig, capsys):
    calls, path = rig
    other = {"choice": "avx512vnni", "table_ms": {}, "shapes": "", "measured": ""}
    path.write_text(json.dumps({"schema": isa.CACHE_SCHEMA, "cpus": {isa.cpu_key(ELSEWHERE): other}}))
    facts = isa.choose(STEP)
    assert facts["source"] == "measured" and facts["isa"] == "avx2" and calls["measure"] == 1
    err = capsys.readouterr().err
    assert "EPYC Test" in err and "Xeon Test" in err and "measuring" in err
    cpus = json.loads(path.read_text())["cpus"]
    assert cpus[isa.cpu_key(ELSEWHERE)] == other and cpus[isa.cpu_key(HERE)]["choice"] == "avx2"


def test_the_same_model_name_with_other_paths_is_another_cpu(rig):
    """A guest whose hypervisor hides AVX-512 from one node is not handed the other node's choice."""
    calls, path = rig
    masked = {**HERE, "paths": ["avx2", "avxvnni"]}
    path.write_text(json.dumps({"schema": isa.CACHE_SCHEMA, "cpus": {isa.cpu_key(masked): {"choice": "avxvnni"}}}))
    assert isa.choose(STEP)["source"] == "measured" and calls["set"] == ["avx2"]


@pytest.mark.parametrize("content", ["{broken", json.dumps({"schema": "someone-else/v9", "cpus": {}}),
                                     json.dumps({"schema": isa.CACHE_SCHEMA, "cpus": []})])
def test_an_unreadable_cache_is_measured_over_with_a_warning(rig, capsys, content):
    calls, path = rig
    path.write_text(content)
    assert isa.choose(STEP)["source"] == "measured" and calls["measure"] == 1
    assert "ignoring the instruction-set cache" in capsys.readouterr().err
    assert json.loads(path.read_text())["schema"] == isa.CACHE_SCHEMA


def test_a_cached_choice_this_cpu_cannot_run_is_measured_over(rig):
    calls, path = rig
    path.write_text(json.dumps({"schema": isa.CACHE_SCHEMA, "cpus": {isa.cpu_key(HERE): {"choice": "avxvnni"}}}))
    assert isa.choose(STEP)["source"] == "measured" and calls["set"] == ["avx2"]


def test_the_environment_wins_and_nothing_is_measured(rig, monkeypatch):
    calls, path = rig
    monkeypatch.setattr(native, "isa_forced", lambda: True)
    assert isa.choose(STEP)["source"] == "env" and calls["measure"] == 0 and not path.exists()


def test_no_step_and_no_cache_keeps_the_flags_choice_and_writes_nothing(rig):
    calls, path = rig
    facts = isa.choose(None)
    assert facts["source"] == "flags" and calls["measure"] == 0 and not path.exists()
    assert isa.choose(lambda: STEP)["source"] == "measured"  # a step made only when needed


def test_one_path_is_nothing_to_choose(rig, monkeypatch):
    calls, path = rig
    monkeypatch.setattr(isa, "cpu", lambda: {**HERE, "paths": ["avx2"]})
    assert isa.choose(STEP)["source"] == "only" and calls["measure"] == 0 and not path.exists()


@needs_native
def test_measure_times_every_path_asked_and_restores_the_pool_and_path():
    step = isa.synthetic_step([("q4_1", 64, 576), ("q8_0", 96, 576)])
    assert [(f, tuple(b.shape), n, k) for f, b, n, k in step] == [("q4_1", (64, 360), 64, 576),
                                                                 ("q8_0", (96, 612), 96, 576)]
    before_isa, before_threads = native.isa(), native.threads()
    paths = [p for p in native.ISAS if native.isa_supported(p)]
    table = isa.measure(step, paths, reps=2)
    assert set(table) == set(paths)
    assert all(0 < v["rows1_ms"] < 1000 and 0 < v["rows8_ms"] < 1000 for v in table.values())
    assert native.isa() == before_isa and native.threads() == before_threads
