"""The request side of the engine's HTTP API: field validation in the OpenAI and llama.cpp
dialects (docs/contracts.md §1, docs/engines.md), OpenAI-shaped errors, and stop strings.

Known fields must have the documented types; unknown fields are ignored; fields whose meaning the
server does not implement (``UNSUPPORTED``) are refused with a 400 naming them unless they ask for
the default, so a client never gets a silently different answer.
"""

from __future__ import annotations

import json
import math

DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 0.8  # llama.cpp's default
#: OpenAI's documented range of ``temperature`` is [0, 2]; beyond it (Infinity, 1e309) is refused
MAX_TEMPERATURE = 2.0
MAX_STOP = 16


class RequestError(Exception):
    """A request the server refuses: becomes an OpenAI-shaped ``{"error": {...}}`` with a 4xx status."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    """A finite JSON number (not a bool; never NaN or an infinity)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return is_int(x) or math.isfinite(x)


def check_strings(body) -> None:
    """Refuse a body holding a string with a lone UTF-16 surrogate (JSON's ``"\\ud800"``): it is no
    text, no tokenizer can take it, and it once got a 500. RequestError names where it is."""
    stack = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError(f"field '{where or 'body'}' holds a lone UTF-16 surrogate, which is not text",
                                   param=where or None) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((f"{where}.{k}" if where else str(k), k))
                stack.append((f"{where}.{k}" if where else str(k), v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))


def get_field(body: dict, key: str, check, what: str, default, where: str = ""):
    value = body.get(key)
    if value is None:
        return default
    if not check(value):
        raise RequestError(f"field '{where}{key}' must be {what}, got {json.dumps(value)[:80]}", param=where + key)
    return value


# field -> (is the value the default, i.e. harmless?, what to say)
UNSUPPORTED = {
    "n": (lambda v: v == 1, "only n = 1 is supported (one choice per request)"),
    "best_of": (lambda v: v == 1, "best_of is not supported"),
    "logprobs": (lambda v: v is False or v == 0, "logprobs are not supported"),
    "top_logprobs": (lambda v: v == 0, "top_logprobs are not supported"),
    "echo": (lambda v: v is False, "echo is not supported"),
    "suffix": (lambda v: v == "", "suffix (insertion) is not supported"),
    "presence_penalty": (lambda v: v == 0, "presence_penalty is not supported"),
    "frequency_penalty": (lambda v: v == 0, "frequency_penalty is not supported"),
    "logit_bias": (lambda v: v == {}, "logit_bias is not supported"),
    "top_p": (lambda v: v == 1, "top_p < 1 is not supported (sampling is greedy or plain temperature)"),
    "tools": (lambda v: v == [], "tools are not supported"),
    "tool_choice": (lambda v: v == "none", "tool_choice is not supported"),
    "functions": (lambda v: v == [], "functions are not supported"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text",
                        "response_format other than text is not supported"),
}


def parse_common(body: dict) -> dict:
    for key, (harmless, why) in UNSUPPORTED.items():
        if body.get(key) is not None and not harmless(body[key]):
            raise RequestError(f"field '{key}': {why} (got {json.dumps(body[key])[:80]})", param=key,
                               code="unsupported_field")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RequestError(f"field 'stream_options' must be an object, got {json.dumps(opts)[:80]}",
                           param="stream_options")
    include_usage = get_field(opts or {}, "include_usage", lambda v: isinstance(v, bool), "a boolean", False,
                         "stream_options.")
    count = lambda v: is_int(v) and v >= 0  # noqa: E731
    max_tokens = get_field(body, "max_tokens", count, "an integer >= 0", None)
    max_completion = get_field(body, "max_completion_tokens", count, "an integer >= 0", None)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise RequestError(f"fields 'max_tokens' ({max_tokens}) and 'max_completion_tokens' ({max_completion}) "
                           "disagree; send one of them", param="max_completion_tokens")
    return {
        "max_tokens": next((v for v in (max_completion, max_tokens) if v is not None), DEFAULT_MAX_TOKENS),
        "temperature": float(get_field(body, "temperature", lambda v: _is_num(v) and 0 <= v <= MAX_TEMPERATURE,
                                       f"a number in [0, {MAX_TEMPERATURE:g}]", DEFAULT_TEMPERATURE)),
        "seed": get_field(body, "seed", lambda v: is_int(v) and -2**63 <= v < 2**64,
                          "an integer in [-2^63, 2^64)", None),
        "stream": get_field(body, "stream", lambda v: isinstance(v, bool), "a boolean", False),
        "include_usage": include_usage,
        "ignore_eos": get_field(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False),
        "cache_prompt": get_field(body, "cache_prompt", lambda v: isinstance(v, bool), "a boolean", True),
        "return_tokens": get_field(body, "return_tokens", lambda v: isinstance(v, bool), "a boolean", False),
        "stop": parse_stop(body.get("stop")),
    }


def parse_stop(stop) -> list[str]:
    """``stop``: a string or a list of up to MAX_STOP non-empty strings."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise RequestError(f"field 'stop' must be a non-empty string or a list of at most {MAX_STOP} non-empty "
                           f"strings, got {json.dumps(stop)[:80]}", param="stop")
    return stops


def parse_messages(body: dict) -> list[dict]:
    """{role, content} messages; content is a string or a list of ``{"type": "text", "text"}`` parts
    (joined, as the OpenAI API defines them)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("field 'messages' must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else None
                    raise RequestError(f"{where}: only text parts ({{\"type\": \"text\", \"text\": str}}) are "
                                       f"supported, got type {json.dumps(kind)}", param=where)
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or a list of text parts",
                               param=f"messages[{i}].content")
        out.append({"role": m["role"], "content": content})
    return out


class StopMatcher:
    """Cuts generated text at the first stop string. Text that could still be the start of a stop
    string is held back until the next piece decides it, so a stream never shows part of a stop."""

    def __init__(self, stops: list[str]):
        self.stops, self.held = stops, ""

    def push(self, piece: str) -> tuple[str, bool]:
        """(text that is safe to emit, whether a stop string was found)."""
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return text[:min(hits)], True
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
