"""Generation as small pure functions over a loaded model (after gpt-fast's generate.py).

prefill -> logits of the last prompt token; decode_one -> logits of the next token; sample -> an id.
The KV cache lives in the model (``Transformer.setup_cache``); callers say which positions they
write, which is how a cached common prefix is reused. These functions drive one sequence in slot 0
(the library path, tests and benchmarks); the server's many sequences are driven by
``engine/scheduler.py``, which calls the same forward passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .model import Transformer


#: Prompt tokens per forward pass of the prefill. Chunks bound every activation of a long prompt
#: (the (T, 2 * hidden) MLP output is T * 24 KiB for SmolLM2; a later chunk's attention mask is
#: T * S * 4 bytes, 32 MiB at S = 8192) near glibc's 32 MiB mmap ceiling, so the server's malloc
#: settings keep them mapped between requests; and they bound the prefill's peak memory.
PREFILL_CHUNK = 1024


@torch.inference_mode()
def prefill(model: Transformer, token_ids: list[int], start: int = 0) -> torch.Tensor:
    """Run ``token_ids`` at positions start.. through the model, ``PREFILL_CHUNK`` tokens per pass;
    (vocab,) float32 logits of the last one."""
    logits = None
    for c in range(0, len(token_ids), PREFILL_CHUNK):
        tokens = torch.tensor([token_ids[c:c + PREFILL_CHUNK]], dtype=torch.long)  # (1, T)
        logits = model(tokens, start + c)
    return logits


@torch.inference_mode()
def decode_one(model: Transformer, token_id: int, pos: int) -> torch.Tensor:
    """Feed one token at position ``pos``; (vocab,) float32 logits for position pos + 1."""
    return model(torch.tensor([[token_id]], dtype=torch.long), pos)


@contextmanager
def intra_op_threads(n: int | None):
    """Run the enclosed ops on ``n`` torch intra-op threads (None: leave the count alone).

    Why decode gets its own count: a decode step is a chain of small ops (GEMVs over 576-wide rows,
    attention over one query), and with 2 threads each ends in an OpenMP barrier; when the other core
    is busy those barriers stall, and measured decode was several times slower than on 1 thread
    (docs/perf.md). Prefill is a few big GEMMs and keeps every thread.
    """
    if n is not None and n < 1:
        raise ValueError(f"intra_op_threads: n must be >= 1, got {n}")
    if n is None or n == torch.get_num_threads():
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def sample(logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None) -> int:
    """Greedy (argmax, deterministic) at temperature 0, else a draw from softmax(logits / T).

    A temperature so small that logits / T overflows (1e-38 once gave NaN probabilities and a 500)
    is drawn from softmax((logits - max) / T) in float64 instead, the same distribution computed
    where it is finite (the top logit is 0, the rest towards -inf); where even that is undefined (a
    T that rounds to 0), the limit T -> 0: greedy."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / temperature
    if not bool(torch.isfinite(scaled).all()):
        scaled = (logits.double() - logits.max()) / temperature
        if bool(torch.isnan(scaled).any()):
            return int(torch.argmax(logits))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_limit(prompt_len: int, max_tokens: int, max_context: int) -> int:
    """How many tokens ``generate`` may yield: the first comes from the prefill logits, each later
    one needs the previous token's KV at positions prompt_len.. < max_context."""
    return max(0, min(max_tokens, max_context - prompt_len + 1))


def generate(model: Transformer, prompt_ids: list[int], max_tokens: int, *, stop_ids=frozenset(),
             temperature: float = 0.0, seed: int | None = None, ignore_eos: bool = False,
             start: int = 0, decode_threads: int | None = None) -> Iterator[int]:
    """Yield up to ``token_limit(...)`` generated ids. Positions < ``start`` must already hold this
    prompt's KV (a reused prefix). Stops early at a stop id (not yielded) unless ``ignore_eos``.
    ``decode_threads`` sets the intra-op threads of each decode step (prefill keeps the process's).

    Afterwards the cache holds the prompt plus every yielded token except the last one when the
    limit was reached (it was never fed back); after a stop id it holds all yielded tokens."""
    if not 0 <= start < len(prompt_ids):
        raise ValueError(f"start {start} must lie inside the prompt of {len(prompt_ids)} tokens")
    if len(prompt_ids) > model.max_context:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds max_context {model.max_context}")
    generator = None
    if temperature > 0:
        generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    limit = token_limit(len(prompt_ids), max_tokens, model.max_context)
    logits = prefill(model, prompt_ids[start:], start)  # even for limit 0: it fills the cache, as llama.cpp does
    pos = len(prompt_ids)
    for i in range(limit):
        token = sample(logits, temperature, generator)
        if token in stop_ids and not ignore_eos:
            return
        yield token
        if i + 1 == limit:
            return
        with intra_op_threads(decode_threads):
            logits = decode_one(model, token, pos)
        pos += 1


def forward_logits(loaded, token_ids: list[int]) -> torch.Tensor:
    """(T, vocab) float32 logits of a full causal forward over ``token_ids`` (overwrites the cache)."""
    with torch.inference_mode():
        return loaded.model(torch.tensor([token_ids], dtype=torch.long), 0, all_logits=True)


def greedy(loaded, token_ids: list[int], max_tokens: int, ignore_eos: bool = True) -> list[int]:
    """Greedy continuation of ``token_ids`` (fresh cache, no prefix reuse)."""
    return list(generate(loaded.model, token_ids, max_tokens, stop_ids=loaded.tokenizer.stop_ids,
                         ignore_eos=ignore_eos))
