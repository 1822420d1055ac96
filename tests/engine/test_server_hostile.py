"""``engine serve`` under hostile clients (issue 38): every malformed request gets a 4xx in OpenAI's
error shape and the server serves on; the connection limits hold (engine/httpconn.py); and eight
streams decode exact tokens while 200 idle connections and a stream of malformed requests arrive.

Requests are sent over raw sockets where the framing itself is the attack. Nothing waits on a clock
except the server's own deadlines, which these servers set short (one second); each wait here is a
generous bound that only limits a failure.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.engine._server import ServerProcess, sse_events
from tests.engine.test_server_parallel import metrics, wait_for, wait_idle

ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def hostile(repo_root):
    """Short deadlines and small bodies, so that each limit is reached at once."""
    srv = ServerProcess(repo_root, "tiny", ["--max-context", "4096", "--parallel", "2", "--header-timeout", "1",
                                            "--body-timeout", "1", "--max-body-bytes", "8192",
                                            "--body-budget", "12000"])
    yield srv
    srv.stop()


def exchange(srv, data: bytes, *, wait_s: float = 20) -> tuple[int | None, dict, bytes]:
    """Send *data* on a fresh connection and read until the server closes it or one whole response
    is in: (status or None if it sent nothing, headers, body)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=wait_s) as s:
        s.sendall(data)
        buf = b""
        while True:
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
                length = int(headers.get("Content-Length", -1))
                if 0 <= length <= len(rest):
                    return int(head.split()[1]), headers, rest[:length]
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
    if not buf:
        return None, {}, b""
    head, _, rest = buf.partition(b"\r\n\r\n")
    return int(head.split()[1]), {}, rest


def request(path: str, body: bytes, *, method: str = "POST", extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def assert_openai_error(status, body: bytes, want_status: int) -> dict:
    assert status == want_status, (status, body[:300])
    err = json.loads(body)["error"]
    assert set(err) == ERROR_KEYS and isinstance(err["message"], str) and err["message"]
    return err


GOOD = {"prompt": "hello", "max_tokens": 2, "temperature": 0}

# (name, raw JSON body, the field the 400 names or None); each got a 500 or a 200 before issue 38
BAD_BODIES = [
    ("temperature Infinity", b'{"prompt": "hi", "max_tokens": 2, "temperature": Infinity}', None),
    ("temperature NaN", b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}', None),
    ("temperature 1e309", b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e309}', "temperature"),
    ("temperature above 2", b'{"prompt": "hi", "max_tokens": 2, "temperature": 2.5}', "temperature"),
    ("a lone surrogate in the prompt", b'{"prompt": "hi \\ud800", "max_tokens": 2}', "prompt"),
    ("a lone surrogate in a message", b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content"),
    ("a lone surrogate in a stop string", b'{"prompt": "hi", "stop": ["\\ud800x"]}', "stop[0]"),
    ("nested 3000 deep", b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", None),
    ("an integer of 4400 digits", b'{"prompt": "hi", "seed": ' + b"9" * 4400 + b"}", None),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', None),
    ("an array", b"[1, 2]", None),
    ("empty", b"", None),
]


@pytest.mark.parametrize("name, raw, param", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_a_malformed_body_is_a_400_naming_it_and_the_server_serves_on(hostile, name, raw, param):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    status, _, body = exchange(hostile, request(path, raw))
    err = assert_openai_error(status, body, 400)
    assert err["param"] == param
    status, _, body = exchange(hostile, request("/v1/completions", json.dumps(GOOD).encode()))
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2


def test_a_temperature_that_overflows_samples_its_limit_instead_of_failing(hostile):
    """1e-38 once gave NaN probabilities and a 500; now it is the T -> 0 limit, i.e. greedy."""
    greedy = httpx.post(hostile.url + "/v1/completions", json={**GOOD, "max_tokens": 6, "ignore_eos": True,
                                                               "return_tokens": True, "cache_prompt": False}).json()
    for t in (1e-38, 1e-300, 5e-324):
        r = httpx.post(hostile.url + "/v1/completions", json={**GOOD, "max_tokens": 6, "ignore_eos": True,
                                                              "return_tokens": True, "cache_prompt": False,
                                                              "temperature": t, "seed": 1})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["tokens"] == greedy["choices"][0]["tokens"]


# (name, raw bytes, the status) for the HTTP framing itself
FRAMING = [
    ("chunked body", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n0\r\n\r\n", 411),
    ("gzip transfer coding", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    ("no Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    ("negative Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    ("two Content-Lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                            b"Content-Length: 3\r\n\r\n{}", 400),
    ("Content-Length of 30 digits", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                    + b"9" * 30 + b"\r\n\r\n", 400),
    ("body beyond --max-body-bytes", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n", 413),
    ("binary garbage", b"\x00\xff\xfe garbage\r\n\r\n", 400),
    ("HTTP/0.9", b"GET /health\r\n\r\n", 400),
    ("HTTP/2.0 on a 1.1 socket", b"GET /health HTTP/2.0\r\n\r\n", 400),
    ("an unknown method", b"DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    ("a request line of 70 kB", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    ("a header of 100 kB", b"GET /health HTTP/1.1\r\nX: " + b"a" * 100000 + b"\r\n\r\n", 431),
    ("200 headers", b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
    ("headers cut short", b"GET /health HTTP/1.1\r\nHost: x\r\n", 408),
    ("a body cut short", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro", 408),
]


@pytest.mark.parametrize("name, raw, want", FRAMING, ids=[f[0] for f in FRAMING])
def test_malformed_framing_is_a_4xx_in_openai_shape_and_the_server_serves_on(hostile, name, raw, want):
    status, headers, body = exchange(hostile, raw)
    if want == 501:  # a transfer coding the server does not implement: the one 5xx the issue allows
        assert_openai_error(status, body, 501)
    else:
        assert_openai_error(status, body, want)
    assert headers.get("Connection") in (None, "close")
    assert httpx.get(hostile.url + "/health").status_code == 200


def test_an_idle_connection_is_closed_without_a_word_after_the_header_timeout(hostile):
    t0 = time.monotonic()
    status, _, _ = exchange(hostile, b"")  # connects, sends nothing
    assert status is None and time.monotonic() - t0 < 15  # closed by the server (its deadline: 1 s)


def test_a_body_beyond_the_budget_is_a_503_while_another_body_holds_it(hostile):
    """Budget 12000 bytes, bodies up to 8192: while one client trickles a 7000-byte body (it holds
    7000 of the budget), a second 7000-byte body gets a 503; once the first ends, a body is read."""
    with socket.create_connection(("127.0.0.1", hostile.port), timeout=20) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7000\r\n\r\n{")
        wait_for(hostile, "the first body being read", lambda m: m["body_bytes_reading"] == 7000)
        body = json.dumps({**GOOD, "padding": "x" * 6950}).encode()  # an unknown field: ignored
        status, _, reply = exchange(hostile, request("/v1/completions", body))
        err = assert_openai_error(status, reply, 503)
        assert err["code"] == "body_budget"
        assert slow.recv(65536).split()[1] == b"408"  # its own body timed out meanwhile
    status, _, reply = exchange(hostile, request("/v1/completions", body))
    assert status == 200, reply


def test_pipelined_bytes_do_not_switch_off_the_disconnect_watch(hostile):
    """Issue 38: one extra byte after a request made the server stop watching the client, so a client
    that then left kept its slot until the generation ended. A request that is not streamed writes
    nothing until it ends, so only the watch can see the client leave. Now the byte is kept for a
    next request and the close is still seen: the request is cancelled (never counted as completed,
    its 4,000 tokens never generated)."""
    before = metrics(hostile)
    body = json.dumps({"prompt": "Leave early", "max_tokens": 4000, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    with socket.create_connection(("127.0.0.1", hostile.port), timeout=20) as s:
        s.sendall(request("/v1/completions", body) + b"G")  # "G": the first byte of a pipelined GET
        wait_for(hostile, "the request generating", lambda m: m["slots_in_use"] == 1)
    wait_idle(hostile)
    after = metrics(hostile)
    assert after["requests_total"] == before["requests_total"]  # cancelled, not run to its end
    assert after["generated_tokens_total"] == before["generated_tokens_total"]


def test_a_pipelined_request_is_answered_after_the_first(hostile):
    """The bytes the watch took off the socket during the first request are the second request."""
    one = request("/v1/completions", json.dumps(GOOD).encode())
    with socket.create_connection(("127.0.0.1", hostile.port), timeout=20) as s:
        s.sendall(one + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while buf.count(b"HTTP/1.1 200") < 2 or not buf.endswith(b'{"status": "ok"}'):
            chunk = s.recv(65536)
            assert chunk, buf
            buf += chunk
    assert b'"completion_tokens": 2' in buf


@pytest.fixture(scope="module")
def capped(repo_root):
    srv = ServerProcess(repo_root, "tiny", ["--max-context", "64", "--max-connections", "4",
                                            "--header-timeout", "120", "--backlog", "77"])
    yield srv
    srv.stop()


def test_connections_beyond_the_cap_get_a_503_and_service_resumes(capped):
    capped.client.close()
    idle = [socket.create_connection(("127.0.0.1", capped.port), timeout=20) for _ in range(4)]
    try:
        # the accepting thread counts a connection as it hands it to its thread: wait until all four are in
        deadline = time.monotonic() + 60
        while True:
            status, _, body = exchange(capped, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            if status == 503 or time.monotonic() > deadline:
                break
        err = assert_openai_error(status, body, 503)
        assert err["code"] == "too_many_connections" and "--max-connections" in err["message"]
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 60
    while exchange(capped, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] != 200:
        assert time.monotonic() < deadline, "service never resumed"
    text = httpx.get(capped.url + "/metrics", headers={"Connection": "close"}).text
    assert "pairbench_engine_connections_max 4" in text
    assert int(text.split("\npairbench_engine_connections_refused_total ")[1].split()[0]) >= 1


def test_the_listen_backlog_is_the_option(capped):
    """The kernel reports a listening socket's backlog as its Send-Q (ss -ltn)."""
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    out = subprocess.run(["ss", "-Hltn", f"sport = :{capped.port}"], capture_output=True, text=True, check=True).stdout
    assert out.split()[2] == "77", out


# --------------------------------------------------------------------------------------------------
# Under load: 8 streams decoding while 200 idle connections and a stream of malformed requests arrive

MALFORMED = [body for _, body, _ in BAD_BODIES[:7]] + [raw for _, raw, _ in FRAMING if len(raw) < 2000][:10]
STREAMS = [f"stream {i}: " + "words " * (i + 1) for i in range(8)]


def _attack(srv, stop: threading.Event, answers: list) -> None:
    i = 0
    while not stop.is_set():
        raw = MALFORMED[i % len(MALFORMED)]
        data = raw if raw.startswith((b"POST", b"GET", b"DELETE", b"\x00")) else request("/v1/completions", raw)
        try:
            answers.append(exchange(srv, data, wait_s=30)[0])
        except OSError as e:
            answers.append(repr(e))
        i += 1


def _stream(srv, prompt: str, n: int, out: dict, key: int) -> None:
    b = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
         "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", srv.url + "/v1/completions", json=b, timeout=300) as r:
        events = sse_events(r)
    out[key] = (r.status_code, [c["choices"][0]["tokens"][0] for c in events[:-2] if c["choices"][0]["tokens"]])


def test_eight_streams_decode_exact_tokens_through_an_idle_flood_and_malformed_requests(repo_root, tiny_q4_gguf):
    srv = ServerProcess(repo_root, str(tiny_q4_gguf), ["--max-context", "1024", "--parallel", "8",
                                                       "--header-timeout", "300", "--body-timeout", "2"])
    try:
        n = [300 + 10 * i for i in range(8)]
        alone = [httpx.post(srv.url + "/v1/completions", timeout=300, json={
            "prompt": p, "max_tokens": k, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True}).json()["choices"][0]["tokens"] for p, k in zip(STREAMS, n)]
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(200)]
        stop, answers, out = threading.Event(), [], {}
        attackers = [threading.Thread(target=_attack, args=(srv, stop, answers)) for _ in range(2)]
        streams = [threading.Thread(target=_stream, args=(srv, p, k, out, i)) for i, (p, k) in enumerate(zip(STREAMS, n))]
        for t in attackers + streams:
            t.start()
        wait_for(srv, "eight streams in one decode step", lambda m: m["decode_batch_size_last"] == 8, 300)
        for t in streams:
            t.join(timeout=600)
        stop.set()
        for t in attackers:
            t.join(timeout=60)
        m = metrics(srv)
        for s in idle:
            s.close()
    finally:
        srv.stop()
    assert [out[i] for i in range(8)] == [(200, a) for a in alone]  # every stream, token for token
    assert len(answers) >= len(MALFORMED) and all(isinstance(a, int) and 400 <= a < 500 or a == 501
                                                   for a in answers), answers
    assert m["connections_open"] >= 200 and m["connections_refused_total"] == 0
