"""Measurement against the fake engine: timings, the three gates (failed gates kept as flagged records),
and engine faults failing the visit."""

from pathlib import Path

import pytest

from pairbench.core.conditions import Condition
from pairbench.measure import visit as pb_measure
from pairbench.engines.client import StreamResult
from pairbench.engines.server import ServerError, ServerProcess

FAKE_SRC = Path(__file__).resolve().parents[1] / "fakes"
LENGTHS = [120, 150]
OUT = 6
CONDS = [Condition.of(input_tokens=n, output_tokens=OUT) for n in LENGTHS]  # in120-out6, in150-out6


def plan():
    return {"factors": ["input_tokens", "output_tokens"], "conditions": [c.to_dict() for c in CONDS], "seed": 0,
            "max_context": 512}


def prompts_for(length):
    """Byte-level fake: the chat template adds 19 tokens around the content ("user" turn + generation prompt)."""
    content = "x" * (length - 19)
    return {"messages": [{"role": "user", "content": content}]}


@pytest.fixture
def run(tmp_path, embedded_engine):
    def visit(*args, timeout=30.0, env=None):
        return _run(tmp_path, embedded_engine(FAKE_SRC, *args, env=env), timeout)
    return visit


def _run(tmp_path, engine, timeout, repeats=1, server=None):
    prompts = {c.id: {"condition": c.id, "rounds": [{"round": 1, **prompts_for(c.input_tokens)}]} for c in CONDS}
    fixtures = {c.id: {"condition": c.id, "rounds": [{"round": 1, "prompt_sha256": "0" * 64}]} for c in CONDS}
    server_cfg = {"threads": None, "startup_timeout_s": 30, "request_timeout_s": timeout, "stop_timeout_s": 5,
                  **(server or {})}
    return pb_measure.run_visit(
        visit={"index": 1, "round": 1, "arm": "a", "position": 0, "id": "r01-a"}, engine=engine,
        plan={**plan(), "repeats": repeats}, prompts=prompts, fixtures=fixtures, server_cfg=server_cfg,
        server_log=tmp_path / "server.log", inputs={})


def test_clean_visit_passes_every_gate(run):
    body, outputs = run()
    assert body["complete"] and body["first_request"]["ok"]
    assert body["native_version"] == "fake-engine 0.1.0-fake"
    for rec, c in zip(body["records"], CONDS):
        assert rec["ok"], rec["flags"]
        assert (rec["condition"], rec["input_tokens"], rec["output_tokens"]) == (c.id, c.input_tokens, OUT)
        assert rec["prompt_tokens"] == c.input_tokens and rec["completion_tokens"] == OUT and rec["tokens_cached"] == 0
        assert rec["ttft_ms"] > 0 and rec["e2e_ms"] >= rec["ttft_ms"]
        assert rec["decode_tok_s"] > 0 and rec["engine"]["decode_tok_s"] > 0
        assert len(outputs[c.id]["token_ids"]) == OUT
    assert body["server"]["stop"] == "sigterm"


def test_repeats_send_every_condition_in_turn_and_record_the_host(tmp_path, embedded_engine):
    import os

    body, outputs = _run(tmp_path, embedded_engine(FAKE_SRC), 30.0, repeats=3,
                         server={"pin": "auto", "external_load": 0.5})
    assert [(r["repeat"], r["condition"]) for r in body["records"]] == [(k, c.id) for k in (1, 2, 3) for c in CONDS]
    assert all(r["ok"] for r in body["records"])
    for c in CONDS:
        assert [x["repeat"] for x in outputs[c.id]["repeats"]] == [2, 3]
        assert outputs[c.id]["repeats"][0]["token_ids"] == outputs[c.id]["token_ids"]  # greedy: the same output
    host = body["host"]
    assert set(host) == {"load1_start", "load1_end", "cpus", "cpu_mhz", "governor", "server_cpus", "client_cpus",
                         "external_load", "external_load_threshold", "quiet", "node"}
    # the visit's record is whole: the public pseudonym in the body, the real host name only in the outputs
    import socket
    assert host["node"].startswith("node-") and socket.gethostname() not in host["node"]
    assert {outputs[c.id]["node"] for c in CONDS} == {socket.gethostname()}
    assert host["quiet"]["max_wait_s"] is None and host["quiet"]["waited_s"] == 0.0  # no server.quiet_wait_s
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:  # pinned for the visit, then the client's own affinity is back
        assert (host["server_cpus"], host["client_cpus"]) == (cpus[1:], cpus[:1])
        assert body["server"]["argv"] and sorted(os.sched_getaffinity(0)) == cpus
    assert host["external_load"] is (host["load1_start"] - 1.0 > 0.5)


def test_wrong_prompt_count_is_flagged_and_kept(run):
    body, _ = run("--prompt-extra", "1")
    for rec, n in zip(body["records"], LENGTHS):
        assert rec["input_tokens"] == n
        assert not rec["ok"] and rec["gates"]["prompt_tokens"] is False
        assert f"prompt_tokens: got {n + 1}, planned {n}" in rec["flags"]
        assert rec["decode_tok_s"] is not None, "a flagged record keeps its measurements"


def test_wrong_completion_count_is_flagged(run):
    body, _ = run(env={"FAKE_ENGINE_COMPLETION_SHORT": "2"})
    rec = body["records"][0]
    assert rec["gates"] == {"prompt_tokens": True, "completion_tokens": False, "cold_cache": True}
    assert rec["flags"] == [f"completion_tokens: got {OUT - 2}, planned {OUT}"]


def test_warm_cache_is_flagged(run):
    body, _ = run("--report-cached", "32")
    rec = body["records"][0]
    assert rec["gates"]["cold_cache"] is False and rec["tokens_cached"] == 32
    n = rec["input_tokens"]
    assert f"cold_cache: evaluated {n - 32} of {n} prompt tokens, 32 cached" in rec["flags"], rec["flags"]


# Engine faults are not samples: they fail the visit naming visit, arm, round and condition (issue 7;
# the config's `retries` re-attempts it). tests/recovery/test_faults.py covers each fault in depth.
def test_malformed_sse_fails_the_visit(run):
    with pytest.raises(pb_measure.VisitError, match=r"visit r01-a \(arm a, round 1, condition in120-out6, attempt 1\): "
                                                    r"engine fault: malformed SSE: event 1 is not JSON"):
        run("--malformed-sse", timeout=10.0)


def test_crash_mid_stream_fails_the_visit(run):
    # The fake dies 3 tokens into the first request (a diagnostic, kept apart); the first steady
    # request then finds no server.
    with pytest.raises(pb_measure.VisitError, match=r"condition in120-out6, attempt 1\): engine fault: .*exited with status 9"):
        run("--crash-after", "3", timeout=10.0)


def test_hanging_engine_times_out_and_fails_the_visit(run):
    with pytest.raises(pb_measure.VisitError, match=r"condition in120-out6, attempt 1\): engine fault: request timed out"):
        run("--hang", timeout=1.0)


def test_server_that_cannot_start_names_the_log(tmp_path, embedded_engine):
    engine = embedded_engine(FAKE_SRC, "--fail-start")
    with pytest.raises(ServerError, match=r"(?s)exited with status 3 before becoming healthy.*failing to start"):
        with ServerProcess(engine.launch, tmp_path / "s.log", startup_timeout_s=20):
            pass


def test_slow_start_is_waited_for(tmp_path, embedded_engine):
    with ServerProcess(embedded_engine(FAKE_SRC, "--slow-start", "1.0").launch, tmp_path / "s.log") as srv:
        assert srv.facts["ready_s"] >= 1.0
    assert srv.facts["stop"] == "sigterm" and not srv.alive()


def result(**kw):
    r = StreamResult(token_times=[0.1, 0.2, 0.3, 0.5], usage={"prompt_tokens": 10, "completion_tokens": 4},
                     timings={"prompt_n": 10, "prompt_ms": 50.0, "predicted_n": 4, "predicted_ms": 400.0},
                     tokens_cached=0, e2e_s=0.6, done=True)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_engine_decode_rate_counts_the_same_intervals_as_the_client():
    # predicted_ms spans the 3 decode steps after the first token (llama.cpp's convention)
    t = pb_measure.engine_timings({"prompt_n": 10, "prompt_ms": 50.0, "predicted_n": 4, "predicted_ms": 400.0})
    assert t["decode_tok_s"] == pytest.approx(3 / 0.4)
    assert t["decode_tok_s"] == pytest.approx(pb_measure.client_timings(result(), 10)["decode_tok_s"])


def test_client_timings_from_token_arrival():
    t = pb_measure.client_timings(result(), 10)
    assert t["ttft_ms"] == pytest.approx(100.0)
    assert t["decode_tok_s"] == pytest.approx(3 / 0.4)
    assert t["prefill_tok_s"] == pytest.approx(100.0)
    assert t["e2e_ms"] == pytest.approx(600.0)


def gate(engine, r, length=10, output_tokens=4):
    """The embedded engine's gates for one reply (the adapter every engine goes through)."""
    reply = {"usage": r.usage, "timings": r.timings, "tokens_cached": r.tokens_cached}
    return engine.gates(reply, length=length, output_tokens=output_tokens, streamed_tokens=len(r.token_times),
                        tokenize_count=None)


def test_cold_cache_needs_every_prompt_token_evaluated_and_none_cached(embedded_engine):
    engine = embedded_engine(FAKE_SRC)
    gates, flags, facts = gate(engine, result())
    assert gates == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True} and flags == []
    assert facts["cold_cache_proof"] == "strong" and facts["tokens_cached"] == 0
    gates, flags, _ = gate(engine, result(timings={"prompt_n": 6, "prompt_ms": 1.0, "predicted_ms": 1.0}))
    assert gates["cold_cache"] is False and flags == ["cold_cache: evaluated 6 of 10 prompt tokens"]
    gates, flags, _ = gate(engine, result(tokens_cached=4))
    assert gates["cold_cache"] is False and flags == ["cold_cache: evaluated 10 of 10 prompt tokens, 4 cached"]
    gates, flags, _ = gate(engine, result(timings=None))
    assert gates["cold_cache"] is None and flags == ["cold_cache: reply lacks timings.prompt_n"]


def test_streamed_count_must_match_usage(embedded_engine):
    gates, flags, _ = gate(embedded_engine(FAKE_SRC), result(token_times=[0.1, 0.2]))
    assert gates["completion_tokens"] is False and flags == ["completion_tokens: 2 tokens streamed, planned 4"]


def test_a_pinned_server_runs_on_its_cpus_only(tmp_path, embedded_engine):
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("pinning needs two usable CPUs")  # CI machines have two
    with ServerProcess(embedded_engine(FAKE_SRC).launch, tmp_path / "s.log", cpus=cpus[1:]) as srv:
        assert sorted(os.sched_getaffinity(srv.proc.pid)) == cpus[1:]
        assert srv.facts["cpus"] == cpus[1:]
    assert sorted(os.sched_getaffinity(0)) == cpus  # the launcher itself is untouched
