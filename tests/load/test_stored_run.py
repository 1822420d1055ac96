"""A stored load run's levels, measured before the level metrics moved from the measure job into the
statistics (tests/data/load-v3: measure/v3 level records, with the metrics and validity the measure job
computed, and their private request bodies), rewritten in today's shape and judged by today's
definitions (pairbench.analysis.loadlevel.judged): every metric, every validity check, the flags and
``ok`` come out as the measure job had them. tests/load/stored_run.py does the same for a whole run
folder and compares its summary.json and tables."""

import json
import math
from pathlib import Path

import jsonschema
import pytest

from pairbench.analysis.loadlevel import judged
from pairbench.core.artifacts import load_schema
from tests.load.stored_run import level_record_v4, measure_v4

STORED = Path(__file__).resolve().parents[1] / "data" / "load-v3" / "r02-candidate.json"


@pytest.fixture(scope="module")
def stored():
    return json.loads(STORED.read_text())


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_today_s_definitions_give_the_stored_metrics_from_the_raw_times(stored):
    records = [level_record_v4(lv["record"], lv["levelrun"]["level"]) for lv in stored["levels"]]
    assert all("metrics" not in r and "validity" not in r for r in records)
    body = judged({"records": records}, stored["plan"])
    assert len(body["records"]) == 3
    for lv, rec in zip(stored["levels"], body["records"]):
        old = lv["record"]
        # then: mode, concurrency and rate_rps; today one name, the condition's load factor and its value
        then = {k: v for k, v in old["metrics"].items() if k not in ("mode", "concurrency", "rate_rps")}
        now = {k: v for k, v in rec["metrics"].items() if k not in ("factor", "target")}
        assert same(now, then), {k: (now.get(k), then.get(k)) for k in set(now) | set(then)
                                 if not same(now.get(k), then.get(k))}
        assert (rec["metrics"]["factor"], rec["metrics"]["target"]) == (old["metrics"]["mode"],
                                                                         old["metrics"]["concurrency"])
        assert rec["validity"] == old["validity"] and rec["flags"] == old["flags"] and rec["ok"] == old["ok"]
        assert rec["metrics"]["n_ok"] == 12 and rec["metrics"]["output_tok_s"] > 0


def test_a_level_the_old_definitions_failed_fails_again(stored):
    # the stored level at 4 streams, judged under a lag bound its turnaround exceeds: the same check fails
    lv = next(lv for lv in stored["levels"] if lv["record"]["condition"].endswith("-c4"))
    rec = level_record_v4(lv["record"], lv["levelrun"]["level"])
    lag = lv["record"]["metrics"]["lag_p99_ms"]
    plan = {"load": {**stored["plan"]["load"], "validity": {**stored["plan"]["load"]["validity"],
                                                            "lag_p99_ms": lag / 2}}}
    out = judged({"records": [rec]}, plan)["records"][0]
    assert out["ok"] is False and out["validity"]["failed"] == ["schedule_lag"]
    assert out["flags"] == [out["validity"]["messages"][0]] and f"{lag:.1f} ms exceeds" in out["flags"][0]


def test_the_rewritten_visit_is_a_valid_measure_artifact(stored):
    body = measure_v4({"visit": {"index": 4, "round": 2, "arm": "candidate", "position": 0, "id": "r02-candidate"},
                       "records": [lv["record"] for lv in stored["levels"]]},
                      {lv["record"]["condition"]: lv["levelrun"] for lv in stored["levels"]})
    schema = load_schema("measure")
    assert schema["$id"] == "pairbench.measure/v4"
    for level in body["records"]:  # each level record against measure/v4's definition of one
        jsonschema.validate(level, {"$defs": schema["$defs"], "$ref": "#/$defs/level"})
    level = body["records"][0]
    assert set(level["client"]) == {"wall_s", "cpu_s", "offered_rate_rps", "requests"}
    first = level["client"]["requests"][0]
    old = stored["levels"][0]["levelrun"]["level"]["records"][0]
    assert first["token_s"][0] == pytest.approx(old["ttft_ms"] / 1e3, rel=1e-15)
    assert len(first["token_s"]) == old["streamed_tokens"] == 16
