"""HTTP client for an arm's server (docs/contracts.md §1), with client-side streaming timings.

Timing is taken on the client from the arrival of streamed chunks, with ``time.perf_counter``:
``ttft`` is request send → first chunk carrying a generated token; decode speed is
``(tokens − 1) / (last token − first token)``, so it excludes prefill. The engine's own ``usage``,
``timings``, ``tokens_cached`` and ``memory`` are kept verbatim beside them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx


class ClientError(Exception):
    """A request failed: connection, HTTP status, malformed SSE, or a stream cut short."""


@dataclass
class StreamResult:
    """One streamed completion as the client saw it. Times are seconds since the request was sent."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # one per generated token received
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None
    tokens_cached: int | None = None
    memory: dict | None = None
    e2e_s: float = 0.0
    done: bool = False  # saw the end of the stream (SSE: ``data: [DONE]``)
    events: int = 0  # events read so far (an error names the one it could not read)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def reply(self) -> dict:
        """The final reply's top-level fields, where an engine's profile looks for its gate evidence."""
        return {"usage": self.usage, "timings": self.timings, "tokens_cached": self.tokens_cached}


LineReader = Callable[[StreamResult, str, float], bool]
"""How one line of a streamed reply is read: ``read(result, line, now) -> True`` at the end of the
stream, the line's tokens stamped with *now* (s since the request was sent); a line that cannot be
read raises :class:`ClientError`. :func:`read_sse_line` is the OpenAI-compatible servers' shape; an
engine that streams another overrides :meth:`pairbench.engines.adapter.ArmEngine.read_line`."""


_CLIENT: httpx.Client | None = None


def http() -> httpx.Client:
    """The process's one HTTP client.

    Reused on purpose: building an ``httpx.Client`` costs ~0.1-0.2 s (TLS context), which would
    otherwise land inside every measured TTFT. ``trust_env=False``: a proxy from the environment
    must never sit between the harness and a server on 127.0.0.1.
    """
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = httpx.Client(trust_env=False, timeout=httpx.Timeout(60.0, connect=10.0))
    return _CLIENT


def base_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}"


def get_json(url: str, path: str, timeout: float = 10.0) -> dict:
    try:
        resp = http().get(url + path, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ClientError(f"GET {path}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ClientError(f"GET {path}: HTTP {resp.status_code}: {resp.text[:200]}")
    return resp.json()


def tokenize_messages(url: str, messages: list[dict], timeout: float = 60.0) -> list[int]:
    """Native token ids of *messages* with the chat template and generation prompt applied."""
    try:
        resp = http().post(url + "/tokenize", json={"messages": messages}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ClientError(f"POST /tokenize: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ClientError(f"POST /tokenize: HTTP {resp.status_code}: {resp.text[:200]}")
    body = resp.json()
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise ClientError(f"POST /tokenize: reply has no 'tokens' list: {str(body)[:200]}")
    return tokens


def steady_request_body(messages: list[dict], max_tokens: int, seed: int) -> dict:
    """The one request shape used for every measured request: greedy, exact length, cache off."""
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }


def sse_event(line: str, n_events: int):
    """The JSON object of one server-sent ``data:`` line (the *n_events*-th event); ``None`` for a
    line that is not data; ``...`` for ``[DONE]``. A ``ClientError`` for malformed data."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return ...
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise ClientError(f"malformed SSE: event {n_events} is not JSON: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise ClientError(f"malformed SSE: event {n_events} is not a JSON object")
    return chunk


def absorb_chunk(result: StreamResult, chunk: dict, now: float) -> None:
    for key in ("usage", "timings", "memory"):
        if chunk.get(key) is not None:
            setattr(result, key, chunk[key])
    if chunk.get("tokens_cached") is not None:
        result.tokens_cached = chunk["tokens_cached"]
    for choice in chunk.get("choices") or []:
        piece = choice.get("text")
        if piece is None:
            piece = (choice.get("delta") or {}).get("content")
        ids = choice.get("tokens")
        if ids is None and isinstance(chunk.get("__verbose"), dict):
            # llama-server's OpenAI-compatible stream carries a chunk's token ids only in its debug
            # copy of the native reply ("verbose": true in the request); its last chunk has none
            ids = chunk["__verbose"].get("tokens")
        n = len(ids) if isinstance(ids, list) else (1 if piece else 0)
        if isinstance(ids, list):
            result.token_ids.extend(ids)
        if piece:
            result.text += piece
        result.token_times.extend([now] * n)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


def read_sse_line(result: StreamResult, line: str, now: float) -> bool:
    """One line of a server-sent event stream of OpenAI-compatible chunks (:data:`LineReader`):
    a ``data:`` line's chunk goes into *result*; ``data: [DONE]`` ends the stream; other lines
    (comments, blank separators) are skipped."""
    if not line.startswith("data:"):
        return False
    result.events += 1
    chunk = sse_event(line, result.events)
    if chunk is ...:
        return True
    absorb_chunk(result, chunk, now)
    return False


def stream_chat(url: str, body: dict, timeout: float, on_token=None,
                path: str = "/v1/chat/completions", read_line: LineReader = read_sse_line) -> StreamResult:
    """POST a streamed completion and time every token's arrival.

    *on_token*, if given, is called with the number of tokens received so far each time it grows
    (progress reporting; it must be cheap, it runs inside the timed loop). *read_line* reads the
    stream's shape (default: server-sent events of OpenAI-compatible chunks).

    Raises :class:`ClientError` on a non-200 status, a line *read_line* cannot read, a stream that
    ends without its end (SSE: ``[DONE]``), or when the whole request takes longer than *timeout* seconds.
    """
    result = StreamResult()
    t0 = time.perf_counter()
    deadline = t0 + timeout
    try:
        with http().stream("POST", url + path, json=body,
                          timeout=httpx.Timeout(timeout, connect=10.0)) as resp:
            if resp.status_code != 200:
                resp.read()
                raise ClientError(f"POST {path}: HTTP {resp.status_code}: {resp.text[:200]}")
            for line in resp.iter_lines():
                now = time.perf_counter() - t0
                if time.perf_counter() > deadline:
                    raise ClientError(f"request exceeded {timeout:g} s (after {len(result.token_times)} tokens)")
                before = len(result.token_times)
                if read_line(result, line, now):
                    result.done = True
                    break
                if on_token is not None and len(result.token_times) > before:
                    on_token(len(result.token_times))
    except httpx.TimeoutException:
        raise ClientError(f"request timed out after {timeout:g} s (after {len(result.token_times)} tokens)") from None
    except httpx.HTTPError as exc:
        raise ClientError(
            f"stream broke after {len(result.token_times)} tokens: {type(exc).__name__}: {exc}"
        ) from None
    result.e2e_s = time.perf_counter() - t0
    if not result.done:
        raise ClientError(f"stream ended without [DONE] after {len(result.token_times)} tokens")
    return result
