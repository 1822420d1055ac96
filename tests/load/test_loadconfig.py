"""A load run's config: every default, and every bad input caught before anything runs, naming its key."""

import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from pairbench.core import config as pb_config
from pairbench.core import conditions, loadconfig, plan as pb_plan
from pairbench.engines.policy import check_slots
from pairbench.stages import runconfig

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "workflow/schemas/config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())


def cfg(load=None, **over):
    c = {"label": "t", "model": "tiny", "arms": {"baseline": {"args": ["--parallel", "4"]},
                                                 "candidate": {"args": ["--parallel", "4"]}},
         "lengths": [400], "output_tokens": 8, "rounds": 2, "seed": 0,
         "load": {"concurrency": [1, 2, 4], "requests": 20, "percentiles": [50, 90], "slo": {"ttft_ms": 500}}}
    if load is not None:
        c["load"] = load
    c.update(over)
    return c


def problems(c) -> list[str]:
    return [str(e) for e in runconfig.problems(c, REPO, SCHEMA_PATH)]


def test_the_code_s_defaults_are_the_schema_s():
    props = SCHEMA["properties"]["load"]["properties"]
    for key, value in loadconfig.LOAD_DEFAULTS.items():
        want = props[key]["default"]
        if isinstance(value, dict):
            want = {k: v["default"] for k, v in props[key]["properties"].items()}
        assert want == value, key


def test_a_load_config_plans_levels_with_counterbalanced_orders():
    assert problems(cfg()) == []
    body = pb_plan.make_plan(cfg(), REPO)
    ids = [c["id"] for c in body["conditions"]]
    assert ids == ["in400-out8-c1", "in400-out8-c2", "in400-out8-c4"]
    assert body["factors"] == ["input_tokens", "output_tokens", "concurrency"]
    assert body["load"]["level_orders"] == {"1": ids, "2": ids}  # one ABBA block of two rounds: forward
    # the direction flips once per visit-order block, crossed with each arm's place in the round
    assert [loadconfig.level_order(ids, r, 2) for r in (1, 2, 3, 4, 5)] == [ids, ids, ids[::-1], ids[::-1], ids]
    assert body["load"]["factor"] == "concurrency" and body["load"]["requests"] == 20
    n = pb_config.normalized(cfg())
    assert n["stats"]["metrics"] == ["output_tok_s", "ttft_p90_ms"]  # the highest percentile's TTFT
    assert n["stats"]["memory"] == []


def test_a_single_stream_config_has_no_load_key_so_its_plan_hash_is_unchanged():
    single = cfg()
    single.pop("load")
    filled = {**single, "load": {"concurrency": None, "rate": None, **{k: v for k, v in loadconfig.LOAD_DEFAULTS.items()
                                                                      if k not in ("concurrency", "rate")}}}
    assert "load" not in pb_config.normalized(single)
    assert "load" not in pb_config.normalized(filled)  # what the schema's defaults fill in
    assert pb_plan.config_sha256(single) == pb_plan.config_sha256(filled)
    assert "load" not in pb_plan.make_plan(single, REPO)


def test_rate_levels_are_floats_in_their_ids():
    c = cfg(load={"rate": [0.5, 2], "requests": 20, "percentiles": [50, 90]})
    assert problems(c) == []
    assert [x.id for x in conditions.conditions(pb_config.normalized(c))] == ["in400-out8-r0.5", "in400-out8-r2"]


@pytest.mark.parametrize("load, key, words", [
    ({"concurrency": [1, 2], "rate": [1.0]}, "load", "not both"),
    ({"requests": 40}, "load", "not neither"),
    ({"concurrency": [4, 2], "requests": 20, "percentiles": [50, 90]}, "load.concurrency", "must increase"),
    ({"concurrency": [1, 2], "requests": 40}, "load.requests", "too few for the p99 latencies (needs 100"),
    ({"concurrency": [1, 8], "requests": 5, "warmup": 2, "percentiles": [50], "allow_queueing": True},
     "load.requests", "cannot hold 8 streams busy"),
    ({"rate": [1.0, 200.0], "requests": 20, "percentiles": [50, 90]}, "load.rate[1]",
     "about 1.06 of a CPU core"),
    ({"concurrency": [1], "requests": 20, "percentiles": [50, 90], "slo": {"attainment": 0.9, "ttft_ms": -1}},
     "load.slo.ttft_ms", ""),
    ({"concurrency": [1], "requests": 20, "percentiles": [50, 75]}, "load.percentiles.1", ""),
])
def test_bad_load_input_names_its_key(load, key, words):
    found = problems(cfg(load=load))
    assert found, load
    assert any(f.startswith(f"{key}: ") or f.startswith(f"config key '{key}'") for f in found), found
    assert any(words in f for f in found), found


def test_more_streams_than_an_arm_s_slots_names_the_arm_unless_queueing_is_allowed():
    c = cfg(arms={"baseline": {"args": ["--parallel", "2"]}, "candidate": {"args": ["--parallel", "4"]}})
    assert problems(c) == [
        "arms.baseline.args: arm baseline serves 2 request(s) at once (--parallel 2), fewer than "
        "load.concurrency's 4 streams: the rest would wait in its queue. Give it [--parallel, \"4\"] in args, or "
        "set load.allow_queueing: true to measure the queue on purpose"]
    c["load"]["allow_queueing"] = True
    assert problems(c) == []
    # llama-server: the profile's own --parallel 1 is overridden by the arm's last one
    ls = {"engine": "llama-server", "source": {"git": "x", "tag": "t"}}
    both = {"baseline": {**ls, "args": ["--parallel", "4"]}, "candidate": {**ls}}
    assert [str(e) for e in check_slots(pb_config.normalized(cfg(arms=both)))] == [
        "arms.candidate.args: arm candidate serves 1 request(s) at once (--parallel 1), fewer than "
        "load.concurrency's 4 streams: the rest would wait in its queue. Give it [--parallel, \"4\"] in args, or "
        "set load.allow_queueing: true to measure the queue on purpose"]


def test_metrics_of_the_other_scope_name_stats_metrics():
    c = cfg(stats={"metrics": ["decode_tok_s"]})
    assert any(f.startswith("stats.metrics: decode_tok_s cannot be measured here: a load run") for f in problems(c))
    single = cfg(stats={"metrics": ["output_tok_s"]})
    single.pop("load")
    assert any(f.startswith("stats.metrics: output_tok_s cannot be measured here: a run without load")
               for f in problems(single))
    assert any(f.startswith("repeats: a load run measures each level once") for f in problems(cfg(repeats=2)))


def test_a_load_run_s_stats_defaults_come_before_the_schema_s_single_stream_ones():
    c = pb_config.normalized(cfg())
    assert c["stats"]["metrics"] == ["output_tok_s", "ttft_p90_ms"] and c["stats"]["memory"] == []
    assert c["stats"]["alpha"] == 0.05 and c["load"]["requests"] == 20 and c["load"]["validity"]["lag_p99_ms"] == 20.0
    jsonschema.Draft202012Validator(SCHEMA).validate(c)  # a normalized config is one the schema accepts
    given = cfg()
    given["stats"] = {"metrics": ["output_tok_s"]}
    assert pb_config.normalized(given)["stats"]["secondary"] == ["requests_s", "goodput_rps", "itl_p90_ms", "e2e_p90_ms"]


@pytest.mark.parametrize("stats, load, match", [
    ({"metrics": ["output_tok_s", "ttft_p99_ms"]}, {"percentiles": [50, 90]},
     r"stats\.metrics\[1\]: ttft_p99_ms needs p99 in load\.percentiles"),
    ({"metrics": ["output_tok_s"], "secondary": ["goodput_rps"]}, {"slo": {}},
     r"stats\.secondary\[0\]: goodput_rps needs an SLO"),
    ({"metrics": ["goodput_rps"]}, {}, r"stats\.metrics\[0\]: goodput_rps cannot be tested"),
])
def test_stats_lists_that_a_load_run_cannot_fill_are_refused_by_name(stats, load, match):
    bad = cfg()
    bad["stats"] = {**(bad.get("stats") or {}), **stats}
    bad["load"] = {**bad["load"], **load}
    found = problems(bad)
    assert any(re.search(match, e) for e in found), found


def test_without_an_slo_the_defaults_show_no_goodput():
    bad = cfg()
    del bad["load"]["slo"]
    assert problems(bad) == []
    assert "goodput_rps" not in pb_config.normalized(bad)["stats"]["secondary"]


def test_a_fractional_looking_stream_count_is_refused_by_name():
    found = problems(cfg(load={"concurrency": [1, 2.0], "requests": 20, "percentiles": [50, 90]}))
    assert any(e.startswith("load.concurrency[1]: 2.0 streams: a number of streams is a whole number") for e in found), found
