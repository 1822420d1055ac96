"""A fake OpenAI-compatible server that answers like vLLM, SGLang or llama-cpp-python (``--flavor``).

It exists so pairbench's vllm and sglang engine profiles (config/engines/) can be exercised on a
CPU: launched with the profile's own command-line flags (the program is swapped for this file), it
mimics each server's reply *fields*, as read from their sources:

- vLLM: ``GET /health`` (200, empty body), ``GET /version``, ``GET /metrics`` (the scheduler's
  ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` gauges), ``POST /tokenize`` (``prompt`` or
  ``messages`` + ``add_generation_prompt``) → ``{count, max_model_len, tokens}``; usage with
  ``prompt_tokens_details.cached_tokens`` only under ``--enable-prompt-tokens-details`` and only
  when non-zero; automatic prefix caching on unless ``--no-enable-prefix-caching`` (16-token
  blocks); no llama.cpp ``timings``.
- SGLang: ``GET /health``, ``POST /v1/tokenize`` (``prompt``, ``add_special_tokens``) →
  ``{tokens, count, max_model_len}``; ``prompt_tokens_details.cached_tokens`` only under
  ``--enable-cache-report`` and only when > 0; radix (token-level) prefix reuse unless
  ``--disable-radix-cache``; no ``timings``.

- llama-cpp-python (0.3.36's llama_cpp/server/app.py and llama.py): ``GET /v1/models``,
  ``POST /extras/tokenize {input}`` → ``{tokens}``; ``min_tokens`` but no ``ignore_eos``; streamed
  chunks without usage (no ``stream_options``); and ``Llama.generate``'s prefix reuse, which has
  no switch: the longest common token prefix with the previous request (prompt + output) is kept.
  With ``--verbose true`` it logs, per request, ``Llama.generate: K prefix-match hit, remaining M
  prompt tokens to eval`` and ``llama_perf_context_print: prompt eval time = … ms / N tokens``.

All: streamed ``/v1/completions`` and ``/v1/chat/completions`` as ``data: <json>`` events ending
``data: [DONE]``; with ``stream_options.include_usage`` a last chunk with ``choices: []`` and
``usage``. ``ignore_eos`` and ``min_tokens`` are honoured: without either, the fake "model" emits
EOS after ``--natural-len`` tokens, so a profile that fails to force the output length is caught.

Load (``--parallel N``, off by default: without it requests are served one at a time, as before):
continuous batching in N slots. One scheduler thread runs decode *steps*; a step emits one token to
every sequence in the batch and costs ``--decode-s-per-token + --batch-s-per-seq × (batch − 1)``
seconds, plus ``--prefill-s-per-token`` for each prompt token admitted into the batch at that step.
So throughput rises with the batch while every stream's inter-token latency grows, as a real
batching server's do, and requests beyond N wait for a slot (their TTFT grows). With ``--timings``
the last token chunk carries llama.cpp's ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``,
``predicted_ms``). Failure modes for the load client's tests, by arrival number (1-based, in the
order the server received the requests): ``--stall-requests 2,5`` stop sending after
``--fail-after-tokens`` tokens and hold the connection open, silent, until the client closes it;
``--drop-requests 3`` close the connection after that many tokens, with no ``[DONE]``;
``--reorder K`` holds the first K requests until all K arrived and then admits them last-first (with
one slot they finish in reverse order of arrival).

Model: byte-level tokenizer (id = byte + 3; 1 = <|im_start|>, 2 = <|im_end|>) with a ChatML template.
A model given as a directory must be a Hugging Face one (it holds ``config.json``): the fake checks
that much, and answers with its own tokenizer, which a test's model directory reproduces.

Run: ``python tests/fakes/openai_compat.py --flavor vllm serve MODEL --port 8000 --no-enable-prefix-caching``,
or, installed (``tests/fakes/fake_serve/`` is its package), ``fake-serve ...`` or ``python -m fake_serve ...``.
``GET /version`` and ``--version`` tell the package's version.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_serve import __version__

IM_START, IM_END = 1, 2
OFFSET = 3
OUTPUT = "def add(a, b):\n    return a + b\n"
VLLM_BLOCK = 16


def encode(text: str) -> list[int]:
    specials = {"<|im_start|>": IM_START, "<|im_end|>": IM_END}
    ids: list[int] = []
    i = 0
    while i < len(text):
        for s, sid in specials.items():
            if text.startswith(s, i):
                ids.append(sid)
                i += len(s)
                break
        else:
            ids += [b + OFFSET for b in text[i].encode("utf-8")]
            i += 1
    return ids


def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class BadRequest(Exception):
    pass


class State:
    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.lock = threading.Lock()
        self.previous: list[int] = []
        f = opts.flavor
        self.caching = f == "llama-cpp-python" or not (
            opts.no_enable_prefix_caching if f == "vllm" else opts.disable_radix_cache)
        self.report = opts.enable_prompt_tokens_details if f == "vllm" else (
            opts.enable_cache_report if f == "sglang" else False)
        self.arrivals = 0  # requests received for generation (the failure modes' numbering)
        self.batcher = Batcher(opts) if opts.parallel else None

    def cached_for(self, ids: list[int]) -> int:
        if not self.caching:
            return 0
        if self.opts.flavor == "llama-cpp-python":  # Llama.generate's reuse rule
            lcp = 0
            for a, b in zip(self.previous, ids):
                if a != b:
                    break
                lcp += 1
            reuse = lcp - 1 if lcp == len(ids) else lcp
            if reuse > 0 and self.opts.verbose:
                sys.stderr.write(f"Llama.generate: {reuse} prefix-match hit, remaining {len(ids) - reuse} "
                                 "prompt tokens to eval\n")
            return max(reuse, 0)
        lcp = 0
        for a, b in zip(self.previous, ids):
            if a != b:
                break
            lcp += 1
        lcp = min(lcp, len(ids) - 1)  # the last prompt token is always computed
        return (lcp // VLLM_BLOCK) * VLLM_BLOCK if self.opts.flavor == "vllm" else max(lcp, 0)


class Seq:
    """One request in the batcher: its costs, its fault, and a queue of token indices to stream."""

    def __init__(self, arrival: int, new_prompt_tokens: int, n_out: int, fault: str | None):
        self.arrival, self.new_prompt_tokens, self.n_out, self.fault = arrival, new_prompt_tokens, n_out, fault
        self.tokens: queue.SimpleQueue = queue.SimpleQueue()
        self.emitted = 0
        self.cancelled = False
        self.t_submit = time.perf_counter()
        self.t_first = self.t_last = None


class Batcher:
    """Continuous batching in ``--parallel`` slots: a step emits one token to every active sequence."""

    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.cv = threading.Condition()
        self.waiting: collections.deque = collections.deque()
        self.held: list[Seq] = []
        self.active: list[Seq] = []
        threading.Thread(target=self.loop, name="batcher", daemon=True).start()

    def submit(self, seq: Seq) -> None:
        with self.cv:
            if seq.arrival <= self.opts.reorder:  # out-of-order mode: hold, then admit last-first
                self.held.append(seq)
                if len(self.held) == self.opts.reorder:
                    self.waiting.extend(reversed(self.held))
                    self.held = []
            else:
                self.waiting.append(seq)
            self.cv.notify()

    def loop(self) -> None:
        o = self.opts
        while True:
            with self.cv:
                self.active = [s for s in self.active if not s.cancelled and s.emitted < s.n_out]
                while not self.waiting and not self.active:
                    self.cv.wait()  # idle: nothing to decode
                admitted = []
                while self.waiting and len(self.active) < o.parallel:
                    seq = self.waiting.popleft()
                    self.active.append(seq)
                    admitted.append(seq)
                batch = list(self.active)
            cost = (o.prefill_s_per_token * sum(s.new_prompt_tokens for s in admitted)
                    + o.decode_s_per_token + o.batch_s_per_seq * (len(batch) - 1))
            if cost > 0:
                time.sleep(cost)
            now = time.perf_counter()
            for seq in batch:
                if seq.cancelled:
                    continue
                if seq.t_first is None:
                    seq.t_first = now
                seq.t_last = now
                seq.emitted += 1
                seq.tokens.put(seq.emitted - 1)


def usage_of(state: "State", prompt: int, completion: int, cached: int) -> dict:
    """The reply's usage; cached tokens reported only when the server reports them and they are > 0."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if state.report and cached > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _arrival_set(text: str) -> set[int]:
    return {int(x) for x in text.split(",") if x.strip()}


def _typed(body: dict, key: str, kind, default):
    value = body.get(key, default)
    if value is not None and not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {key!r} must be {kind.__name__}")
    return value


class Handler(BaseHTTPRequestHandler):
    state: State
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # headers and body go out in two writes: without this, Nagle's algorithm holds the second until
        # the client's delayed ACK (~40 ms per keep-alive request), which is most of a fixture's fit
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s\n" % (fmt % args))

    def _json(self, status: int, obj) -> None:
        data = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        # Both servers answer errors as {"object": "error", "message", "type", "code"}.
        self._json(status, {"object": "error", "message": message, "type": "BadRequestError", "code": status})

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, None)
        if self.path == "/version" and self.state.opts.flavor == "vllm":
            return self._json(200, {"version": __version__})
        if self.path == "/health" and self.state.opts.flavor == "llama-cpp-python":
            return self._error(404, "Not Found")
        if self.path == "/metrics" and self.state.opts.flavor == "vllm":  # the scheduler's gauges, as vLLM's
            b = self.state.batcher
            with (b.cv if b else self.state.lock):
                running = len(b.active) if b else 0
                waiting = len(b.waiting) + len(b.held) if b else 0
            labels = f'{{model_name="{self.state.opts.model}"}}'
            text = "".join(f"# TYPE vllm:{n} gauge\nvllm:{n}{labels} {v}\n"
                           for n, v in (("num_requests_running", running), ("num_requests_waiting", waiting)))
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": self.state.opts.model, "object": "model"}]})
        self._error(404, f"no route {self.path}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            tok_path = {"vllm": "/tokenize", "sglang": "/v1/tokenize", "llama-cpp-python": "/extras/tokenize"}
            if self.path == tok_path[self.state.opts.flavor]:
                if self.state.opts.flavor == "llama-cpp-python":
                    return self._json(200, {"tokens": encode(_typed(body, "input", str, ""))})
                return self._json(200, self.tokenize(body))
            if self.path in ("/v1/completions", "/v1/chat/completions"):
                return self.generate(body, chat=self.path.endswith("chat/completions"))
            return self._error(404, f"no route {self.path}")
        except (BadRequest, json.JSONDecodeError, KeyError, TypeError) as exc:
            return self._error(400, str(exc))

    def tokenize(self, body: dict) -> dict:
        if "messages" in body:
            if self.state.opts.flavor != "vllm":
                raise BadRequest("this server's tokenize takes 'prompt' only")
            text = render(body["messages"], _typed(body, "add_generation_prompt", bool, True))
        else:
            text = _typed(body, "prompt", str, None)
            if text is None:
                raise BadRequest("tokenize needs 'prompt'")
        ids = encode(text)
        return {"count": len(ids), "max_model_len": self.state.opts.max_len, "tokens": ids}

    def generate(self, body: dict, chat: bool) -> None:
        st = self.state
        if chat:
            ids = encode(render(body["messages"]))
        else:
            prompt = _typed(body, "prompt", str, None)
            if prompt is None:
                raise BadRequest("completions need 'prompt' (str)")
            ids = encode(prompt)
        max_tokens = _typed(body, "max_tokens", int, 16)
        min_tokens = _typed(body, "min_tokens", int, 0)
        ignore_eos = _typed(body, "ignore_eos", bool, False)
        stream = _typed(body, "stream", bool, False)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if len(ids) + max_tokens > st.opts.max_len:
            raise BadRequest(f"prompt ({len(ids)}) + max_tokens ({max_tokens}) exceed max_model_len {st.opts.max_len}")
        if st.opts.flavor == "llama-cpp-python":
            ignore_eos = False  # not a field of its CreateCompletionRequest: ignored
            include_usage = False  # no stream_options either
        if st.batcher is not None:
            return self.generate_batched(ids, max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos,
                                         stream=stream, include_usage=include_usage, chat=chat)
        with st.lock:
            cached = st.cached_for(ids)
            time.sleep(st.opts.prefill_s_per_token * (len(ids) - cached))
            n = max_tokens if ignore_eos or min_tokens >= max_tokens else min(max_tokens, max(st.opts.natural_len, min_tokens))
            pieces = [OUTPUT[i % len(OUTPUT)] for i in range(n)]
            st.previous = ids + encode("".join(pieces))  # the context now holds prompt + output
            if st.opts.flavor == "llama-cpp-python" and st.opts.verbose:
                sys.stderr.write(f"llama_perf_context_print: prompt eval time = {1.0 * (len(ids) - cached):10.2f} ms / "
                                 f"{len(ids) - cached:5d} tokens (    1.00 ms per token,  1000.00 tokens per second)\n")
                sys.stderr.flush()
            finish = "length" if n == max_tokens else "stop"
            usage = usage_of(st, len(ids), n, cached)
            rid = f"{'chatcmpl' if chat else 'cmpl'}-fake"
            obj = "chat.completion.chunk" if chat else "text_completion"
            if not stream:
                choice = {"index": 0, "finish_reason": finish, "logprobs": None}
                choice.update({"message": {"role": "assistant", "content": "".join(pieces)}} if chat
                              else {"text": "".join(pieces)})
                return self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                        "created": int(time.time()), "model": st.opts.model,
                                        "choices": [choice], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

            def event(payload) -> None:
                data = payload if isinstance(payload, str) else json.dumps(payload)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()

            def chunk(choice: dict) -> dict:
                return {"id": rid, "object": obj, "created": int(time.time()), "model": st.opts.model,
                        "choices": [choice]}

            if chat:  # vLLM and SGLang both open a chat stream with the role
                event(chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}))
            for i, piece in enumerate(pieces):
                time.sleep(st.opts.decode_s_per_token)
                last = i == len(pieces) - 1
                c = {"index": 0, "logprobs": None, "finish_reason": finish if last else None}
                c.update({"delta": {"content": piece}} if chat else {"text": piece})
                if st.opts.flavor == "sglang":
                    c["matched_stop"] = None
                event(chunk(c))
            if include_usage:
                event({"id": rid, "object": obj, "created": int(time.time()), "model": st.opts.model,
                       "choices": [], "usage": usage})
            event("[DONE]")
            self.close_connection = True


    def generate_batched(self, ids: list[int], *, max_tokens: int, min_tokens: int, ignore_eos: bool, stream: bool,
                         include_usage: bool, chat: bool) -> None:
        """The ``--parallel`` path: the batcher decides when each token exists; this thread streams it."""
        st, o = self.state, self.state.opts
        with st.lock:
            st.arrivals += 1
            arrival = st.arrivals
            cached = st.cached_for(ids)
            n = max_tokens if ignore_eos or min_tokens >= max_tokens else min(max_tokens, max(o.natural_len, min_tokens))
            st.previous = ids + encode("".join(OUTPUT[i % len(OUTPUT)] for i in range(n)))
        fault = ("stall" if arrival in _arrival_set(o.stall_requests)
                 else "drop" if arrival in _arrival_set(o.drop_requests) else None)
        seq = Seq(arrival, len(ids) - cached, n, fault)
        st.batcher.submit(seq)
        pieces = [OUTPUT[i % len(OUTPUT)] for i in range(n)]
        finish = "length" if n == max_tokens else "stop"
        usage = usage_of(st, len(ids), n, cached)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-fake-{arrival}"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def timings() -> dict:
            first, last = seq.t_first or seq.t_submit, seq.t_last or seq.t_submit  # none at max_tokens 0
            return {"prompt_n": len(ids) - cached, "prompt_ms": (first - seq.t_submit) * 1e3,
                    "predicted_n": n, "predicted_ms": (last - first) * 1e3}

        if not stream:
            for _ in range(n):
                seq.tokens.get()
            choice = {"index": 0, "finish_reason": finish, "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": "".join(pieces)}} if chat
                          else {"text": "".join(pieces)})
            reply = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                     "model": o.model, "choices": [choice], "usage": usage}
            if o.timings:
                reply["timings"] = timings()
            return self._json(200, reply)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            self.wfile.write(f"data: {data}\n\n".encode())

        try:
            if chat:
                event({"id": rid, "object": obj, "created": int(time.time()), "model": o.model,
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]})
            for i in range(n):
                if seq.fault and i == o.fail_after_tokens:
                    return self.fail(seq)
                seq.tokens.get()
                last = i == n - 1
                c = {"index": 0, "logprobs": None, "finish_reason": finish if last else None}
                c.update({"delta": {"content": pieces[i]}} if chat else {"text": pieces[i]})
                chunk = {"id": rid, "object": obj, "created": int(time.time()), "model": o.model, "choices": [c]}
                if last and o.timings:
                    chunk["timings"] = timings()
                event(chunk)
            if include_usage:
                event({"id": rid, "object": obj, "created": int(time.time()), "model": o.model, "choices": [],
                       "usage": usage})
            event("[DONE]")
        except (BrokenPipeError, ConnectionResetError):  # the client left: free the slot
            seq.cancelled = True

    def fail(self, seq: Seq) -> None:
        """A stalled stream goes silent until the client closes it; a dropped one is cut off now."""
        seq.cancelled = True  # its slot is freed either way
        if seq.fault == "stall":
            select.select([self.connection], [], [])  # readable once the client closes (EOF): no polling
            return
        self.connection.shutdown(socket.SHUT_RDWR)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"fake-serve {__version__}")
    p.add_argument("--flavor", choices=["vllm", "sglang", "llama-cpp-python"], required=True)
    p.add_argument("positional", nargs="*", help="ignored: 'serve MODEL' (vLLM style)")
    p.add_argument("--model-path", "--model", dest="model_path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-model-len", "--context-length", "--n_ctx", dest="max_len", type=int, default=4096)
    p.add_argument("--verbose", type=lambda s: s.lower() == "true", default=True)
    p.add_argument("--no-enable-prefix-caching", action="store_true")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--natural-len", type=int, default=5, help="tokens before the fake model emits EOS")
    p.add_argument("--prefill-s-per-token", type=float, default=0.0)
    p.add_argument("--decode-s-per-token", type=float, default=0.001)
    p.add_argument("--parallel", type=int, default=0,
                   help="continuous batching in N slots (0: one request at a time, the default)")
    p.add_argument("--batch-s-per-seq", type=float, default=0.0,
                   help="with --parallel: added cost of a decode step per sequence beyond the first")
    p.add_argument("--timings", action="store_true", help="with --parallel: llama.cpp timings in the last chunk")
    p.add_argument("--stall-requests", default="", help="with --parallel: arrival numbers (1-based) that stall")
    p.add_argument("--drop-requests", default="", help="with --parallel: arrival numbers whose stream is cut off")
    p.add_argument("--fail-after-tokens", type=int, default=2, help="tokens a stalled or dropped stream sends first")
    p.add_argument("--reorder", type=int, default=0,
                   help="with --parallel: hold the first K requests, then admit them last-first")
    return p


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # listen backlog: an open-loop burst must not meet SYN drops (the default is 5)


def main(argv: list[str] | None = None) -> int:
    opts, unknown = parser().parse_known_args(argv)  # real servers' other flags are accepted, ignored
    opts.model = opts.model_path or (opts.positional[-1] if opts.positional else "fake")
    if os.path.isdir(opts.model) and not os.path.isfile(os.path.join(opts.model, "config.json")):
        sys.stderr.write(f"fake {opts.flavor}: model directory {opts.model} has no config.json\n")
        return 2
    load_flags = opts.batch_s_per_seq or opts.timings or opts.stall_requests or opts.drop_requests or opts.reorder
    if opts.parallel < 0 or (load_flags and not opts.parallel):
        parser().error("--batch-s-per-seq, --timings, --stall-requests, --drop-requests and --reorder need "
                       "--parallel N (N >= 1)")
    Handler.state = State(opts)
    server = Server((opts.host, opts.port), Handler)
    sys.stderr.write(f"fake {opts.flavor} listening on {opts.host}:{opts.port} (ignored flags: {unknown})\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
