"""A fake OpenAI-compatible server that answers like vLLM, SGLang or llama-cpp-python (``--flavor``).

It exists so pairbench's vllm and sglang engine profiles (config/engines/) can be exercised on a
CPU: launched with the profile's own command-line flags (the program is swapped for this file), it
mimics each server's reply *fields*, as read from their sources:

- vLLM: ``GET /health`` (200, empty body), ``GET /version``, ``POST /tokenize`` (``prompt`` or
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

Model: byte-level tokenizer (id = byte + 3; 1 = <|im_start|>, 2 = <|im_end|>) with a ChatML template.
A model given as a directory must be a Hugging Face one (it holds ``config.json``): the fake checks
that much, and answers with its own tokenizer, which a test's model directory reproduces.

Run: ``python tests/fakes/openai_compat.py --flavor vllm serve MODEL --port 8000 --no-enable-prefix-caching``,
or, installed (``tests/fakes/fake_serve/`` is its package), ``fake-serve ...`` or ``python -m fake_serve ...``.
``GET /version`` and ``--version`` tell the package's version.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _typed(body: dict, key: str, kind, default):
    value = body.get(key, default)
    if value is not None and not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {key!r} must be {kind.__name__}")
    return value


class Handler(BaseHTTPRequestHandler):
    state: State
    protocol_version = "HTTP/1.1"

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
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            if st.report and cached > 0:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
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
    return p


def main(argv: list[str] | None = None) -> int:
    opts, unknown = parser().parse_known_args(argv)  # real servers' other flags are accepted, ignored
    opts.model = opts.model_path or (opts.positional[-1] if opts.positional else "fake")
    if os.path.isdir(opts.model) and not os.path.isfile(os.path.join(opts.model, "config.json")):
        sys.stderr.write(f"fake {opts.flavor}: model directory {opts.model} has no config.json\n")
        return 2
    Handler.state = State(opts)
    server = ThreadingHTTPServer((opts.host, opts.port), Handler)
    sys.stderr.write(f"fake {opts.flavor} listening on {opts.host}:{opts.port} (ignored flags: {unknown})\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
