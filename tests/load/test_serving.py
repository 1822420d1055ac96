"""How a server serves a load run, from its profile: slots, the single-stream caps a load run drops,
the context a shared-context server gets, the idle probe, and the fixtures of a load level."""

import json
from pathlib import Path

import pytest

from pairbench.core.conditions import Condition
from pairbench.engines import serving
from pairbench.engines.adapter import arm_adapter
from pairbench.engines.profiles import EngineError, load_profile
from pairbench.measure import fixtures as pb_fixtures
from pairbench.measure.loadvisit import aggregate_gates

from tests.load.conftest import start_fake, stop

REPO = Path(__file__).resolve().parents[2]


def adapter(engine: str, load: bool, **arm):
    return arm_adapter({"engine": engine, **arm}, model="m.gguf", model_path=None, ctx=200, src_dir=REPO,
                       repo_root=REPO, load=load)


def test_slots_are_the_last_flag_of_the_command_line_else_the_profile_s_default():
    spec = serving.load_spec(load_profile("llama-server"))
    assert serving.slots_in(spec, ["x", "--parallel", "1", "--parallel", "4"]) == 4
    assert serving.slots_in(spec, ["x", "--parallel=3"]) == 3
    assert serving.slots_in(spec, ["x"]) == 1
    with pytest.raises(EngineError, match=r"--parallel 'four'"):
        serving.slots_in(spec, ["--parallel", "four"])
    assert serving.slots_in(serving.load_spec(load_profile("sglang")), ["x"]) is None  # unknown: not checked


def test_a_load_run_drops_vllm_s_one_sequence_cap_and_a_single_stream_run_keeps_it():
    single = adapter("vllm", load=False).launch(8000).argv
    loaded = adapter("vllm", load=True).launch(8000).argv
    assert "--max-num-seqs" in single and single[single.index("--max-num-seqs") + 1] == "1"
    assert "--max-num-seqs" not in loaded and [a for a in single if a not in ("--max-num-seqs", "1")] == loaded
    assert adapter("vllm", load=True).slots == 256
    assert adapter("vllm", load=True, args=["--max-num-seqs", "8"]).slots == 8


def test_llama_server_gets_its_context_times_its_slots_in_a_load_run():
    argv = adapter("llama-server", load=True, args=["--parallel", "4"]).launch(8000).argv
    assert argv[argv.index("--ctx-size") + 1] == "800"
    argv = adapter("llama-server", load=False, args=["--parallel", "4"]).launch(8000).argv
    assert argv[argv.index("--ctx-size") + 1] == "200"  # a single-stream run is launched as it always was
    embedded = adapter("embedded", load=True, args=["--parallel", "4"]).launch(8000).argv
    assert embedded[embedded.index("--max-context") + 1] == "200"  # every slot's own context


def test_the_cache_state_each_profile_gives():
    assert adapter("embedded", load=True).cache_state()["how"] == "request"
    assert adapter("vllm", load=True).cache_state()["how"] == "launch"
    assert adapter("llama-cpp-python", load=True).cache_state()["how"] == "unproven"  # a flush per request


def test_the_idle_probe_reads_the_batching_fake_s_gauges(tmp_path):
    proc, url = start_fake(tmp_path / "fake.log", "--parallel", "2")
    try:
        import httpx

        spec = serving.load_spec(load_profile("vllm"))
        with httpx.Client(trust_env=False) as http:
            state = serving.wait_idle(spec, http, url, timeout_s=5)
        assert state["verified"] is True
        assert state["busy"] == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    finally:
        stop(proc)
    none = serving.wait_idle(serving.load_spec(load_profile("sglang")), None, "http://x", timeout_s=1)
    assert none == {"verified": False, "waited_s": 0.0, "busy": None, "how": "no idle probe in the engine's profile"}


def test_prometheus_gauges_sum_over_labels():
    text = ('# TYPE a gauge\na{model="x"} 2\na{model="y"} 1\nb 0\nbb 7\n')
    assert serving._prometheus(text, ("a", "b")) == {"a": 3.0, "b": 0.0}


def byte_tokenizer(messages):
    text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages)
    return [b for b in text.encode()]


def test_a_load_fixture_holds_one_prompt_per_request_each_with_its_own_salt_and_exact_length():
    cond = Condition.of(input_tokens=400, output_tokens=8, concurrency=2)
    calls = []

    def tok(messages):
        calls.append(1)
        return byte_tokenizer(messages)

    fixture, prompts = pb_fixtures.build_fixture(cond, 0, {"1": "aaaa0000", "2": "bbbb1111"}, "a", tok, requests=5)
    for rnd, prnd in zip(fixture["rounds"], prompts["rounds"]):
        salts = [q["salt"] for q in rnd["requests"]]
        assert len(set(salts)) == 5 and [q["index"] for q in rnd["requests"]] == list(range(5))
        assert all(q["prompt_tokens"] == 400 for q in rnd["requests"])
        assert all(len(q["token_ids"]) == 400 for q in prnd["requests"])
        assert rnd["salt"] == salts[0] and prnd["messages"] == prnd["requests"][0]["messages"]
        assert all(q["messages"][0]["content"].startswith(f"Session {s}.") for q, s in zip(prnd["requests"], salts))
    assert len({q["salt"] for r in fixture["rounds"] for q in r["requests"]}) == 10
    # every fit after the first starts from the previous word count: no bisection, so fewer calls than
    # fitting each prompt from scratch (the byte tokenizer's pads cost the same either way)
    scratch = []
    for rnd in fixture["rounds"]:
        for q in rnd["requests"]:
            pb_fixtures.fit_round(400, q["salt"], 0, pb_fixtures.tasks.render_task(pb_fixtures.tasks.task_for(400)),
                                  lambda m: scratch.append(1) or byte_tokenizer(m))
    assert len(calls) <= len(scratch) - 9 * 5  # bisection: ~9 calls per prompt, the hint ~3
    pb_fixtures.check_tokenizer(fixture, prompts, "b", byte_tokenizer)
    assert fixture["checked_by"] == ["a", "b"]
    with pytest.raises(pb_fixtures.FixtureError, match=r"round 2, request 3: the arms' tokenizers disagree"):
        def off_at_8th(messages, n=[0]):
            n[0] += 1
            ids = byte_tokenizer(messages)
            return ids + [1] if n[0] == 9 else ids
        pb_fixtures.check_tokenizer(fixture, prompts, "c", off_at_8th)


def test_a_level_s_gates_fail_when_one_request_fails_one_and_say_how_many():
    ok = {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
    reqs = [{"index": i, "gates": dict(ok), "flags": [], "facts": {}} for i in range(4)]
    reqs[2] = {"index": 2, "gates": {**ok, "cold_cache": False}, "flags": ["cold_cache: 16 of 400 prompt tokens served "
                                                                            "from cache"], "facts": {}}
    reqs[3] = {"index": 3, "gates": {g: None for g in ok}, "flags": ["request failed: x"], "facts": None}
    gates, failures, flags = aggregate_gates(reqs)
    assert gates == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": False}
    assert failures["cold_cache"] == 1 and failures["cold_cache_unproven"] == 0
    assert flags == ["cold_cache: failed for 1 of 4 requests (request 2: cold_cache: 16 of 400 prompt tokens served "
                     "from cache)"]
    json.dumps(failures)
