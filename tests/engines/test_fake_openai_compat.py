"""The vllm and sglang profiles, driven end to end against a fake server mimicking each one's fields.

The fake (tests/fakes/openai_compat.py) is launched with the profile's own command line (only the
program is swapped), so the cache-off and cache-report flags the profile passes are what decide
whether the fake reuses prefixes and whether it reports cached tokens.
"""

import sys
from pathlib import Path

import pytest

from pairbench.core.conditions import Condition

from pairbench import engines as E

from .conftest import free_port

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "openai_compat.py"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Write a function that adds two numbers. " * 4}]
PROGRAM = {"vllm": 1, "sglang": 3}  # argv items naming the program: 'vllm' | '{python} -m sglang.launch_server'


def fake_spec(profile, arm=None, drop=()):
    spec = E.launch_spec(profile, arm or {"threads": 1}, port=free_port(), model="fake-model", ctx=4096,
                         src_dir=".")
    argv = [sys.executable, str(FAKE), "--flavor", profile.name] + spec.argv[PROGRAM[profile.name]:]
    argv = [a for a in argv if a not in drop]
    return E.LaunchSpec(**{**spec.__dict__, "argv": argv, "ready_timeout_s": 20.0, "interval_s": 0.05})


def prompt_and_count(profile, srv, messages):
    """The fixture check: the prompt as the engine will see it, counted by the engine's tokenizer."""
    if profile.api_mode == "chat":
        path, body = profile.tokenize_request(messages=messages)
        return None, profile.token_count(srv.post(path, body))
    from tests.fakes.openai_compat import render  # the fake model's chat template
    text = render(messages)
    path, body = profile.tokenize_request(text=text)
    return text, profile.token_count(srv.post(path, body))


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_profile_drives_fake_with_cold_cache(name, launch):
    profile = E.load_profile(name)
    srv = launch(fake_spec(profile))
    text, n_prompt = prompt_and_count(profile, srv, MESSAGES)
    for seed in range(2):  # the same prompt twice: with caching off the second is still cold
        path, body = profile.generation_body(messages=MESSAGES, prompt=text, factors={"output_tokens": 24}, seed=seed)
        pieces, final = srv.stream(path, body)
        prompt_tokens, completion_tokens = E.native_counts(profile, final, streamed_tokens=len(pieces))
        assert prompt_tokens == n_prompt
        assert completion_tokens == 24 == len(pieces)  # ignore_eos/min_tokens forced the length
        ev = E.cold_cache_evidence(profile, final, prompt_tokens)
        assert ev == {"proof": "weak", "cold": True, "evaluated_tokens": None, "cached_tokens": 0, "flag": None}
        assert "timings" not in final  # neither server has llama.cpp timings


@pytest.mark.parametrize("name,flag", [("vllm", "--no-enable-prefix-caching"), ("sglang", "--disable-radix-cache")])
def test_gate_catches_prefix_reuse_when_cache_left_on(name, flag, launch):
    profile = E.load_profile(name)
    srv = launch(fake_spec(profile, drop=(flag,)))
    text, n_prompt = prompt_and_count(profile, srv, MESSAGES)
    verdicts = []
    for seed in range(2):
        path, body = profile.generation_body(messages=MESSAGES, prompt=text, factors={"output_tokens": 8}, seed=seed)
        _, final = srv.stream(path, body)
        verdicts.append(E.cold_cache_evidence(profile, final, n_prompt))
    assert verdicts[0]["cold"] is True
    assert verdicts[1]["cold"] is False and verdicts[1]["cached_tokens"] > 0
    assert "served from cache" in verdicts[1]["flag"]


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_without_forcing_fields_output_is_short(name, launch):
    """Proves the fake would catch a profile that forgot ignore_eos/min_tokens."""
    profile = E.load_profile(name)
    srv = launch(fake_spec(profile))
    text, _ = prompt_and_count(profile, srv, MESSAGES)
    path, body = profile.generation_body(messages=MESSAGES, prompt=text, factors={"output_tokens": 24}, seed=0)
    for k in profile.data["request"]["output_length"]["fields"]:
        body.pop(k)
    pieces, final = srv.stream(path, body)
    assert len(pieces) < 24 and final["usage"]["completion_tokens"] == len(pieces)


def llama_cpp_python_engine(tmp_path, launch_fn):
    """An ArmEngine for the llama-cpp-python profile whose program is swapped for the fake."""
    profile = E.load_profile("llama-cpp-python")
    template = [sys.executable, str(FAKE), "--flavor", "llama-cpp-python"] + profile.data["launch"]["argv"][3:]
    arm = {"threads": 2, "launch": template}
    eng = E.ArmEngine(profile, arm, model="fake.gguf", model_path=None, ctx=4096, src_dir=tmp_path)
    eng.prompt_text = lambda messages: __import__("tests.fakes.openai_compat", fromlist=["render"]).render(messages)
    spec = eng.launch(free_port())
    srv = launch_fn(E.LaunchSpec(**{**spec.__dict__, "ready_timeout_s": 20.0, "interval_s": 0.05}))
    return eng, srv


def steady(eng, srv, messages, flush: bool):
    n_prompt = len(eng.tokenize(srv.http, srv.spec.url, messages))
    if flush:
        eng.flush(srv.http, srv.spec.url)
    start = srv.log_path.stat().st_size
    path, body = eng.request(messages, Condition.of(output_tokens=12), 0)
    pieces, final = srv.stream(path, body)
    log = srv.log_path.read_text()[start:]
    return eng.gates(final, length=n_prompt, output_tokens=12, streamed_tokens=len(pieces), tokenize_count=n_prompt,
                     log_text=log)


def test_llama_cpp_python_flush_and_log_prove_a_cold_cache(tmp_path, launch):
    eng, srv = llama_cpp_python_engine(tmp_path, launch)
    other = [{"role": "user", "content": "Something else entirely."}]
    steady(eng, srv, other, flush=False)  # leaves a shared template prefix in the context
    gates, flags, facts = steady(eng, srv, MESSAGES, flush=True)
    assert gates == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}, flags
    assert flags == [] and facts["tokens_cached"] == 0 and facts["cold_cache_proof"] == "strong"


def test_llama_cpp_python_without_flush_the_log_shows_the_reuse(tmp_path, launch):
    eng, srv = llama_cpp_python_engine(tmp_path, launch)
    steady(eng, srv, [{"role": "user", "content": "Something else entirely."}], flush=False)
    gates, flags, facts = steady(eng, srv, MESSAGES, flush=False)
    assert gates["cold_cache"] is False and facts["tokens_cached"] > 0
    assert any("cached" in f for f in flags)
    assert gates["prompt_tokens"] and gates["completion_tokens"]  # min_tokens forced the length
