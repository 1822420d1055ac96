"""The engine's HTTP server, run as a real subprocess with the ``tiny`` model (docs/contracts.md §1)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.engine._server import ServerProcess, sse_events

MAX_CONTEXT = 256


@pytest.fixture(scope="module")
def server(repo_root):
    srv = ServerProcess(repo_root, "tiny", ["--max-context", str(MAX_CONTEXT)])
    yield srv
    srv.stop()


def complete(server, **body):
    r = server.client.post("/v1/completions", json={"temperature": 0, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_health_and_version(server, repo_root):
    assert server.client.get("/health").json() == {"status": "ok"}
    version = (repo_root / "engine" / "VERSION").read_text().strip()
    assert server.client.get("/version").json() == {
        "engine": "pairbench-engine", "version": version, "native": f"pairbench-engine {version}"}


def test_streamed_completion_has_usage_timings_and_done(server):
    body = {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False, "stream": True, "stream_options": {"include_usage": True}}
    with server.client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    token_chunks, usage_chunk = events[:-2], events[-2]
    assert len(token_chunks) == 8
    assert all(len(c["choices"][0]["tokens"]) == 1 for c in token_chunks)
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 7 + ["length"]
    last = token_chunks[-1]
    assert last["timings"]["predicted_n"] == 8 and last["memory"]["kv_bytes"] > 0
    assert usage_chunk["choices"] == []
    prompt_n = usage_chunk["usage"]["prompt_tokens"]
    assert usage_chunk["usage"]["completion_tokens"] == 8
    t = usage_chunk["timings"]
    assert t["prompt_n"] == prompt_n and t["predicted_n"] == 8 and t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert usage_chunk["tokens_cached"] == 0
    assert usage_chunk["memory"]["peak_rss_bytes"] > 0
    # The stream carries the same tokens and text as the non-streamed answer.
    whole = complete(server, prompt="The quick brown fox", max_tokens=8, return_tokens=True, cache_prompt=False)
    assert [c["choices"][0]["tokens"][0] for c in token_chunks] == whole["choices"][0]["tokens"]
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == whole["choices"][0]["text"]


def test_streamed_chat_first_delta_has_role(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with server.client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["choices"][0]["finish_reason"] == "length" and "timings" in events[-2]


def test_chat_prompt_tokens_match_tokenize(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to three."}]
    count = server.client.post("/tokenize", json={"messages": messages}).json()["count"]
    r = server.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == count
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_tokenize_content(server):
    r = server.client.post("/tokenize", json={"content": "héllo<|im_end|>"}).json()
    # byte-level: h, two bytes of é, l, l, o, then the special token as one id (2)
    assert r["count"] == 7 and r["tokens"][-1] == 2


@pytest.mark.parametrize("body, fragment", [
    (b'{"prompt": "x", "max_tokens": 4', "malformed JSON"),
    (b"[1, 2]", "object"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "cache_prompt": 0}, "cache_prompt"),
    ({"prompt": "x", "seed": "1"}, "seed"),
    ({"prompt": "x", "stream_options": {"include_usage": "y"}}, "include_usage"),
    ({"prompt": 7}, "prompt"),
    ({"prompt": [1, 99999]}, "99999"),
    ({"prompt": ""}, "empty"),
    ({"prompt": "a" * (MAX_CONTEXT + 1)}, "context"),
])
def test_bad_completion_input_is_4xx_and_server_survives(server, body, fragment):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = server.client.post("/v1/completions", **kwargs)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == r.status_code
    assert server.client.get("/health").status_code == 200
    assert complete(server, prompt="still alive", max_tokens=2)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": "hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}),
    ("/tokenize", {"content": 5}),
    ("/nope", {}),
])
def test_bad_requests_other_routes(server, path, body):
    r = server.client.post(path, json=body)
    assert 400 <= r.status_code < 500 and "error" in r.json()
    assert server.client.get("/health").status_code == 200


def test_unknown_fields_are_ignored(server):
    assert complete(server, prompt="x", max_tokens=1, top_k="whatever")["usage"]["completion_tokens"] == 1


def test_prefix_cache_reuse_and_opt_out(server):
    base = "A shared system prompt that is long enough to be worth caching. "
    first = complete(server, prompt=base + "Question one?", max_tokens=4, return_tokens=True)
    n1 = first["usage"]["prompt_tokens"]
    second = complete(server, prompt=base + "Question two?", max_tokens=4, return_tokens=True)
    n2, cached = second["usage"]["prompt_tokens"], second["tokens_cached"]
    assert cached >= len(base.encode()) - 1 and cached < n2
    assert second["timings"]["prompt_n"] == n2 - cached and second["timings"]["cache_n"] == cached
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    # The reused prefix gives exactly the tokens a cold evaluation gives.
    cold = complete(server, prompt=base + "Question two?", max_tokens=4, return_tokens=True, cache_prompt=False)
    assert cold["tokens_cached"] == 0 and cold["timings"]["prompt_n"] == n2
    assert cold["choices"][0]["tokens"] == second["choices"][0]["tokens"]
    # An identical prompt reuses everything but its last token.
    again = complete(server, prompt=base + "Question two?", max_tokens=4, return_tokens=True)
    assert again["tokens_cached"] == n2 - 1 and again["timings"]["prompt_n"] == 1
    assert again["choices"][0]["tokens"] == cold["choices"][0]["tokens"]
    assert n1 > 0


def test_prefix_cache_extends_into_generated_tokens(server):
    first = complete(server, prompt="Once upon a time", max_tokens=6, return_tokens=True, cache_prompt=False)
    prompt_ids = server.client.post("/tokenize", json={"content": "Once upon a time"}).json()["tokens"]
    follow = prompt_ids + first["choices"][0]["tokens"] + [65, 66]
    r = complete(server, prompt=follow, max_tokens=3, return_tokens=True)
    # The cache held the prompt and the 5 generated tokens that were fed back.
    assert r["tokens_cached"] == len(prompt_ids) + 5
    cold = complete(server, prompt=follow, max_tokens=3, return_tokens=True, cache_prompt=False)
    assert cold["choices"][0]["tokens"] == r["choices"][0]["tokens"]


def test_greedy_is_deterministic_and_matches_library(server):
    import engine
    from engine.generate import greedy

    a = complete(server, prompt="Determinism", max_tokens=12, return_tokens=True, cache_prompt=False)
    b = complete(server, prompt="Determinism", max_tokens=12, return_tokens=True, cache_prompt=False)
    assert a["choices"][0]["tokens"] == b["choices"][0]["tokens"]
    loaded = engine.load("tiny", max_context=MAX_CONTEXT)
    assert greedy(loaded, loaded.tokenizer.encode("Determinism"), 12) == a["choices"][0]["tokens"]
    assert len(set(a["choices"][0]["tokens"])) > 3  # the tiny model does not just repeat one token


def test_seeded_sampling_is_reproducible(server):
    runs = [complete(server, prompt="Sample", max_tokens=10, temperature=1.0, seed=s, return_tokens=True,
                     cache_prompt=False)["choices"][0]["tokens"] for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_generation_stops_at_context_limit(server):
    r = complete(server, prompt=[70] * (MAX_CONTEXT - 2), max_tokens=50, cache_prompt=False)
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"


def test_max_tokens_zero(server):
    r = complete(server, prompt="nothing", max_tokens=0, cache_prompt=False)
    assert r["usage"]["completion_tokens"] == 0 and r["choices"][0]["text"] == ""


def test_client_disconnect_mid_stream_releases_the_model(server):
    body = {"prompt": "Leave early", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                break
    assert complete(server, prompt="after", max_tokens=2, cache_prompt=False)["usage"]["completion_tokens"] == 2


def test_sigterm_exits_cleanly(repo_root):
    srv = ServerProcess(repo_root, "tiny", ["--max-context", "64"])
    assert srv.stop(timeout=20) == 0
