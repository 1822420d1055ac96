"""The official ``openai`` Python client against the engine's server (the tiny model): the drop-in
promise, checked with the client users actually run. Models, chat and completions, streaming with
usage, ``stop``, an over-long prompt and a field the server refuses."""

from __future__ import annotations

import pytest

from tests.engine._server import ServerProcess

openai = pytest.importorskip("openai")

MAX_CONTEXT = 256
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True, "cache_prompt": False}}


@pytest.fixture(scope="module")
def client(repo_root):
    srv = ServerProcess(repo_root, "tiny", ["--max-context", str(MAX_CONTEXT)])
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    srv.stop()


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat_completion(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                       max_completion_tokens=6, **GREEDY)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str)


def test_completion(client):
    r = client.completions.create(model="tiny", prompt="Once upon", max_tokens=5, **GREEDY)
    assert r.object == "text_completion" and r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_streamed_chat_with_usage(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Stream"}],
                                            max_completion_tokens=7, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 7 and text_chunks[0].choices[0].delta.role == "assistant"
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Stream"}],
                                           max_completion_tokens=7, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in text_chunks) == whole.choices[0].message.content


def test_stop(client):
    full = client.completions.create(model="tiny", prompt="Stop", max_tokens=20, **GREEDY).choices[0].text
    stop = full[5:8]
    r = client.completions.create(model="tiny", prompt="Stop", max_tokens=20, stop=[stop], **GREEDY)
    assert r.choices[0].text == full[:full.find(stop)] and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt="Stop", max_tokens=20, stop=stop, stream=True,
                                         **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[:full.find(stop)]


def test_over_long_prompt(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a" * (2 * MAX_CONTEXT)}],
                                       max_completion_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert "context" in e.value.message


def test_a_field_the_server_refuses(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "two answers"}],
                                       max_completion_tokens=4, n=2)
    assert e.value.param == "n" and e.value.code == "unsupported_field"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_completion_tokens=4, logprobs=True, top_logprobs=2)
    assert e.value.param in ("logprobs", "top_logprobs")


def test_a_seed_beyond_the_generator_s_range_is_refused_and_the_server_goes_on(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_completion_tokens=2, temperature=0.5, seed=2**64)
    assert e.value.param == "seed"
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                         max_completion_tokens=2, temperature=0.5, seed=2**64 - 1)
    assert out.choices[0].finish_reason in ("length", "stop")
