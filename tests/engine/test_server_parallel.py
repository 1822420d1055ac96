"""``python -m engine serve --parallel N`` under real concurrent streams (a subprocess serving the tiny
model's Q4_1 GGUF, so decode runs the production batched path).

Nothing here waits on a clock: a test that needs the server in some state (four streams in one
decode batch, a request waiting in the queue, a slot freed) polls ``/metrics`` until the server says
so, with a generous deadline that only bounds a failure.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.engine._server import ServerProcess, sse_events

PROMPTS = ["The first stream", "A second, longer stream of text", "three", "And the fourth one, with more words in it"]


@pytest.fixture(scope="module")
def server(repo_root, tiny_q4_gguf):
    srv = ServerProcess(repo_root, str(tiny_q4_gguf), ["--max-context", "4096", "--parallel", "4",
                                                       "--batch-tokens", "64", "--max-queue", "4"])
    yield srv
    srv.stop()


def metrics(srv) -> dict[str, float]:
    out = {}
    for line in srv.client.get("/metrics").text.splitlines():
        if line.startswith("pairbench_engine_") and "{" not in line:
            name, value = line.split()
            out[name[len("pairbench_engine_"):]] = float(value)
    return out


def wait_for(srv, what: str, cond, deadline_s: float = 120) -> dict:
    """Poll /metrics until ``cond(metrics)`` holds (a handshake on the server's state)."""
    end = time.monotonic() + deadline_s
    while True:
        m = metrics(srv)
        if cond(m):
            return m
        if time.monotonic() > end:
            raise AssertionError(f"the server never reached: {what}; last metrics {m}")
        time.sleep(0.01)


def wait_idle(srv, deadline_s: float = 120) -> dict:
    """Until no slot is in use and nothing queued: a stream's last event, or a whole reply, can reach its
    client a moment before the scheduler frees its slot (it tells the request first)."""
    return wait_for(srv, "idle", lambda m: m["slots_in_use"] == 0 and m["queue_length"] == 0, deadline_s)


def body(prompt, n, **kw):
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True, **kw}


def stream(srv, b: dict, out: dict, key) -> None:
    b = dict(b, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", srv.url + "/v1/completions", json=b, timeout=300) as r:
        out[key] = (r.status_code, sse_events(r))


def test_concurrent_streams_each_get_their_tokens_alone_with_exact_counters(server):
    n_tokens = [1500, 1600, 1700, 1800]
    alone = [server.client.post("/v1/completions", json=body(p, n), timeout=300).json()
             for p, n in zip(PROMPTS, n_tokens)]
    out: dict = {}
    threads = [threading.Thread(target=stream, args=(server, body(p, n), out, i))
               for i, (p, n) in enumerate(zip(PROMPTS, n_tokens))]
    for t in threads:
        t.start()
    wait_for(server, "all four streams in one decode step", lambda m: m["decode_batch_size_last"] == 4)
    for t in threads:
        t.join()
    for i, want in enumerate(alone):
        status, events = out[i]
        assert status == 200 and events[-1] == "[DONE]"
        chunks = [e for e in events[:-1] if e["choices"]]
        assert [c["choices"][0]["tokens"][0] for c in chunks] == want["choices"][0]["tokens"]
        assert "".join(c["choices"][0]["text"] for c in chunks) == want["choices"][0]["text"]
        usage_chunk = events[-2]
        u, t = usage_chunk["usage"], usage_chunk["timings"]
        assert u == want["usage"] and u["completion_tokens"] == n_tokens[i]
        assert u["prompt_tokens_details"]["cached_tokens"] == usage_chunk["tokens_cached"] == 0
        assert t["prompt_n"] == u["prompt_tokens"] and t["cache_n"] == 0 and t["predicted_n"] == n_tokens[i]
        assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
        assert t["predicted_per_second"] == pytest.approx(t["predicted_n"] / t["predicted_ms"] * 1e3)
    m = wait_idle(server, deadline_s=30)
    assert m["slots_total"] == 4


def test_no_prefix_reuse_for_a_request_that_asks_for_none(server):
    ids = server.client.post("/tokenize", json={"content": "A prompt that is served twice. " * 8}).json()["tokens"]
    first = server.client.post("/v1/completions", json=body(ids, 4, cache_prompt=True)).json()
    cold = server.client.post("/v1/completions", json=body(ids, 4)).json()
    warm = server.client.post("/v1/completions", json=body(ids, 4, cache_prompt=True)).json()
    assert cold["tokens_cached"] == 0 and cold["timings"]["prompt_n"] == len(ids)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["tokens_cached"] == len(ids) - 1 and warm["timings"]["prompt_n"] == 1
    assert first["choices"][0]["tokens"] == cold["choices"][0]["tokens"] == warm["choices"][0]["tokens"]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    before = metrics(server)
    b = json.dumps(dict(body("Leave early", 4000), stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
    buf = b""
    while b"data: " not in buf:  # streaming: the request holds a slot
        buf += s.recv(4096)
    s.close()
    after = wait_for(server, "the slot freed", lambda m: m["slots_in_use"] == 0)
    # cut short: it never completed (4,000 tokens would have counted as a finished request)
    assert after["requests_total"] == before["requests_total"]
    assert after["generated_tokens_total"] == before["generated_tokens_total"]


def test_a_waiting_client_that_disconnects_leaves_the_queue(server):
    before = metrics(server)
    out: dict = {}
    threads = [threading.Thread(target=stream, args=(server, body(p, 2500), out, i)) for i, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    wait_for(server, "four slots busy", lambda m: m["slots_in_use"] == 4)
    b = json.dumps(body("I will not wait", 5)).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
    wait_for(server, "the fifth request queued", lambda m: m["queue_length"] == 1)
    s.close()
    m = wait_for(server, "the queue emptied while the four still run",
                 lambda m: m["queue_length"] == 0 or m["slots_in_use"] < 4)
    assert m["queue_length"] == 0 and m["slots_in_use"] == 4
    for t in threads:
        t.join()
    after = metrics(server)
    assert after["requests_total"] == before["requests_total"] + 4  # the one that left never ran


def test_a_request_beyond_the_queue_bound_is_a_503_in_openai_shape(server):
    out: dict = {}
    runners = [threading.Thread(target=stream, args=(server, body(p, 2500), out, i)) for i, p in enumerate(PROMPTS)]
    for t in runners:
        t.start()
    wait_for(server, "four slots busy", lambda m: m["slots_in_use"] == 4)
    waiters = [threading.Thread(target=stream, args=(server, body(p, 3), out, f"w{i}")) for i, p in enumerate(PROMPTS)]
    for t in waiters:
        t.start()
    wait_for(server, "the queue full (--max-queue 4)", lambda m: m["queue_length"] == 4)
    r = server.client.post("/v1/completions", json=body("one too many", 3))
    assert r.status_code == 503
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "queue_full"
    assert "busy" in err["message"] and err["type"] == "unavailable_error"
    for t in runners + waiters:
        t.join()
    assert all(status == 200 and events[-1] == "[DONE]" for status, events in out.values())  # nobody starved
    assert server.client.post("/v1/completions", json=body("room again", 3)).status_code == 200


def test_a_prompt_beyond_the_context_is_a_400(server):
    r = server.client.post("/v1/completions", json=body([70] * 4097, 3))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_metrics_report_slots_queue_and_batch_sizes(server):
    text = server.client.get("/metrics").text
    for name, kind in [("slots_total", "gauge"), ("slots_in_use", "gauge"), ("queue_length", "gauge"),
                       ("decode_batch_size", "histogram"), ("decode_steps_total", "counter")]:
        assert f"# TYPE pairbench_engine_{name} {kind}" in text
    buckets = [line for line in text.splitlines() if line.startswith("pairbench_engine_decode_batch_size_bucket")]
    counts = [float(line.split()[1]) for line in buckets]
    assert buckets[-1].startswith('pairbench_engine_decode_batch_size_bucket{le="+Inf"}') and counts == sorted(counts)
    m = metrics(server)
    assert counts[-1] == m["decode_batch_size_count"] == m["decode_steps_total"]
    assert m["decode_batch_size_sum"] == m["decode_batch_tokens_total"]


def test_requests_leave_no_file_descriptors_behind(server):
    """Each request's wake-up pipe is closed by both sides, whether it finished, was cancelled or
    was refused."""
    fds = lambda: len(list((__import__("pathlib").Path(f"/proc/{server.proc.pid}/fd")).iterdir()))  # noqa: E731
    server.client.post("/v1/completions", json=body("warm", 2))
    wait_idle(server)  # the scheduler has closed its end of the warm-up's pipe once its slot reads free
    before = fds()
    for i in range(20):
        assert server.client.post("/v1/completions", json=body(f"request {i}", 3)).status_code == 200
    test_a_client_that_disconnects_mid_stream_frees_its_slot(server)
    wait_idle(server)
    end = time.monotonic() + 60  # the left connection's thread closes its socket after the slot is freed
    while fds() != before and time.monotonic() < end:
        time.sleep(0.01)
    assert fds() == before
