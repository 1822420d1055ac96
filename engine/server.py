"""HTTP server speaking llama.cpp's server API (docs/contracts.md §1), on the standard library.

``ThreadingHTTPServer`` answers health/version/tokenize concurrently; a lock around the model runs
one generation at a time (the KV cache is a single sequence). Streaming uses server-sent events over
chunked transfer encoding, as vLLM's and llama.cpp's OpenAI servers do.

Prefix cache (llama.cpp's ``cache_prompt``): the server remembers which tokens the KV cache holds;
a new request reuses the longest common token prefix with them (at most N-1 of its N prompt
tokens, because the last one must be evaluated to get logits) and evaluates only the rest.

Timings follow llama.cpp: ``prompt_ms`` runs from the start of evaluation until the first token is
sampled; ``predicted_ms`` from the first token to the last, so it spans ``predicted_n - 1`` forward
passes while ``predicted_per_second`` = predicted_n / predicted_ms, exactly as llama.cpp reports it.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from . import ENGINE_NAME, NATIVE, __version__
from .generate import generate, token_limit
from .tokenizer import IncrementalDecoder

MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 0.8  # llama.cpp's default


class RequestError(Exception):
    """A request the server refuses: becomes ``{"error": {...}}`` with a 4xx status."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


# --------------------------------------------------------------------------------------------------
# Request validation: known fields must have the documented types; unknown fields are ignored.

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _get(body: dict, key: str, check, what: str, default):
    value = body.get(key)
    if value is None:
        return default
    if not check(value):
        raise RequestError(f"field '{key}' must be {what}, got {json.dumps(value)[:80]}")
    return value


def parse_common(body: dict) -> dict:
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RequestError(f"field 'stream_options' must be an object, got {json.dumps(opts)[:80]}")
    include_usage = _get(opts or {}, "include_usage", lambda v: isinstance(v, bool), "a boolean", False)
    return {
        "max_tokens": _get(body, "max_tokens", lambda v: _is_int(v) and v >= 0, "an integer >= 0", DEFAULT_MAX_TOKENS),
        "temperature": float(_get(body, "temperature", lambda v: (_is_int(v) or isinstance(v, float)) and v >= 0,
                                  "a number >= 0", DEFAULT_TEMPERATURE)),
        "seed": _get(body, "seed", _is_int, "an integer", None),
        "stream": _get(body, "stream", lambda v: isinstance(v, bool), "a boolean", False),
        "include_usage": include_usage,
        "ignore_eos": _get(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False),
        "cache_prompt": _get(body, "cache_prompt", lambda v: isinstance(v, bool), "a boolean", True),
        "return_tokens": _get(body, "return_tokens", lambda v: isinstance(v, bool), "a boolean", False),
    }


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("field 'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"messages[{i}] must be an object with string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# --------------------------------------------------------------------------------------------------


class Engine:
    """The loaded model plus the prefix-cache bookkeeping; ``lock`` serialises generations."""

    def __init__(self, spec: str, max_context: int | None, linear: str = "fp32",
                 decode_threads: int | None = None):
        self.spec, self.requested_context, self.linear = spec, max_context, linear
        self.decode_threads = decode_threads
        self.loaded = None  # set once loading finishes; /health says 503 until then
        self.lock = threading.Lock()
        self.cached: list[int] = []  # tokens whose KV is valid at positions 0..len-1

    def load(self) -> None:
        from .weights import load

        self.loaded = load(self.spec, self.requested_context, self.linear)

    @property
    def max_context(self) -> int:
        return self.loaded.model.max_context

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        tok = self.loaded.tokenizer
        if chat:
            messages = parse_messages(body)
            try:
                ids = tok.encode_chat(messages)
            except Exception as e:  # a template error is the request's fault (raise_exception)
                raise RequestError(f"chat template failed: {e}") from e
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                ids = tok.encode(prompt, add_special=True)
            elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
                bad = [t for t in prompt if not 0 <= t < self.loaded.config.vocab_size]
                if bad:
                    raise RequestError(f"field 'prompt': token id {bad[0]} outside the vocabulary "
                                       f"[0, {self.loaded.config.vocab_size})")
                ids = list(prompt)
            else:
                raise RequestError("field 'prompt' must be a string or a list of token ids")
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) > self.max_context:
            raise RequestError(f"the prompt has {len(ids)} tokens, more than the context of {self.max_context}",
                               kind="exceed_context_size_error")
        return ids

    def memory(self) -> dict:
        return {"kv_bytes": int(self.loaded.model.kv_nbytes()),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def run(self, ids: list[int], p: dict):
        """Generate under the lock. Yields ("token", id, piece, is_last) per token, then
        ("done", finish_reason, tail_text, stats)."""
        tok = self.loaded.tokenizer
        limit = token_limit(len(ids), p["max_tokens"], self.max_context)
        with self.lock:
            reuse = min(longest_common_prefix(self.cached, ids), len(ids) - 1) if p["cache_prompt"] else 0
            self.cached = []  # until this generation completes, the cache content is in flux
            generated: list[int] = []
            detok = IncrementalDecoder(tok)
            finish = "length"
            t0 = time.perf_counter()
            t_first = t_last = None
            gen = generate(self.loaded.model, ids, p["max_tokens"], stop_ids=tok.stop_ids,
                           temperature=p["temperature"], seed=p["seed"], ignore_eos=p["ignore_eos"], start=reuse,
                           decode_threads=self.decode_threads)
            try:
                for token in gen:
                    t_last = time.perf_counter()
                    if t_first is None:
                        t_first = t_last
                    generated.append(token)
                    is_last = len(generated) == limit
                    piece = detok.push(token) + (detok.flush() if is_last else "")
                    yield "token", token, piece, is_last, self._stats(ids, reuse, generated, t0, t_first, t_last)
                if len(generated) < limit:
                    finish = "stop"
            finally:
                gen.close()
                t_end = time.perf_counter()
                # KV now holds the prompt and every generated token that was fed back (all of them
                # after a stop token, all but the last one otherwise).
                fed = generated if finish == "stop" else generated[:-1]
                self.cached = ids + fed
            if t_first is None:
                t_first = t_last = t_end
            yield "done", finish, detok.flush(), self._stats(ids, reuse, generated, t0, t_first, t_last)

    def _stats(self, ids, reuse, generated, t0, t_first, t_last) -> dict:
        prompt_ms = (t_first - t0) * 1e3
        predicted_ms = (t_last - t_first) * 1e3
        n, m = len(ids), len(generated)
        timings = {
            "prompt_n": n - reuse, "prompt_ms": prompt_ms, "cache_n": reuse,
            "prompt_per_second": (n - reuse) / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
            "predicted_n": m, "predicted_ms": predicted_ms,
            "predicted_per_second": m / predicted_ms * 1e3 if predicted_ms > 0 else 0.0,
        }
        usage = {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m,
                 "prompt_tokens_details": {"cached_tokens": reuse}}
        return {"timings": timings, "usage": usage, "tokens_cached": reuse, "memory": self.memory(),
                "tokens": list(generated)}


# --------------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"{ENGINE_NAME}/{__version__}"
    engine: Engine  # set on the subclass made by make_server

    def log_message(self, format, *args):  # one short line per request, on stderr
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # ---- plumbing
    def _send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, kind: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _read_body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise RequestError("bad Content-Length header") from None
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError(f"request body of {length} bytes is too large", status=413)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the JSON body must be an object")
        return body

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    # ---- routes
    def do_GET(self):
        if self.path == "/health":
            if self.engine.loaded is None:
                self._send_json(503, {"status": "loading"})
            else:
                self._send_json(200, {"status": "ok"})
        elif self.path == "/version":
            self._send_json(200, {"engine": ENGINE_NAME, "version": __version__, "native": NATIVE})
        else:
            self._send_error(404, f"no route GET {self.path}", "not_found_error")

    def do_POST(self):
        routes = {"/tokenize": self.tokenize, "/v1/completions": lambda b: self.complete(b, chat=False),
                  "/v1/chat/completions": lambda b: self.complete(b, chat=True)}
        try:
            body = self._read_body()
            if self.path not in routes:
                raise RequestError(f"no route POST {self.path}", status=404, kind="not_found_error")
            if self.engine.loaded is None:
                raise RequestError("the model is still loading", status=503, kind="unavailable_error")
            routes[self.path](body)
        except RequestError as e:
            self._send_error(e.status, str(e), e.kind)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug must not take the server down; report it as a 500
            self.log_message("internal error: %r", e)
            self._send_error(500, f"internal error: {type(e).__name__}: {e}", "server_error")

    def tokenize(self, body: dict) -> None:
        tok = self.engine.loaded.tokenizer
        if "messages" in body:
            ids = tok.encode_chat(parse_messages(body))
        else:
            content = body.get("content")
            if not isinstance(content, str):
                raise RequestError("field 'content' must be a string (or send 'messages')")
            add_special = _get(body, "add_special", lambda v: isinstance(v, bool), "a boolean", False)
            ids = tok.encode(content, add_special=add_special)
        self._send_json(200, {"tokens": ids, "count": len(ids)})

    def complete(self, body: dict, chat: bool) -> None:
        p = parse_common(body)
        ids = self.engine.prompt_ids(body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.engine.loaded.name}
        events = self.engine.run(ids, p)
        if p["stream"]:
            self._stream(events, head, p, chat)
        else:
            self._whole(events, head, p, chat)

    @staticmethod
    def _extras(stats: dict) -> dict:
        return {"timings": stats["timings"], "tokens_cached": stats["tokens_cached"], "memory": stats["memory"]}

    def _whole(self, events, head: dict, p: dict, chat: bool) -> None:
        text = []
        try:
            for ev in events:
                if ev[0] == "token":
                    text.append(ev[2])
                else:
                    _, finish, tail, stats = ev
                    text.append(tail)
        finally:
            events.close()  # releases the model lock even if something above failed
        choice = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        if p["return_tokens"]:
            choice["tokens"] = stats["tokens"]
        obj = dict(head, object="chat.completion" if chat else "text_completion", choices=[choice],
                   usage=stats["usage"], **self._extras(stats))
        self._send_json(200, obj)

    def _stream(self, events, head: dict, p: dict, chat: bool) -> None:
        # Nothing is sent before the first event: validation errors above still get a plain 4xx.
        chunk_head = dict(head, object="chat.completion.chunk" if chat else "text_completion")

        def choice(piece: str, tokens: list[int], finish, first: bool) -> dict:
            c = {"index": 0, "finish_reason": finish, "tokens": tokens}
            if chat:
                c["delta"] = {"role": "assistant", "content": piece} if first else {"content": piece}
            else:
                c["text"] = piece
            return c

        started = False
        try:
            for ev in events:
                if not started:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    started = True
                if ev[0] == "token":
                    _, token, piece, is_last, stats = ev
                    obj = dict(chunk_head, choices=[choice(piece, [token], "length" if is_last else None,
                                                           first=stats["usage"]["completion_tokens"] == 1)])
                    if is_last:
                        obj.update(self._extras(stats))
                    self._event(obj)
                else:
                    _, finish, tail, stats = ev
                    if finish != "length" or stats["usage"]["completion_tokens"] == 0:
                        # Ended by a stop token (or produced nothing): a closing chunk carries finish_reason.
                        obj = dict(chunk_head, choices=[choice(tail, [], finish, first=False)], **self._extras(stats))
                        self._event(obj)
                    if p["include_usage"]:
                        self._event(dict(chunk_head, choices=[], usage=stats["usage"], **self._extras(stats)))
            self._event(b"[DONE]")
            self._chunk(b"")  # end of the chunked body
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; the generator's finally restores the cache
        except Exception as e:
            if not started:
                raise  # nothing sent yet: do_POST answers with a JSON error status
            # Headers are out: report the failure in-band and end the stream properly.
            self.log_message("internal error mid-stream: %r", e)
            self._event({"error": {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                                   "code": 500}})
            self._chunk(b"")
            self.close_connection = True
        finally:
            events.close()


def make_server(engine: Engine, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(spec: str, host: str = "127.0.0.1", port: int = 8080, threads: int | None = None,
          max_context: int | None = None, linear: str = "fp16", decode_threads: int | None = 1) -> int:
    """Listen at once (``/health`` answers 503 while loading), load the model, serve until SIGTERM/SIGINT."""
    if threads is not None:
        torch.set_num_threads(threads)
    engine = Engine(spec, max_context, linear, decode_threads)
    server = make_server(engine, host, port)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        t0 = time.perf_counter()
        try:
            engine.load()
        except (ValueError, OSError) as e:
            print(f"{NATIVE}: cannot load model: {e}", file=sys.stderr, flush=True)
            return 2
        print(f"{NATIVE} ready: model {engine.loaded.name} on http://{host}:{server.server_address[1]} "
              f"(max_context {engine.max_context}, linear {linear}, threads {torch.get_num_threads()}, "
              f"decode threads {decode_threads or torch.get_num_threads()}, "
              f"loaded in {time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        threading.Event().wait()
    except SystemExit as e:
        code = e.code or 0
    finally:
        server.shutdown()
        server.server_close()
    return code
