"""HTTP server speaking llama.cpp's server API and the OpenAI API (docs/contracts.md §1), on the
standard library.

``ThreadingHTTPServer`` gives each connection a thread; generation runs on one more thread, the
scheduler (``engine/scheduler.py``), which serves ``--parallel N`` sequences at once in the KV
cache's N slots: each decode step is one batched forward over every active sequence, and prompts
are read in chunks between decode steps (continuous batching, as llama.cpp's server and vLLM do).
``--parallel 1`` (the default) serves one generation at a time, as this server always did, with
the same forward passes. A connection thread turns its request's events into the HTTP response;
the scheduler never blocks on a client. Streaming uses server-sent events over chunked transfer
encoding, as vLLM's and llama.cpp's OpenAI servers do.

Under load: requests beyond the slots wait in a FIFO queue of at most ``--max-queue``; one more is
a 503 in OpenAI's error shape (a prompt beyond the context is a 400). A client that disconnects,
mid-stream or while waiting, is noticed at once: its connection thread sleeps in ``select`` on the
client's socket and on a pipe the scheduler writes a byte to with each event (no polling: a thread
waking every 50 ms cost ~4% of a prefill on two busy cores, measured), and the slot is freed at
the next step. ``/metrics`` shows slots in use, the queue's length and the decode batch sizes.

OpenAI compatibility (what the official ``openai`` client, AIPerf and guidellm send): ``GET
/v1/models``; ``max_completion_tokens`` (as ``max_tokens``); ``stop`` (a string or a list);
message ``content`` as a list of text parts; error bodies shaped ``{"error": {"message", "type",
"param", "code"}}``. What the server cannot honour (``n > 1``, ``logprobs``, ``echo``, penalties,
``top_p`` < 1, tools ...) is a 400 naming the field, never a silently different answer. Request
parsing lives in ``engine/api.py``.

Prefix cache (llama.cpp's ``cache_prompt``): each slot remembers which tokens its KV holds; a new
request goes to the free slot sharing the longest common token prefix with it and reuses that
prefix (at most N-1 of its N prompt tokens, because the last one must be evaluated to get logits).
A request with ``cache_prompt: false`` reuses nothing, whatever slot it gets.

Timings follow llama.cpp: ``prompt_ms`` runs from the request's admission into a slot until its
first token is sampled; ``predicted_ms`` from the first token to the last, so it spans
``predicted_n - 1`` decode steps (shared with whatever else runs) while ``predicted_per_second`` =
predicted_n / predicted_ms, exactly as llama.cpp reports it. Nothing but the clock is read per
token: usage, memory and the token list are built once, after the last token.

Memory between requests: glibc returns freed blocks above its trim/mmap thresholds to the OS and
then faults them back in on the next request (8k-210k minor faults per 1K-token prefill, up to 0.4 s,
../shared/NOISE.md). ``serve`` raises those thresholds with ``mallopt`` before loading, so memory
freed by one request stays mapped for the next (``--malloc-tuning off`` restores glibc's defaults).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import queue
import re
import resource
import selectors
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from . import ENGINE_NAME, NATIVE, __version__
from .api import RequestError, StopMatcher, check_strings, get_field, is_int, parse_common, parse_messages
from .generate import PREFILL_CHUNK
from .httpconn import Budget, ClientReader, Limits, SocketWriter, error_body, refuse
from .scheduler import BATCH_BUCKETS, QueueFull, Scheduler, Sequence
from .tokenizer import IncrementalDecoder
from .weights import DEFAULT_LINEAR

#: prompt tokens per chunk and per step with more than one slot (``--batch-tokens``)
PARALLEL_BATCH_TOKENS = 512


# --------------------------------------------------------------------------------------------------


class Completion:
    """One request's text side, the scheduler's ``sink``: detokenizes and cuts at stop strings as
    tokens arrive (on the scheduler thread), and hands the connection thread events:
    ("token", id, piece, finish, stats) per token, where finish and stats are None except on a final
    token known as such (the length limit, or a stop string: "length" / "stop"); then ("done",
    finish_reason, tail_text, stats, announced), where announced says a token event already carried
    finish_reason (else, e.g. after a stop id, the stream needs a closing chunk); or ("error", exc).
    Each event also writes a byte to the ``wake`` pipe, which the connection thread selects on; the
    scheduler closes its end with its last call (finished or failed), the connection thread the other."""

    def __init__(self, engine: "ServedModel", ids: list[int], p: dict):
        self.engine, self.ids, self.events = engine, ids, queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        tok = engine.loaded.tokenizer
        self.detok = IncrementalDecoder(tok)
        self.stops = StopMatcher(p["stop"]) if p["stop"] else None
        self.generated: list[int] = []
        self.hit = False
        self.stats = None
        self.t_first = self.t_last = None

    def started(self, reuse: int, limit: int) -> None:
        self.t0 = time.perf_counter()
        self.reuse, self.limit = reuse, limit
        self.faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def token(self, token: int) -> bool:
        self.t_last = time.perf_counter()
        if self.t_first is None:
            self.t_first = self.t_last
        self.generated.append(token)
        at_limit = len(self.generated) == self.limit
        piece = self.detok.push(token) + (self.detok.flush() if at_limit else "")
        if self.stops is not None:
            piece, self.hit = self.stops.push(piece)
            if at_limit and not self.hit:
                piece += self.stops.flush()
        finish = "stop" if self.hit else "length" if at_limit else None
        if finish is not None:  # the last token of this request: its chunk carries the figures
            self.stats = self.engine.stats(self.ids, self.reuse, self.generated, self.t0, self.t_first, self.t_last,
                                           self.faults0)
        self._put(("token", token, piece, finish, self.stats))
        return self.hit

    def _put(self, ev: tuple) -> None:
        self.events.put(ev)
        try:
            os.write(self.wake_w, b"\0")
        except OSError:  # the reader has gone (its request is being cancelled), or the pipe is full
            pass

    def _close_writer(self) -> None:
        if self.wake_w >= 0:
            os.close(self.wake_w)
            self.wake_w = -1

    def finished(self, reason: str) -> None:
        if reason == "cancelled":
            return self._close_writer()  # nobody reads on
        t_end = time.perf_counter()
        tail = ""
        if reason == "eos":  # the scheduler met a stop id itself
            tail = self.detok.flush()
            if self.stops is not None:
                tail, self.hit = self.stops.push(tail)
                tail += "" if self.hit else self.stops.flush()
        if self.t_first is None:
            self.t_first = self.t_last = t_end
        announced = self.stats is not None
        stats = self.stats or self.engine.stats(self.ids, self.reuse, self.generated, self.t0, self.t_first,
                                                self.t_last, self.faults0)
        self.engine.count(stats)
        t = stats["timings"]
        sys.stderr.write(f"timings: prompt_n={t['prompt_n']} prompt_ms={t['prompt_ms']:.2f} cache_n={t['cache_n']} "
                         f"predicted_n={t['predicted_n']} predicted_ms={t['predicted_ms']:.2f} "
                         f"minor_faults={stats['memory']['minor_faults']}\n")
        self._put(("done", "stop" if reason in ("eos", "stop") else "length", tail, stats, announced))
        self._close_writer()

    def failed(self, exc: Exception) -> None:
        self._put(("error", exc))
        self._close_writer()


class ServedModel:
    """The loaded model, its scheduler (started by ``load``) and the server's counters."""

    def __init__(self, spec: str, max_context: int | None, linear: str = DEFAULT_LINEAR,
                 decode_threads: int | None = None, kv: str = "auto", parallel: int = 1,
                 batch_tokens: int | None = None, max_queue: int = 128, fused_decode: str | None = None,
                 fast_paths_off=None):
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        self.spec, self.requested_context, self.linear, self.kv = spec, max_context, linear, kv
        self.decode_threads, self.parallel, self.max_queue = decode_threads, parallel, max_queue
        self.fused_decode, self.fast_paths_off = fused_decode, fast_paths_off
        # prompt tokens per forward pass and per step: today's 1,024-token passes for one slot; with
        # several, smaller chunks, so a long prompt holds every decoding stream back less
        self.batch_tokens = batch_tokens or (PREFILL_CHUNK if parallel == 1 else PARALLEL_BATCH_TOKENS)
        self.loaded = None  # set once loading finishes; /health says 503 until then
        self.scheduler: Scheduler | None = None
        self.counters = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "prompt_seconds": 0.0,
                         "decode_seconds": 0.0}

    def load(self) -> None:
        from . import native
        from .weights import load

        loaded = load(self.spec, self.requested_context, self.linear, self.kv, slots=self.parallel,
                      fused_decode=self.fused_decode, fast_paths_off=self.fast_paths_off)
        # before `loaded` is published: /health answers 200 from then on, and a request must not
        # reach the pool while it is resized
        self.threads = torch.get_num_threads()  # prefill's (read here: decode steps change it for a while)
        native.set_threads(self.decode_threads or self.threads)
        self.scheduler = Scheduler(loaded.model, loaded.tokenizer.stop_ids, chunk=self.batch_tokens,
                                   max_queue=self.max_queue, decode_threads=self.decode_threads)
        threading.Thread(target=self.scheduler.run, name="scheduler", daemon=True).start()
        self.loaded = loaded

    @property
    def max_context(self) -> int:
        return self.loaded.model.max_context

    def facts(self) -> dict:
        """What runs (``engine.facts``): kernels, fast paths, threads, KV dtype, versions."""
        from .facts import engine_facts

        return engine_facts(self.loaded, prefill_threads=self.threads, decode_threads=self.decode_threads or self.threads,
                            slots=self.parallel)

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        tok = self.loaded.tokenizer
        if chat:
            ids = self.chat_ids(parse_messages(body))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # the OpenAI API's batch of one prompt
            if isinstance(prompt, str):
                ids = tok.encode(prompt, add_special=True)
            elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
                bad = [t for t in prompt if not 0 <= t < self.loaded.config.vocab_size]
                if bad:
                    raise RequestError(f"field 'prompt': token id {bad[0]} outside the vocabulary "
                                       f"[0, {self.loaded.config.vocab_size})", param="prompt")
                ids = list(prompt)
            else:
                raise RequestError("field 'prompt' must be a string, a list of token ids, or a list of one "
                                   "of those", param="prompt")
        if not ids:
            raise RequestError("the prompt is empty", param="messages" if chat else "prompt")
        if len(ids) > self.max_context:
            raise RequestError(f"the prompt has {len(ids)} tokens, more than the context of {self.max_context}",
                               param="messages" if chat else "prompt", code="context_length_exceeded")
        return ids

    def chat_ids(self, messages: list[dict]) -> list[int]:
        try:
            return self.loaded.tokenizer.encode_chat(messages)
        except Exception as e:  # a template error is the request's fault (raise_exception)
            raise RequestError(f"chat template failed: {e}", param="messages") from e

    def memory(self) -> dict:
        return {"kv_bytes": int(self.loaded.model.kv_nbytes()),
                "kv_bytes_per_position": int(self.loaded.model.kv_bytes_per_position()),
                "peak_rss_bytes": peak_rss_bytes()}

    def run(self, ids: list[int], p: dict, client: ClientReader | None = None):
        """Queue a generation and yield its events (``Completion``) as the scheduler makes them.
        Closing the generator early cancels the request, which frees its slot; so does the client
        closing its connection (*client*'s socket) while this waits, which also raises
        ConnectionAbortedError. Bytes the client sends meanwhile are kept for its next request."""
        sink = Completion(self, ids, p)
        seq = Sequence(ids, p["max_tokens"], sink, temperature=p["temperature"], seed=p["seed"],
                       ignore_eos=p["ignore_eos"], cache_prompt=p["cache_prompt"])
        try:
            self.scheduler.submit(seq)
        except QueueFull as e:
            sink._close_writer()
            os.close(sink.wake_r)
            raise RequestError(f"server busy: {e}; try again later", 503, "unavailable_error", code="queue_full") from e
        # poll(2) through selectors: no FD_SETSIZE limit (select() broke beyond descriptor 1023)
        watch = selectors.PollSelector() if hasattr(selectors, "PollSelector") else selectors.DefaultSelector()
        watch.register(sink.wake_r, selectors.EVENT_READ, None)
        if client is not None:
            watch.register(client.sock, selectors.EVENT_READ, client)
        done = False
        try:
            while True:
                try:
                    ev = sink.events.get_nowait()
                except queue.Empty:
                    for key, _ in watch.select():  # sleeps until an event or the client moves
                        if key.data is None:
                            os.read(sink.wake_r, 65536)
                            continue
                        closed = client.absorb()
                        if closed:
                            raise ConnectionAbortedError("the client disconnected")
                        if closed is None:  # it sent more than a next request while waiting: stop watching
                            watch.unregister(client.sock)
                    continue
                if ev[0] == "error":
                    raise RuntimeError(f"generation failed: {type(ev[1]).__name__}: {ev[1]}") from ev[1]
                if ev[0] == "done":
                    done = True
                yield ev
                if done:
                    return
        finally:
            watch.close()
            if not done:
                self.scheduler.cancel(seq)
            os.close(sink.wake_r)

    def stats(self, ids, reuse, generated, t0, t_first, t_last, faults0) -> dict:
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
        memory = dict(self.memory(), minor_faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0)
        return {"timings": timings, "usage": usage, "tokens_cached": reuse, "memory": memory,
                "tokens": list(generated)}

    def count(self, stats: dict) -> None:
        c, t = self.counters, stats["timings"]
        c["requests"] += 1
        c["prompt_tokens"] += t["prompt_n"]
        c["generated_tokens"] += t["predicted_n"]
        c["prompt_seconds"] += t["prompt_ms"] / 1e3
        c["decode_seconds"] += t["predicted_ms"] / 1e3

    def metrics(self) -> str:
        """Prometheus text exposition (as llama.cpp's ``--metrics`` and vLLM serve it)."""
        c, mem, sch = self.counters, self.memory(), self.scheduler
        rows = [
            ("requests_total", "counter", "Completed generation requests.", c["requests"]),
            ("prompt_tokens_total", "counter", "Prompt tokens evaluated (cached ones excluded).", c["prompt_tokens"]),
            ("generated_tokens_total", "counter", "Tokens generated.", c["generated_tokens"]),
            ("prompt_seconds_total", "counter", "Time spent evaluating prompts.", c["prompt_seconds"]),
            ("decode_seconds_total", "counter", "Time from each first to last generated token.", c["decode_seconds"]),
            ("requests_processing", "gauge", "Generations holding a slot now.", sch.slots_in_use),
            ("slots_total", "gauge", "KV cache slots (--parallel).", len(sch.slots)),
            ("slots_in_use", "gauge", "Slots serving a request now.", sch.slots_in_use),
            ("queue_length", "gauge", "Requests waiting for a slot.", sch.queue_length),
            ("queue_max", "gauge", "Requests that may wait before one more is refused (503).", sch.max_queue),
            ("steps_total", "counter", "Scheduler steps run.", sch.steps),
            ("decode_steps_total", "counter", "Batched decode forward passes.", sch.decode_steps),
            ("decode_batch_tokens_total", "counter", "Tokens decoded in them (sum of batch sizes).", sch.decode_tokens),
            ("decode_batch_size_last", "gauge", "Sequences in the last decode step.", sch.last_batch),
            ("decode_step_seconds_total", "counter", "Time inside the batched decode forwards.", sch.decode_seconds),
            ("prefill_chunks_total", "counter", "Prompt chunks evaluated.", sch.prefill_chunks),
            ("kv_cache_bytes", "gauge", "Bytes of KV cache allocated (all slots).", mem["kv_bytes"]),
            ("peak_rss_bytes", "gauge", "Peak resident set size of the server process.", mem["peak_rss_bytes"]),
        ]
        lines = []
        for name, kind, help_, value in rows:
            lines += [f"# HELP pairbench_engine_{name} {help_}", f"# TYPE pairbench_engine_{name} {kind}",
                      f"pairbench_engine_{name} {value}"]
        name = "pairbench_engine_decode_batch_size"
        lines += [f"# HELP {name} Sequences per batched decode step.", f"# TYPE {name} histogram"]
        total = 0
        for le, n in zip([*map(str, BATCH_BUCKETS), "+Inf"], sch.batch_hist):
            total += n
            lines.append(f'{name}_bucket{{le="{le}"}} {total}')
        lines += [f"{name}_sum {sch.decode_tokens}", f"{name}_count {sch.decode_steps}"]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"{ENGINE_NAME}/{__version__}"
    engine: ServedModel  # set on the subclass made by make_server

    def setup(self):
        self.connection = self.request
        # Headers and the first streamed chunk are two small writes; with Nagle's algorithm the
        # second waits for the client's (delayed) ACK of the first: 40+ ms on a reused connection.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = ClientReader(self.connection)  # every read under a deadline (engine/httpconn.py)
        self.rfile = io.BufferedReader(self.reader, 1 << 16)
        self.wfile = SocketWriter(self.connection)

    def finish(self):
        pass  # nothing buffered on the way out; the server closes the socket

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, TimeoutError) as e:
            self.log_message("client connection closed: %s", type(e).__name__)  # one line, no traceback
            self.close_connection = True

    def handle_one_request(self):
        """Read one request under the header deadline, then dispatch it (BaseHTTPRequestHandler's,
        with the deadlines, a 408 for a request cut short, 405 for an unknown method and no HTTP/0.9)."""
        limits: Limits = self.server.limits
        self.close_connection = True  # until a whole request line and its headers are in
        self.command, self.request_version, self.requestline, self.raw_requestline = "", "HTTP/1.1", "", b""
        self.reader.received = 0
        self.reader.deadline = time.monotonic() + limits.header_timeout_s
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                return
            if len(self.raw_requestline) > 65536:
                return self.send_error(414)
            if not self.parse_request():
                return  # parse_request answered (400, 431, ...)
        except TimeoutError:
            if self.reader.received:  # a request begun and never finished; an idle connection just closes
                self.send_error(408, f"the request's headers did not arrive within {limits.header_timeout_s:g} s")
            return
        finally:
            self.reader.deadline = None
        if self.request_version == "HTTP/0.9":
            return self.send_error(400, "HTTP/0.9 requests are not supported")
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            return self.send_error(405, f"method {self.command} is not allowed")
        self.connection.settimeout(limits.body_timeout_s)  # each write of the response, to a client not reading
        method()
        self.wfile.flush()

    def send_error(self, code, message=None, explain=None):
        """Every error the HTTP layer itself sends (a malformed request line, headers too large, a
        timeout...) in OpenAI's JSON shape, never the standard library's HTML page; the connection is
        closed after it. A version the server does not speak is a 400 (the client's request is wrong)."""
        if code == 505:
            code = 400
        short = self.responses.get(code, ("Error", ""))[0]
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.1"  # an answer with a status line, never a bare body
        kind = {404: "not_found_error", 408: "timeout_error", 503: "unavailable_error"}.get(code, "invalid_request_error")
        body = error_body(f"{short}: {message or short}" + (f" ({explain})" if explain else ""), kind)
        self.close_connection = True
        try:
            self.send_response(code, short)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            # a HEAD answer has no body, even when the request line failed to parse before the
            # method was taken from it (``HEAD /x HTTP/2.0``: found by tests/engine/test_server_fuzz.py)
            line = getattr(self, "raw_requestline", b"")
            head = self.command == "HEAD" or (not self.command and line.split(b" ", 1)[0] == b"HEAD")
            if not head:
                self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, format, *args):  # one short line per request, on stderr
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # ---- plumbing
    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_json(self, status: int, obj: dict) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _send_error(self, e: RequestError) -> None:
        self._send_json(e.status, {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}})

    def _body_length(self) -> int:
        """The request body's length from its headers; RequestError (and the connection closed: its
        body cannot be skipped) for a transfer coding, a missing, bad or ambiguous Content-Length, or
        a body beyond ``--max-body-bytes``."""
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            coding = self.headers["Transfer-Encoding"]
            if "chunked" in coding.lower():
                raise RequestError("chunked request bodies are not supported: send the body with a "
                                   "Content-Length header", 411, code="length_required")
            raise RequestError(f"Transfer-Encoding {coding[:40]!r} is not supported", 501, "not_implemented_error")
        values = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if not values:
            self.close_connection = True
            raise RequestError("a POST needs a Content-Length header", 411, code="length_required")
        value = values.pop()
        if values or not re.fullmatch(r"[0-9]{1,18}", value):
            self.close_connection = True
            raise RequestError(f"bad Content-Length header {value[:40]!r}", code="bad_content_length")
        length = int(value)
        if length > self.server.limits.max_body_bytes:
            self.close_connection = True
            raise RequestError(f"request body of {length} bytes is larger than the server's limit of "
                               f"{self.server.limits.max_body_bytes} (--max-body-bytes)", status=413)
        return length

    def _read_body(self) -> dict:
        length = self._body_length()
        limits, budget = self.server.limits, self.server.budget
        if not budget.take(length):
            self.close_connection = True
            raise RequestError(f"server busy: request bodies being read exceed {limits.body_budget_bytes} bytes "
                               "(--body-budget); try again later", 503, "unavailable_error", code="body_budget")
        try:
            self.reader.deadline = time.monotonic() + limits.body_timeout_s
            raw = self.rfile.read(length) if length > 0 else b""
        except TimeoutError:
            self.close_connection = True
            raise RequestError(f"the request body ({length} bytes) did not arrive within {limits.body_timeout_s:g} s",
                               408, "timeout_error", code="body_timeout") from None
        finally:
            self.reader.deadline = None
            budget.give(length)
        if len(raw) < length:
            raise ConnectionAbortedError("the client closed the connection in the middle of the body")
        return parse_json_body(raw)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    # ---- routes
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if "Transfer-Encoding" in self.headers or self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            self.close_connection = True  # a body we do not read: the connection cannot carry on
        loaded = self.engine.loaded
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_json(503, {"status": "loading"}) if loaded is None else self._send_json(200, {"status": "ok"})
        elif path == "/version":
            self._send_json(200, {"engine": ENGINE_NAME, "version": __version__, "native": NATIVE})
        elif loaded is None and path in ("/v1/models", "/metrics", "/props"):
            self._send_error(RequestError("the model is still loading", 503, "unavailable_error"))
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [self._model_card()]})
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if loaded is not None and name == loaded.name:
                self._send_json(200, self._model_card())
            else:
                self._send_error(RequestError(f"model {name!r} does not exist", 404, "not_found_error",
                                              param="model", code="model_not_found"))
        elif path == "/metrics":
            text = self.engine.metrics() + self.server.metrics()
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/props":  # llama-server's route for the server's settings; here what runs
            self._send_json(200, {"engine_facts": self.engine.facts()})
        else:
            self._send_error(RequestError(f"no route {self.command} {path}", 404, "not_found_error"))

    def _model_card(self) -> dict:
        loaded = self.engine.loaded
        return {"id": loaded.name, "object": "model", "created": int(self.server.started), "owned_by": ENGINE_NAME,
                "max_model_len": self.engine.max_context}

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
            self._send_error(e)
        except (ConnectionError, TimeoutError):
            self.log_message("client connection closed mid-response")
            self.close_connection = True
        except Exception as e:  # a bug must not take the server down; report it as a 500
            self.log_message("internal error: %r", e)
            self._send_error(RequestError(f"internal error: {type(e).__name__}: {e}", 500, "server_error"))

    def tokenize(self, body: dict) -> None:
        tok = self.engine.loaded.tokenizer
        if "messages" in body:
            ids = self.engine.chat_ids(parse_messages(body))
        else:
            content = body.get("content")
            if not isinstance(content, str):
                raise RequestError("field 'content' must be a string (or send 'messages')", param="content")
            add_special = get_field(body, "add_special", lambda v: isinstance(v, bool), "a boolean", False)
            ids = tok.encode(content, add_special=add_special)
        self._send_json(200, {"tokens": ids, "count": len(ids)})

    def complete(self, body: dict, chat: bool) -> None:
        p = parse_common(body)
        ids = self.engine.prompt_ids(body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.engine.loaded.name}
        events = self.engine.run(ids, p, client=self.reader)
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
                    _, finish, tail, stats, _ = ev
                    text.append(tail)
        finally:
            events.close()  # cancels the request (frees its slot) if something above failed
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
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
            c = {"index": 0, "finish_reason": finish, "tokens": tokens, "logprobs": None}
            if chat:
                c["delta"] = {"role": "assistant", "content": piece} if first else {"content": piece}
            else:
                c["text"] = piece
            return c

        started = False
        n_sent = 0
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
                    _, token, piece, finish, stats = ev
                    n_sent += 1
                    obj = dict(chunk_head, choices=[choice(piece, [token], finish, first=n_sent == 1)])
                    if stats is not None:
                        obj.update(self._extras(stats))
                    self._event(obj)
                else:
                    _, finish, tail, stats, announced = ev
                    if not announced:
                        # Ended by a stop id (or produced nothing): a closing chunk carries finish_reason.
                        obj = dict(chunk_head, choices=[choice(tail, [], finish, first=n_sent == 0)],
                                   **self._extras(stats))
                        self._event(obj)
                    if p["include_usage"]:
                        self._event(dict(chunk_head, choices=[], usage=stats["usage"], **self._extras(stats)))
            self._event(b"[DONE]")
            self._chunk(b"")  # end of the chunked body
        except (ConnectionError, TimeoutError):
            self.log_message("client left mid-stream")  # closing the generator frees the request's slot
            self.close_connection = True
        except Exception as e:
            if not started:
                raise  # nothing sent yet: do_POST answers with a JSON error status
            # Headers are out: report the failure in-band and end the stream properly.
            self.log_message("internal error mid-stream: %r", e)
            self._event({"error": {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                                   "param": None, "code": None}})
            self._chunk(b"")
            self.close_connection = True
        finally:
            events.close()


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (send a finite number)")


def parse_json_body(raw: bytes) -> dict:
    """A request body as a JSON object; RequestError (400) naming what is wrong: not JSON, NaN or
    Infinity (not JSON either, though Python reads them), nested too deeply, not an object, or a
    string holding a lone UTF-16 surrogate (which no tokenizer can take)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise RequestError("malformed JSON body: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"malformed JSON body: {e}"[:300]) from None
    if not isinstance(body, dict):
        raise RequestError("the JSON body must be an object")
    check_strings(body)
    return body


class Server(ThreadingHTTPServer):
    """A thread per connection, at most ``limits.max_connections`` at once (one more gets a 503
    from the accepting thread and is closed), with a listen backlog of ``limits.backlog``."""

    daemon_threads = True

    def __init__(self, address, handler, limits: Limits):
        self.limits, self.budget = limits, Budget(limits.body_budget_bytes)
        self.request_queue_size = limits.backlog  # listen()'s backlog, read by server_activate
        self.active = self.refused = 0
        self.active_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        with self.active_lock:
            full = self.active >= self.limits.max_connections
            self.active += not full
            self.refused += full
        if full:
            refuse(request, 503, "Service Unavailable", f"server busy: {self.limits.max_connections} connections "
                   "are open (--max-connections); try again later", "unavailable_error", "too_many_connections")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: this connection is not open
            with self.active_lock:
                self.active -= 1
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.active_lock:
                self.active -= 1

    def metrics(self) -> str:
        rows = [("connections_open", "gauge", "Connections being served now.", self.active),
                ("connections_max", "gauge", "Connections served at once (--max-connections).",
                 self.limits.max_connections),
                ("connections_refused_total", "counter", "Connections refused with 503: too many open.", self.refused),
                ("body_bytes_reading", "gauge", "Bytes of request bodies being read now (of --body-budget).",
                 self.budget.used)]
        return "".join(f"# HELP pairbench_engine_{n} {h}\n# TYPE pairbench_engine_{n} {k}\npairbench_engine_{n} {v}\n"
                       for n, k, h, v in rows)

    def handle_error(self, request, client_address):
        # A client that resets its connection is routine: one line, not socketserver's traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            sys.stderr.write(f"{client_address[0]} client connection closed: {type(exc).__name__}\n")
        else:
            super().handle_error(request, client_address)


def make_server(engine: ServedModel, host: str, port: int, limits: Limits | None = None) -> Server:
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server = Server((host, port), handler, limits or Limits())
    server.started = time.time()
    return server


def peak_rss_bytes() -> int:
    """This process's peak resident set size: VmHWM of /proc/self/status, which exec resets. Not
    ``ru_maxrss``: Linux carries that over from the forked parent, so a server started by a big
    process (a benchmark holding transformers, 2.5 GB) reported the parent's peak, not its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8


def tune_malloc() -> dict:
    """Keep freed memory mapped between requests: never trim the heap, serve every allocation from
    it instead of fresh mmaps (a threshold of 32 MiB, glibc's maximum, and no mmapped chunks at all:
    with the threshold alone, steady 1,024-token requests still took 20k-110k minor faults each in
    bench/engine_speed.py's fault phase, none with both, docs/perf.md), and use at most two arenas (one per core, so
    per-connection threads do not each keep a heap). Returns what was applied (empty if not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return {}
    wanted = {"trim_threshold": (M_TRIM_THRESHOLD, 2**31 - 1), "mmap_threshold": (M_MMAP_THRESHOLD, 32 * 2**20),
              "mmap_max": (M_MMAP_MAX, 0), "arena_max": (M_ARENA_MAX, 2)}
    return {name: value for name, (param, value) in wanted.items() if libc.mallopt(param, value) == 1}


def serve(spec: str, host: str = "127.0.0.1", port: int = 8080, threads: int | None = None,
          max_context: int | None = None, linear: str = DEFAULT_LINEAR, decode_threads: int | None = None,
          kv: str = "auto", malloc_tuning: bool = True, parallel: int = 1, batch_tokens: int | None = None,
          max_queue: int = 128, fused_decode: str | None = None, fast_paths_off=None,
          limits: Limits | None = None) -> int:
    """Listen at once (``/health`` answers 503 while loading), load the model, serve until SIGTERM/SIGINT."""
    tuned = tune_malloc() if malloc_tuning else {}
    if threads is not None:
        torch.set_num_threads(threads)
    decode_threads = decode_threads or None  # None or 0: all of the process's threads (--threads)
    engine = ServedModel(spec, max_context, linear, decode_threads, kv, parallel, batch_tokens, max_queue, fused_decode,
                         fast_paths_off)
    server = make_server(engine, host, port, limits)
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
        except (ValueError, OSError) as e:  # FastPathRefused (fused_decode on) is a ValueError too
            print(f"{NATIVE}: cannot load model: {e}", file=sys.stderr, flush=True)
            return 2
        lm = engine.loaded
        from .facts import summary

        print(f"{NATIVE} ready: model {lm.name} on http://{host}:{server.server_address[1]} "
              f"({engine.parallel} slot{'s' if engine.parallel > 1 else ''} of max_context {engine.max_context}, "
              f"batch tokens {engine.batch_tokens}, queue {engine.max_queue}, {summary(engine.facts())}, "
              f"malloc {'tuned ' + ','.join(tuned) if tuned else 'glibc defaults'}, "
              f"loaded in {time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        threading.Event().wait()
    except SystemExit as e:
        code = e.code or 0
    finally:
        if engine.scheduler is not None:
            engine.scheduler.stop()
        server.shutdown()
        server.server_close()
    return code
