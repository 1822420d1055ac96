"""The adapter registry (a subclass per profile name, pairbench.engines.adapter.register_adapter) and the
typed accessors through which everything outside pairbench.engines reads a profile."""

from pathlib import Path

import pytest
import yaml

from pairbench.engines import adapter as A
from pairbench.engines.profiles import (PROFILE_DIR, ColdCacheSpec, CrosscheckSpec, EngineError, FlushSpec,
                                        TokenizeSpec, load_profile)

PLAN = {"arms": {"cand": {"engine": "embedded", "source": "engine"}}, "max_context": 600, "allow_external": False}
BUILD = {"conversion": None, "model": {"name": "tiny", "kind": "named", "arg": "tiny"}}


def for_arm(arm_cfg, tmp_path, plan=PLAN):
    return A.for_arm(arm_cfg, build=BUILD, plan=plan, arm_dir=tmp_path, server_cfg={"threads": 2}, root=tmp_path)


@pytest.fixture
def registry(monkeypatch):
    """An empty registry for this test only (the shipped one is left as it was)."""
    monkeypatch.setattr(A, "ADAPTERS", {})
    return A


def test_a_subclass_registered_by_profile_name_is_what_for_arm_builds(registry, tmp_path):
    @registry.register_adapter("embedded")
    class Quirky(A.ArmEngine):
        def flush(self, http, url):
            self.flushed = url

    engine = for_arm({"engine": "embedded"}, tmp_path)
    assert type(engine) is Quirky and engine.name == "embedded" and engine.arm["threads"] == 2
    engine.flush(None, "http://x")
    assert engine.flushed == "http://x"
    assert registry.adapter_class("embedded") is Quirky and registry.adapter_class("vllm") is A.ArmEngine
    assert type(A.arm_adapter({}, model="tiny", model_path=None, ctx=9, src_dir=tmp_path)) is Quirky


def test_without_a_subclass_the_base_adapter_drives_the_engine(registry, tmp_path):
    assert type(for_arm({}, tmp_path)) is A.ArmEngine


def test_an_unknown_profile_name_is_named(registry, tmp_path):
    with pytest.raises(EngineError, match=r"engine: no profile 'tgi' .*available: embedded, llama-cpp-python"):
        A.arm_adapter({"engine": "tgi"}, model="m", model_path=None, ctx=9, src_dir=tmp_path)
    with pytest.raises(EngineError, match=r"no profile 'tgi'"):
        for_arm({"engine": "tgi"}, tmp_path, plan={**PLAN, "arms": {"cand": {"engine": "tgi"}}})


def test_registering_twice_or_a_non_adapter_is_refused(registry):
    @registry.register_adapter("vllm")
    class One(A.ArmEngine):
        pass

    assert registry.register_adapter("vllm")(One) is One  # the same class again is harmless
    with pytest.raises(ValueError, match=r"register_adapter\('vllm'\): .*One is already registered for engine "
                                         r"profile 'vllm'"):
        @registry.register_adapter("vllm")
        class Two(A.ArmEngine):
            pass
    with pytest.raises(TypeError, match=r"register_adapter\('sglang'\): .* is not a subclass of ArmEngine"):
        registry.register_adapter("sglang")(dict)


def test_model_arg_is_the_converted_folder_else_the_gguf_else_the_name(tmp_path):
    conv = {"conversion": {"path": "cache/k"}, "model": {"kind": "gguf", "arg": None}}
    assert A.model_arg(conv, tmp_path) == str((tmp_path / "cache" / "k").resolve())
    gguf = {"conversion": None, "model": {"kind": "gguf", "arg": "models/m.gguf"}}
    assert A.model_arg(gguf, tmp_path) == str((tmp_path / "models" / "m.gguf").resolve())
    assert A.model_arg(BUILD, tmp_path) == "tiny"


def test_typed_accessors_read_each_profile():
    lcp = load_profile("llama-cpp-python")
    assert lcp.prompt_count_route == "tokenize" and lcp.prompt_count_field is None
    assert lcp.completion_count_field is None  # counted from the streamed chunks
    assert lcp.tokenize_spec == TokenizeSpec(path="/extras/tokenize", input="text", body={"input": "{text}"},
                                             tokens_field="tokens", count_field=None)
    assert lcp.flush_spec == FlushSpec(path="/v1/completions", body={"prompt": "\n", "max_tokens": 1, "temperature": 0})
    cc = lcp.cold_cache_spec
    assert cc.from_log and cc.proof == "evaluated_tokens" and cc.requires_flags == ("--verbose", "true")
    assert cc.log_pattern == r"Llama\.generate: ([0-9]+) prefix-match hit"
    assert lcp.version_path is None and lcp.version_command[0] == "{python}" and not lcp.version_required
    assert lcp.crosscheck_spec is None and lcp.build_spec.command is None and lcp.build_spec.cmake is None

    vllm = load_profile("vllm")
    assert vllm.prompt_count_route == "reply" and vllm.prompt_count_field == "usage.prompt_tokens"
    assert vllm.completion_count_field == "usage.completion_tokens" and vllm.flush_spec is None
    assert vllm.cold_cache_spec == ColdCacheSpec(
        proof="cached_tokens", how=vllm.cold_cache_spec.how, cached_field="usage.prompt_tokens_details.cached_tokens",
        missing_means_zero=True, requires_flags=("--enable-prompt-tokens-details",))

    ls = load_profile("llama-server")
    assert not ls.cold_cache_spec.from_log and ls.cold_cache_spec.evaluated_field == "timings.prompt_n"
    xc = ls.crosscheck_spec
    assert isinstance(xc, CrosscheckSpec) and (xc.tool, xc.format, xc.timeout_s) == ("llama-bench", "llama-bench-json", 1800)
    assert len(xc.commands) == 2 and xc.commands[0][0] == "{src}/build/bin/llama-bench"
    assert ls.build_spec.cmake["targets"] == ["llama-server", "llama-bench"] and ls.build_spec.timeout_s == 3600

    emb = load_profile("embedded")
    assert emb.build_spec.step == "byte_compile" and emb.build_spec.convert == ("{python}", "-m", "engine", "convert")
    assert emb.version_required and emb.version_path == "/version" and emb.prompt_count_route == "reply"


class FakeHTTP:
    def __init__(self):
        self.posts = []

    def post(self, url, json, timeout):
        self.posts.append((url, json))
        return type("R", (), {"status_code": 200, "text": "", "json": lambda _: {"tokens": [5, 6, 7], "count": 3}})()


def _profile_copy(tmp_path: Path, name: str, edit) -> Path:
    data = yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())
    edit(data)
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


def test_prompt_count_asks_the_tokenizer_only_where_replies_carry_no_count(tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    http = FakeHTTP()
    reply_counted = A.ArmEngine(load_profile("vllm"), {}, model="m", model_path=None, ctx=9, src_dir=tmp_path)
    assert reply_counted.prompt_count(http, "http://s", msgs) is None and http.posts == []
    # vLLM's dialect, but its replies without a prompt count: the server's tokenizer is the count
    root = _profile_copy(tmp_path, "vllm", lambda d: d["tokens"].update(prompt="tokenize"))
    tokenized = A.ArmEngine(load_profile("vllm", root), {}, model="m", model_path=None, ctx=9, src_dir=tmp_path)
    assert tokenized.prompt_count(http, "http://s", msgs) == 3
    assert http.posts == [("http://s/tokenize", {"messages": msgs, "add_generation_prompt": True})]
