"""A toy inference server for the exchange tests: one token per character, in one of two stream shapes.

``python tests/engines/toy_server.py --port P --shape sse|ndjson [--record FILE] [--token-s S]``

- A prompt's tokens are its messages' characters (no template): ``POST /tokenize`` with
  ``{"messages"}`` answers ``{"tokens": [ord(c), ...]}``.
- ``POST /v1/chat/completions`` generates ``max_tokens`` tokens (letters ``a``, ``b``, ... in turn),
  one every *S* seconds, and ends with the usage (``prompt_tokens``, ``completion_tokens``) and
  llama.cpp-style ``timings.prompt_n`` (every prompt token evaluated) with ``tokens_cached: 0``.
  Shape ``sse``: server-sent OpenAI chunks, ``data: {...}`` lines and ``data: [DONE]``. Shape
  ``ndjson``: one JSON object a line, ``{"token": {"id", "text"}}``, and last ``{"done": true, ...}``
  with the usage, as a server that does not speak SSE would.
- Every request body is appended to *FILE* as one JSON line (what the engine was asked).

Several requests are served at once (a thread each), so a load level runs against it too.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def prompt_tokens(messages: list[dict]) -> list[int]:
    return [ord(c) for m in messages for c in m["content"]]


class Handler(BaseHTTPRequestHandler):
    shape = "sse"
    record: str | None = None
    token_s = 0.002

    def log_message(self, *args):  # quiet: the test reads the recorded bodies, not a log
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": f"no {self.path}"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            ids = prompt_tokens(body["messages"])
            self._json(200, {"tokens": ids, "count": len(ids)})
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": f"no {self.path}"})
            return
        if self.record:
            with LOCK, open(self.record, "a") as fh:
                fh.write(json.dumps(body) + "\n")
        n_prompt, n = len(prompt_tokens(body["messages"])), int(body["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if self.shape == "sse" else "application/x-ndjson")
        self.end_headers()
        final = {"usage": {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n},
                 "timings": {"prompt_n": n_prompt, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": n * 1e3 * self.token_s},
                 "tokens_cached": 0}
        for i in range(n):
            time.sleep(self.token_s)
            text = chr(ord("a") + i % 26)
            if self.shape == "sse":
                self._line("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text},
                                                               "tokens": [ord(text)], "finish_reason": None}]}))
                self._line("")
            else:
                self._line(json.dumps({"token": {"id": ord(text), "text": text}}))
        if self.shape == "sse":
            self._line("data: " + json.dumps({"choices": [], **final}))
            self._line("")
            self._line("data: [DONE]")
            self._line("")
        else:
            self._line(json.dumps({"done": True, **final}))

    def _line(self, text: str) -> None:
        self.wfile.write((text + "\n").encode())
        self.wfile.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--shape", choices=["sse", "ndjson"], default="sse")
    ap.add_argument("--record")
    ap.add_argument("--token-s", type=float, default=0.002)
    args = ap.parse_args()
    Handler.shape, Handler.record, Handler.token_s = args.shape, args.record, args.token_s
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
