"""One exchange with an engine (pairbench.engines.adapter.ArmEngine.exchange) owns a measured request:
the body built from the condition, the count, the stream read in the engine's shape, the gates.

Two extensions the exchange is for, each through a real visit (pairbench.measure.visit.run_visit,
unchanged) against a real server (tests/engines/toy_server.py):

- a request-visible condition factor (a temperature) is one entry in core/conditions.py's factors
  plus the engine profile's request template; measure/ does not change, and an engine whose profile
  does not send the factor refuses the request rather than measure without it;
- a server that streams another shape (one JSON object a line, no server-sent events) is a small
  subclass of ArmEngine overriding one method, read so in a steady visit and in a load level alike.
"""

import json
import sys
from pathlib import Path

import pytest
import yaml

from pairbench.analysis.loadlevel import judged
from pairbench.core import conditions
from pairbench.core.conditions import Condition, Factor
from pairbench.engines.adapter import ADAPTERS, ArmEngine, adapter_class, register_adapter
from pairbench.engines.client import ClientError, StreamResult
from pairbench.engines.profiles import EngineError, load_profile
from pairbench.measure import visit as pb_visit

REPO = Path(__file__).resolve().parents[2]
PROFILES = Path(__file__).resolve().parent / "profiles"
SERVER = {"threads": None, "startup_timeout_s": 30, "request_timeout_s": 30, "stop_timeout_s": 5}
VISIT = {"index": 1, "round": 1, "arm": "a", "position": 0, "id": "r01-a"}


def toy_profile(tmp_path: Path, name: str = "toy", **fields):
    """The toy's profile (tests/engines/profiles/toy.yaml) as *name*, its request fields plus *fields*."""
    data = yaml.safe_load((PROFILES / "toy.yaml").read_text())
    data["name"] = name
    data["request"]["fields"].update(fields)
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return load_profile(name, tmp_path)


def toy_engine(cls, profile, *args: str, load: bool = False) -> ArmEngine:
    return cls(profile, {"args": list(args), "threads": None}, model="toy", model_path=None, ctx=4096, src_dir=REPO,
               repo_root=REPO, python=sys.executable, load=load)


def inputs_for(conds: list[Condition], requests: int | None = None) -> tuple[dict, dict]:
    """Prompts and fixtures of round 1: each prompt exactly its input tokens (one per character)."""
    def msgs(c, i=0):
        return {"messages": [{"role": "user", "content": chr(ord("k") + i) * c.input_tokens}]}

    prompts, fixtures = {}, {}
    for c in conds:
        if requests is None:
            prompts[c.id] = {"rounds": [{"round": 1, **msgs(c)}]}
            fixtures[c.id] = {"rounds": [{"round": 1, "prompt_sha256": "0" * 64}]}
        else:
            prompts[c.id] = {"rounds": [{"round": 1, "requests": [msgs(c, i) for i in range(requests)]}]}
            fixtures[c.id] = {"rounds": [{"round": 1, "requests": [{"prompt_sha256": "0" * 64}] * requests}]}
    return prompts, fixtures


def visit(tmp_path, engine, conds, plan_extra=None, requests=None):
    prompts, fixtures = inputs_for(conds, requests)
    plan = {"conditions": [c.to_dict() for c in conds], "seed": 0, **(plan_extra or {})}
    return pb_visit.run_visit(visit=VISIT, engine=engine, plan=plan, prompts=prompts, fixtures=fixtures,
                              server_cfg=SERVER, server_log=tmp_path / "server.log", inputs={})


# --- a request-visible factor: core/conditions.py plus the profile's template ------------------------

TEMPERATURE = Factor("temperature", "t", "temperature", "temperature {}", kind=float, request=True)


@pytest.fixture
def temperature_factor(monkeypatch):
    """The one change core/conditions.py gets for a temperature factor: its entry in FACTORS."""
    monkeypatch.setattr(conditions, "FACTORS", (*conditions.FACTORS, TEMPERATURE))
    monkeypatch.setattr(conditions, "BY_NAME", {f.name: f for f in conditions.FACTORS})
    monkeypatch.setattr(conditions, "BY_PREFIX", {f.prefix: f for f in conditions.FACTORS})


def test_a_temperature_factor_reaches_the_engine_through_the_profile_template_alone(tmp_path, temperature_factor):
    profile = toy_profile(tmp_path, temperature="{temperature}")  # the profile's one change
    record = tmp_path / "bodies.jsonl"
    conds = [Condition.of(input_tokens=40, output_tokens=4, temperature=t) for t in (0.0, 0.7)]
    assert [c.id for c in conds] == ["in40-out4-t0", "in40-out4-t0.7"]
    body, outputs = visit(tmp_path, toy_engine(ArmEngine, profile, "--record", str(record)), conds)
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    # the first request of the launch (a diagnostic, under no temperature) keeps the greedy default;
    # each steady request carries its condition's temperature
    assert [b["temperature"] for b in sent] == [0, 0.0, 0.7]
    assert [b["max_tokens"] for b in sent] == [8, 4, 4]
    for rec, c in zip(body["records"], conds):
        assert (rec["condition"], rec["temperature"], rec["input_tokens"]) == (c.id, c["temperature"], 40)
        assert rec["ok"] and rec["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
        assert outputs[c.id]["text"] == "abcd"


def test_an_engine_whose_profile_does_not_send_the_factor_refuses_to_measure(tmp_path, temperature_factor):
    engine = toy_engine(ArmEngine, toy_profile(tmp_path))  # no {temperature} in its request fields
    cond = Condition.of(input_tokens=40, output_tokens=4, temperature=0.7)
    with pytest.raises(EngineError, match=r"toy.yaml: the condition's request-visible factor\(s\) temperature "
                                          r"reach no request field: name each in request.fields"):
        engine.request([{"role": "user", "content": "x"}], cond, 0)
    with pytest.raises(pb_visit.VisitError, match=r"condition in40-out4-t0.7, attempt 1\): engine fault: .*"
                                                   r"temperature reach no request field"):
        visit(tmp_path, engine, [cond])


def test_a_request_template_may_name_condition_factors_only(tmp_path):
    with pytest.raises(EngineError, match=r"request.temprature: unknown placeholder \{temprature\}.*condition factor"):
        toy_profile(tmp_path, temprature="{temprature}")


# --- a server of another stream shape: one overridden method ----------------------------------------

class NdjsonToy(ArmEngine):
    """The toy's newline-delimited JSON: ``{"token": {"id", "text"}}`` per token, last ``{"done": true}``
    with the usage and timings."""

    def read_line(self, result: StreamResult, line: str, now: float) -> bool:
        if not line.strip():
            return False
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise ClientError(f"malformed NDJSON: {line[:80]!r}") from None
        if event.get("done"):
            result.usage, result.timings, result.tokens_cached = event["usage"], event["timings"], event["tokens_cached"]
            return True
        result.text += event["token"]["text"]
        result.token_ids.append(event["token"]["id"])
        result.token_times.append(now)
        return False


@pytest.fixture
def ndjson_adapter():
    register_adapter("toy-ndjson")(NdjsonToy)
    yield NdjsonToy
    ADAPTERS.pop("toy-ndjson")


def test_a_server_streaming_ndjson_is_one_subclass_in_a_steady_visit(tmp_path, ndjson_adapter):
    profile = toy_profile(tmp_path, name="toy-ndjson")
    assert adapter_class(profile.name) is NdjsonToy  # registered under the profile's name
    conds = [Condition.of(input_tokens=n, output_tokens=5) for n in (30, 50)]
    body, outputs = visit(tmp_path, toy_engine(adapter_class(profile.name), profile, "--shape", "ndjson",
                                               "--token-s", "0.005"), conds)
    assert body["first_request"]["ok"] and body["first_request"]["completion_tokens"] == 8
    for rec, c in zip(body["records"], conds):
        assert rec["ok"], rec["flags"]
        assert (rec["prompt_tokens"], rec["completion_tokens"], rec["tokens_cached"]) == (c.input_tokens, 5, 0)
        assert rec["ttft_ms"] > 0 and rec["decode_tok_s"] > 0 and rec["e2e_ms"] >= rec["ttft_ms"]
        assert outputs[c.id]["text"] == "abcde" and outputs[c.id]["token_ids"] == [97, 98, 99, 100, 101]


def test_the_base_adapter_cannot_read_the_ndjson_server(tmp_path):
    engine = toy_engine(ArmEngine, toy_profile(tmp_path), "--shape", "ndjson")
    with pytest.raises(pb_visit.VisitError, match=r"engine fault: stream ended without \[DONE\] after 0 tokens"):
        visit(tmp_path, engine, [Condition.of(input_tokens=30, output_tokens=5)])


def test_a_server_streaming_ndjson_is_one_subclass_in_a_load_level(tmp_path, ndjson_adapter):
    profile = toy_profile(tmp_path, name="toy-ndjson")
    cond = Condition.of(input_tokens=30, output_tokens=4, concurrency=2)
    load = {"warmup": 1, "requests": 6, "level_orders": {"1": [cond.id]}, "timeout_s": 30.0, "prefix": "distinct",
            "percentiles": [50], "validity": {"lag_p99_ms": 1000.0, "client_cpu_share": 1.0}, "slo": {}}
    engine = toy_engine(NdjsonToy, profile, "--shape", "ndjson", "--token-s", "0.005", load=True)
    body, outputs = visit(tmp_path, engine, [cond], plan_extra={"load": load}, requests=7)
    (rec,) = body["records"]
    assert rec["kind"] == "level" and rec["gates"] == {"prompt_tokens": True, "completion_tokens": True,
                                                       "cold_cache": True}
    assert [len(q["token_s"]) for q in rec["client"]["requests"]] == [4] * 7
    assert outputs[cond.id]["text"] == "abcd"
    (level,) = judged(body, {"load": load})["records"]
    assert level["metrics"]["n_ok"] == 6 and level["metrics"]["output_tok_s"] > 0, level["flags"]
