"""Unit tests for pairbench.engines.profiles: profile loading/validation, templating, opt-in, reply gates."""

from pathlib import Path

import pytest
import yaml

from pairbench import engines as E

PROFILES = ["embedded", "llama-cpp-python", "llama-server", "sglang", "vllm"]


def test_every_shipped_profile_loads():
    assert E.available_profiles() == PROFILES
    for name in PROFILES:
        p = E.load_profile(name)
        assert p.name == name
        s = p.summary()
        assert s["cold_cache_proof"] in {"strong", "weak", "none"}
        assert s["prefix_cache_disabled_by"] and s["output_length_forced_by"]


def test_proof_strength_per_engine():
    proof = {n: E.load_profile(n).cold_cache_proof for n in PROFILES}
    assert proof == {"embedded": "strong", "llama-server": "strong", "vllm": "weak",
                     "sglang": "weak", "llama-cpp-python": "strong"}
    assert not E.load_profile("embedded").external
    assert all(E.load_profile(n).external for n in PROFILES if n != "embedded")


def _copy_profile(tmp_path: Path, name: str, edit) -> Path:
    root = tmp_path / "engines"
    root.mkdir(exist_ok=True)
    data = yaml.safe_load((E.PROFILE_DIR / f"{name}.yaml").read_text())
    edit(data)
    (root / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return root


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.pop("cold_cache"), r"field '<root>': 'cold_cache' is a required property"),
    (lambda d: d["health"].update(ready_timeout_s=0), r"field 'health\.ready_timeout_s'"),
    (lambda d: d.update(colour="red"), r"'colour' was unexpected"),
    (lambda d: d["launch"]["argv"].append("--gpu={gpu}"), r"launch\.argv\[\d+\]: unknown placeholder \{gpu\}"),
    (lambda d: d["launch"]["argv"].remove("--no-enable-prefix-caching"),
     r"prefix_cache\.launch_flags: '--no-enable-prefix-caching' is not in launch\.argv"),
    (lambda d: d["launch"]["argv"].remove("--enable-prompt-tokens-details"),
     r"cold_cache\.requires_flags: '--enable-prompt-tokens-details'"),
    (lambda d: d.update(name="other"), r"field 'name' is 'other', expected the file stem 'vllm'"),
    (lambda d: d["build"].update(command=["make"]),
     r"build\.install installs the arm; give it without build\.command or build\.cmake"),
    (lambda d: d["build"]["install"]["command"].append("--gpu={gpu}"),
     r"build\.install\.command\[\d+\]: unknown placeholder \{gpu\}"),
    (lambda d: d["build"]["install"].pop("module"), r"field 'build\.install': 'module' is a required property"),
    (lambda d: d.update(model_formats=["onnx"]), r"field 'model_formats\.0': 'onnx' is not one of"),
    (lambda d: d["tokenize"].pop("path"), r"field 'tokenize': 'path' is a required property"),
    (lambda d: d["tokenize"].update(route="model"),
     r"tokenize\.route model reads the model directory's tokenizer\.json, so model_formats must be \[hf\]"),
    (lambda d: (d["tokenize"].update(route="model"), d.update(model_formats=["hf"]), d["tokens"].update(prompt="tokenize")),
     r"tokenize\.route model with tokens\.prompt tokenize would check the prompt count against the same local "
     r"tokenizer"),
])
def test_bad_profile_names_file_and_field(tmp_path, edit, match):
    root = _copy_profile(tmp_path, "vllm", edit)
    with pytest.raises(E.EngineError, match=match) as err:
        E.load_profile("vllm", root)
    assert "vllm.yaml" in str(err.value)


def test_cache_off_request_field_must_really_be_sent(tmp_path):
    root = _copy_profile(tmp_path, "llama-server", lambda d: d["request"].update(fields={}))
    with pytest.raises(E.EngineError, match=r"prefix_cache\.request_fields\.cache_prompt = False is not sent"):
        E.load_profile("llama-server", root)


def test_text_tokenizer_with_chat_mode_is_refused(tmp_path):
    root = _copy_profile(tmp_path, "sglang", lambda d: d["api"].update(mode="chat"))
    with pytest.raises(E.EngineError, match="tokenize.input is text but api.mode is chat"):
        E.load_profile("sglang", root)


def test_unknown_profile_lists_available():
    with pytest.raises(E.EngineError, match=r"no profile 'tgi'.*available: embedded, llama-cpp-python"):
        E.load_profile("tgi")


def test_launch_threads_and_env():
    p = E.load_profile("llama-cpp-python")
    one = E.launch_spec(p, {"threads": 1}, port=9001, model="/m/a.gguf", ctx=600, src_dir="/tmp/s")
    two = E.launch_spec(p, {"threads": 2, "env": {"LLAMA_X": 3}}, port=9001, model="/m/a.gguf", ctx=600,
                        src_dir="/tmp/s")
    assert one.argv[one.argv.index("--n_threads") + 1] == "1"
    assert two.argv[two.argv.index("--n_threads_batch") + 1] == "2"
    assert [a for a in one.argv if a not in ("1", "2")] == [a for a in two.argv if a not in ("1", "2")]
    assert two.env == {"LLAMA_X": "3"} and one.env == {}
    assert one.health_url == "http://127.0.0.1:9001/v1/models"
    # No threads: the flag and its value both disappear (the server keeps its own default).
    none = E.launch_spec(p, {}, port=9001, model="/m/a.gguf", ctx=600, src_dir="/tmp/s")
    assert "--n_threads" not in none.argv and "--n_threads_batch" not in none.argv
    # vLLM takes threads through the environment, and drops it when unset.
    v = E.load_profile("vllm")
    assert E.launch_spec(v, {"threads": 4}, port=1, model="m", ctx=9, src_dir="/s").env == {"OMP_NUM_THREADS": "4"}
    assert E.launch_spec(v, {}, port=1, model="m", ctx=9, src_dir="/s").env == {}


def test_launch_override_and_extra_args():
    p = E.load_profile("llama-server")
    spec = E.launch_spec(p, {"threads": 2, "args": ["--flash-attn", "on"]}, port=5, model="m.gguf",
                         ctx=512, src_dir="/tmp/tree")
    assert spec.argv[0] == "/tmp/tree/build/bin/llama-server" and spec.argv[-2:] == ["--flash-attn", "on"]
    assert spec.cwd == "/tmp/tree"
    with pytest.raises(E.EngineError, match=r"arm launch\[1\]: unknown placeholder \{gpus\}"):
        E.launch_spec(p, {"launch": ["x", "{gpus}"]}, port=5, model="m", ctx=1, src_dir="/t")
    v = E.load_profile("vllm")
    with pytest.raises(E.EngineError, match="needs '--no-enable-prefix-caching'"):
        E.launch_spec(v, {"launch": ["vllm", "serve", "{model}", "--port", "{port}"]}, port=5, model="m",
                      ctx=1, src_dir="/t")


def test_render_keeps_types_and_names_missing_values():
    assert E.render({"min_tokens": "{output_tokens}", "x": "a{port}"}, {"output_tokens": 64, "port": 1}) == \
        {"min_tokens": 64, "x": "a1"}
    with pytest.raises(E.EngineError, match=r"req\.n: placeholder \{model\} has no value"):
        E.render({"n": "{model}"}, {"port": 1}, "req")


def test_request_bodies_per_engine():
    msgs = [{"role": "user", "content": "hi"}]
    path, body = E.load_profile("vllm").generation_body(messages=msgs, factors={"output_tokens": 32}, seed=1)
    assert path == "/v1/chat/completions" and body["messages"] == msgs
    assert body["ignore_eos"] is True and body["min_tokens"] == 32 and body["stream_options"] == {"include_usage": True}
    path, body = E.load_profile("llama-cpp-python").generation_body(prompt="p", factors={"output_tokens": 8}, seed=0)
    assert path == "/v1/completions" and body["prompt"] == "p" and body["min_tokens"] == 8
    assert "stream_options" not in body and "ignore_eos" not in body
    path, body = E.load_profile("llama-server").generation_body(prompt="p", factors={"output_tokens": 8}, seed=0)
    assert body["cache_prompt"] is False and body["ignore_eos"] is True
    with pytest.raises(E.EngineError, match="completions mode needs the rendered prompt"):
        E.load_profile("sglang").generation_body(messages=msgs, factors={"output_tokens": 8}, seed=0)


def test_tokenize_requests_and_counts():
    assert E.load_profile("sglang").tokenize_request(text="ab") == ("/v1/tokenize", {"prompt": "ab", "add_special_tokens": True})
    assert E.load_profile("llama-cpp-python").tokenize_request(text="ab") == ("/extras/tokenize", {"input": "ab"})
    msgs = [{"role": "user", "content": "x"}]
    assert E.load_profile("vllm").tokenize_request(messages=msgs)[1]["messages"] == msgs
    v = E.load_profile("vllm")
    assert v.token_count({"tokens": [1, 2, 3], "count": 3}) == 3
    with pytest.raises(E.EngineError, match="says count 4 but lists 3"):
        v.token_count({"tokens": [1, 2, 3], "count": 4})
    with pytest.raises(E.EngineError, match="no 'tokens' list"):
        v.token_count({"count": 3})


def test_cold_cache_evidence():
    ls = E.load_profile("llama-server")
    ok = E.cold_cache_evidence(ls, {"timings": {"prompt_n": 256, "cache_n": 0}}, 256)
    assert ok["cold"] is True and ok["proof"] == "strong" and ok["flag"] is None
    warm = E.cold_cache_evidence(ls, {"timings": {"prompt_n": 200, "cache_n": 56}}, 256)
    assert warm["cold"] is False and "evaluated 200 of 256" in warm["flag"]
    assert E.cold_cache_evidence(ls, {}, 256)["cold"] is None
    v = E.load_profile("vllm")
    assert E.cold_cache_evidence(v, {"usage": {"prompt_tokens": 256}}, 256)["cold"] is True  # absent = miss
    hit = E.cold_cache_evidence(v, {"usage": {"prompt_tokens_details": {"cached_tokens": 240}}}, 256)
    assert hit["cold"] is False and "240 of 256" in hit["flag"]



def test_cold_cache_evidence_from_the_server_log():
    """llama-cpp-python: the per-request log is the evidence (llama_perf_context_print + prefix hits)."""
    p = E.load_profile("llama-cpp-python")
    perf = "llama_perf_context_print: prompt eval time =      40.12 ms /   {n:>3} tokens (    0.16 ms per token)\n"
    cold = E.cold_cache_evidence(p, {"usage": None}, 256, log_text=perf.format(n=256))
    assert cold == {"proof": "strong", "cold": True, "evaluated_tokens": 256, "cached_tokens": 0, "flag": None}
    hit = "Llama.generate: 30 prefix-match hit, remaining 226 prompt tokens to eval\n" + perf.format(n=226)
    warm = E.cold_cache_evidence(p, {}, 256, log_text=hit)
    assert warm["cold"] is False and warm["cached_tokens"] == 30 and "evaluated 226 of 256" in warm["flag"]
    two = E.cold_cache_evidence(p, {}, 256, log_text=perf.format(n=256) * 2)
    assert two["cold"] is None and "2 prompt-evaluation lines" in two["flag"]
    assert E.cold_cache_evidence(p, {}, 256)["cold"] is None  # no log: unproven, not passed
    unproven = E.cold_cache_evidence(E.load_profile("vllm"), {"usage": {"prompt_tokens_details": "x"}}, 9)
    assert unproven["cold"] is None


def test_profile_without_any_evidence_is_unproven(tmp_path):
    def strip(d):
        d["cold_cache"] = {"proof": "none", "how": "nothing"}
        d["launch"]["argv"] = [a for a in d["launch"]["argv"]]
    root = _copy_profile(tmp_path, "llama-cpp-python", strip)
    p = E.load_profile("llama-cpp-python", root)
    ev = E.cold_cache_evidence(p, {"usage": {}}, 256, log_text="")
    assert ev["cold"] is None and ev["proof"] == "none" and "unproven" in ev["flag"]


def test_native_counts_sources():
    v = E.load_profile("vllm")
    assert E.native_counts(v, {"usage": {"prompt_tokens": 5, "completion_tokens": 7}}) == (5, 7)
    l = E.load_profile("llama-cpp-python")
    assert E.native_counts(l, {}, tokenize_count=5, streamed_tokens=7) == (5, 7)


def test_log_prefix_hits():
    l = E.load_profile("llama-cpp-python")
    log = "x\nLlama.generate: 12 prefix-match hit, remaining 3 prompt tokens to eval\nLlama.generate: 5 prefix-match hit, r"
    assert E.count_log_prefix_hits(l, log) == [12, 5]
    assert E.count_log_prefix_hits(E.load_profile("vllm"), log) is None


def _cfg(**arms):
    return {"label": "t", "model": "m.gguf", "rounds": 2, "lengths": [64], "output_tokens": 8, "arms": arms}


def test_opt_in_blocks_external_and_shows_plan():
    cfg = _cfg(one={"engine": "llama-cpp-python", "threads": 1}, two={"engine": "llama-cpp-python", "threads": 2})
    with pytest.raises(E.ExternalEngineNotAllowed) as err:
        E.check_opt_in(cfg)
    msg = str(err.value)
    assert "allow_external" in msg and "arm one: engine llama-cpp-python (EXTERNAL)" in msg
    assert "--n_threads 1" in msg and "--n_threads 2" in msg and "cold-cache proof: strong" in msg
    assert E.check_opt_in({**cfg, "allow_external": True}) == ["one", "two"]


def test_opt_in_not_needed_for_embedded_but_needed_for_git_source():
    assert E.check_opt_in(_cfg(a={}, b={"patches": ["p.patch"]})) == []
    cfg = _cfg(a={}, b={"source": {"git": "https://example.invalid/engine.git", "tag": "v1"}})
    with pytest.raises(E.ExternalEngineNotAllowed, match="git https://example.invalid/engine.git at tag v1"):
        E.check_opt_in(cfg)


def test_a_plan_s_refusal_names_its_conditions():
    # plan.json records conditions, not lengths: the refusal of an external engine says what it would measure
    plan = {"label": "t", "model": {"name": "m", "kind": "gguf"}, "rounds": 2, "allow_external": False,
            "arms": {"a": {}, "b": {"engine": "llama-cpp-python", "threads": 1}},
            "conditions": [{"id": "in64-out8", "input_tokens": 64, "output_tokens": 8},
                           {"id": "in128-out8", "input_tokens": 128, "output_tokens": 8}]}
    with pytest.raises(E.ExternalEngineNotAllowed) as err:
        E.plan_opt_in(plan)
    assert str(err.value).splitlines()[-1] == "  2 rounds x 2 condition(s): in64-out8, in128-out8"
    assert "None" not in str(err.value)
    assert E.plan_opt_in({**plan, "allow_external": True}) == ["b"]


def test_render_chat_prompt_from_gguf(smollm2_gguf):
    text = E.render_chat_prompt(smollm2_gguf, [{"role": "user", "content": "Hello"}])
    assert text.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
