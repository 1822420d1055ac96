"""A fake engine: a stdlib HTTP server speaking docs/contracts.md §1, and misbehaving on request.

It stands in for ``python -m engine`` so the harness and the pipeline can be tested quickly and
hermetically, including against the failures real engines show. It is a *package* (this folder is
copied as an arm's source, exactly like engine/), and ``tests/fakes/fake_engine.py`` runs it
directly.

Model: a byte-level tokenizer (token id = byte + 3; 1 = <|im_start|>, 2 = <|im_end|>, 0 = EOS) with
a ChatML template, and a "generator" that emits the bytes of ``--output-text`` over and over, so
outputs are deterministic. Prefill and decode take simulated time per token.

Misbehaviours (each a CLI flag, or the environment variable ``FAKE_ENGINE_<FLAG>`` with dashes as
underscores, e.g. ``FAKE_ENGINE_PROMPT_EXTRA=1``):

--prompt-extra N      usage.prompt_tokens (and timings.prompt_n) over-report by N
--completion-short N  generate N fewer tokens than asked
--report-cached N     claim N prompt tokens came from the cache even with cache_prompt false
--tokenize-extra N    /tokenize counts N more tokens than the prompt has
--broken-output       every generated token is an empty string (text "")
--crash-after N       the process exits after streaming N tokens of a completion
--hang                completion requests never answer
--malformed-sse       streamed chunks are not valid JSON
--slow-start S        /health answers 503 "loading" for S seconds after start
--once-text T         with --once-file F: the first --once-count (default 1) steady requests (max_tokens
                      above 8, the size of the harness's first-request diagnostics) of all launches
                      sharing F emit T instead of --output-text; F counts them, so later ones answer
                      normally
--fail-start          exit with status 3 before listening
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = (Path(__file__).resolve().parent / "VERSION").read_text().strip()
NAME = "fake-engine"
IM_START, IM_END, EOS = 1, 2, 0
OFFSET = 3
DEFAULT_OUTPUT = "    return a + b\n\n# done\n"


def encode(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    return bytes(i - OFFSET for i in ids if i >= OFFSET).decode("utf-8", errors="replace")


def apply_template(messages: list[dict]) -> list[int]:
    ids: list[int] = []
    for msg in messages:
        ids += [IM_START] + encode(f"{msg['role']}\n{msg['content']}") + [IM_END] + encode("\n")
    return ids + [IM_START] + encode("assistant\n")


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Fake:
    """The fake model state: options, the prefix cache, and a lock (one request computes at a time)."""

    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.previous: list[int] = []

    def output_text(self, body: dict) -> str:
        """--output-text, or --once-text for the first --once-count steady requests across launches."""
        opts = self.opts
        if opts.once_text is None or not opts.once_file or body.get("max_tokens", 16) <= 8:
            return opts.output_text
        fd = os.open(opts.once_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # launches never overlap, but count safely anyway
            sent = int(os.read(fd, 64).decode() or 0)
            if sent >= opts.once_count:
                return opts.output_text
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str(sent + 1).encode())
            return opts.once_text
        finally:
            os.close(fd)

    def tokenize(self, body: dict) -> list[int]:
        if "messages" in body:
            ids = apply_template(check_messages(body["messages"]))
        elif isinstance(body.get("content"), str):
            ids = encode(body["content"])
        else:
            raise HttpError(400, "tokenize needs 'content' (str) or 'messages'")
        return ids + [IM_START] * self.opts.tokenize_extra

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            return apply_template(check_messages(body.get("messages")))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise HttpError(400, "'prompt' must be a string or a list of token ids")


def check_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise HttpError(400, "each message needs string 'role' and 'content'")
    return messages


def check_fields(body: dict) -> dict:
    types = {"max_tokens": int, "temperature": (int, float), "seed": int, "stream": bool,
             "ignore_eos": bool, "cache_prompt": bool, "return_tokens": bool, "stream_options": dict}
    for key, typ in types.items():
        if key in body and (not isinstance(body[key], typ) or (typ is int and isinstance(body[key], bool))):
            raise HttpError(400, f"field {key!r} has the wrong type")
    if body.get("max_tokens", 16) < 0:
        raise HttpError(400, "'max_tokens' must be >= 0")
    return body


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-engine"
    fake: Fake

    def setup(self):
        super().setup()
        # Streamed chunks are tiny: without TCP_NODELAY, Nagle + delayed ACK add ~40-200 ms to TTFT.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # to stderr, which the harness captures as the server log
        sys.stderr.write("fake-engine: " + (fmt % args) + "\n")

    def send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str) -> None:
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_GET(self):
        if self.path == "/health":
            if time.monotonic() - self.fake.started < self.fake.opts.slow_start:
                return self.send_json(503, {"status": "loading"})
            return self.send_json(200, {"status": "ok"})
        if self.path == "/version":
            return self.send_json(200, {"engine": NAME, "version": VERSION, "native": f"{NAME} {VERSION}"})
        return self.send_error_json(404, f"no route {self.path}")

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except json.JSONDecodeError as exc:
                raise HttpError(400, f"malformed JSON: {exc}") from None
            if not isinstance(body, dict):
                raise HttpError(400, "the body must be a JSON object")
            if self.path == "/tokenize":
                ids = self.fake.tokenize(body)
                return self.send_json(200, {"tokens": ids, "count": len(ids)})
            if self.path in ("/v1/completions", "/v1/chat/completions"):
                return self.complete(check_fields(body), chat=self.path.endswith("chat/completions"))
            raise HttpError(404, f"no route {self.path}")
        except HttpError as exc:
            self.send_error_json(exc.status, str(exc))

    def complete(self, body: dict, chat: bool) -> None:
        opts = self.fake.opts
        if opts.hang:
            while True:
                time.sleep(3600)
        prompt = self.fake.prompt_ids(body, chat)
        if len(prompt) + body.get("max_tokens", 16) > opts.max_context:
            raise HttpError(400, f"prompt ({len(prompt)}) + max_tokens exceed the context ({opts.max_context})")
        n_out = max(0, body.get("max_tokens", 16) - opts.completion_short)
        with self.fake.lock:
            cached = 0
            if body.get("cache_prompt", True):
                prev = self.fake.previous
                while cached < min(len(prev), len(prompt) - 1) and prev[cached] == prompt[cached]:
                    cached += 1
            cached = max(cached, opts.report_cached)
            self.fake.previous = list(prompt)
            t0 = time.perf_counter()
            time.sleep(opts.prefill_us * 1e-6 * max(0, len(prompt) - cached))
            t1 = time.perf_counter()
            text_ids = encode(self.fake.output_text(body)) or [OFFSET + 32]
            out = [text_ids[i % len(text_ids)] for i in range(n_out)]
            usage = {"prompt_tokens": len(prompt) + opts.prompt_extra, "completion_tokens": n_out,
                     "total_tokens": len(prompt) + opts.prompt_extra + n_out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            mem = {"kv_bytes": opts.max_context * 64, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
            if body.get("stream"):
                self.stream(body, chat, out, cached, usage, mem, t0, t1, len(prompt) + opts.prompt_extra)
            else:
                for _ in out:
                    time.sleep(opts.decode_ms * 1e-3)
                t2 = time.perf_counter()
                text = "" if opts.broken_output else decode(out)
                choice = {"index": 0, "finish_reason": "length"}
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                if body.get("return_tokens"):
                    choice["tokens"] = out
                self.send_json(200, {"id": "fake-1", "object": "chat.completion" if chat else "text_completion",
                                     "created": 0, "model": opts.model, "choices": [choice], "usage": usage,
                                     "tokens_cached": cached,
                                     "timings": timings(usage["prompt_tokens"] - cached, n_out, cached, t0, t1, t2),
                                     "memory": mem})

    def stream(self, body, chat, out, cached, usage, mem, t0, t1, prompt_n) -> None:
        opts = self.fake.opts
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def event(obj) -> None:
            data = "{not json" if opts.malformed_sse and obj != "[DONE]" else (obj if obj == "[DONE]" else json.dumps(obj))
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        if chat:
            event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        for i, tok in enumerate(out):
            if opts.crash_after is not None and i >= opts.crash_after:
                sys.stderr.write("fake-engine: crashing mid-stream as asked\n")
                sys.stderr.flush()
                os._exit(9)
            time.sleep(opts.decode_ms * 1e-3)
            piece = "" if opts.broken_output else decode([tok])
            last = i == len(out) - 1
            choice = {"index": 0, "finish_reason": "length" if last else None, "tokens": [tok]}
            choice.update({"delta": {"content": piece}} if chat else {"text": piece})
            chunk = {"choices": [choice]}
            if last:
                chunk.update({"timings": timings(prompt_n - cached, len(out), cached, t0, t1, time.perf_counter()),
                              "tokens_cached": cached, "memory": mem})
            event(chunk)
        t2 = time.perf_counter()
        if (body.get("stream_options") or {}).get("include_usage"):
            event({"choices": [], "usage": usage, "tokens_cached": cached, "memory": mem,
                   "timings": timings(prompt_n - cached, len(out), cached, t0, t1, t2)})
        event("[DONE]")


def timings(prompt_n: int, predicted_n: int, cached: int, t0: float, t1: float, t2: float) -> dict:
    prompt_ms, predicted_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms, "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "prompt_per_second": prompt_n / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
            "predicted_per_second": predicted_n / (predicted_ms / 1e3) if predicted_ms > 0 else 0.0,
            "cache_n": cached}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="store_true", help="print the native engine string and exit")
    sub = p.add_subparsers(dest="command")
    conv = sub.add_parser("convert", help="'convert' a model: copies it (the fake has no weights)")
    conv.add_argument("src")
    conv.add_argument("out")
    s = sub.add_parser("serve")
    s.add_argument("--model", default="tiny")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--max-context", type=int, default=2048)
    env = lambda name, default: os.environ.get("FAKE_ENGINE_" + name.upper().replace("-", "_"), default)  # noqa: E731
    s.add_argument("--prefill-us", type=float, default=float(env("prefill-us", 20.0)), help="simulated µs per prompt token")
    s.add_argument("--decode-ms", type=float, default=float(env("decode-ms", 1.0)), help="simulated ms per generated token")
    s.add_argument("--output-text", default=env("output-text", DEFAULT_OUTPUT))
    for flag in ("prompt-extra", "completion-short", "report-cached", "tokenize-extra"):
        s.add_argument(f"--{flag}", type=int, default=int(env(flag, 0)))
    for flag in ("broken-output", "hang", "malformed-sse", "fail-start"):
        s.add_argument(f"--{flag}", action="store_true", default=env(flag, "") not in ("", "0"))
    crash = env("crash-after", None)
    s.add_argument("--crash-after", type=int, default=int(crash) if crash is not None else None)
    s.add_argument("--slow-start", type=float, default=float(env("slow-start", 0.0)))
    s.add_argument("--once-text", default=env("once-text", None))
    s.add_argument("--once-file", default=env("once-file", None))
    s.add_argument("--once-count", type=int, default=int(env("once-count", 1)))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.version:
        print(f"{NAME} {VERSION}")
        return 0
    if args.command == "convert":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"fake": True, "src": Path(args.src).name}))
        return 0
    if args.command != "serve":
        parser().print_help()
        return 2
    if args.fail_start:
        sys.stderr.write("fake-engine: failing to start as asked\n")
        return 3
    Handler.fake = Fake(args)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    sys.stderr.write(f"fake-engine {VERSION} listening on {args.host}:{args.port}\n")
    sys.stderr.flush()
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
