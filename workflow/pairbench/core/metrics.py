"""The registry of metrics: unit, orientation and the question each one answers.

Units live in the names (``decode_tok_s``, ``ttft_ms``, ``kv_bytes``). Two metrics answer one
*question* when one is a function of the other (prefill tok/s = length / TTFT) or they measure the
same thing from two sides (client and engine decode tok/s): a run tests at most one per question
(``stats.metrics``) and may show the others (``stats.secondary``) without testing them again.
"""

from __future__ import annotations

from typing import Any

METRICS: dict[str, dict[str, Any]] = {
    "decode_tok_s": {"unit": "tok/s", "higher_is_better": True, "label": "decode throughput",
                     "question": "decode"},
    "prefill_tok_s": {"unit": "tok/s", "higher_is_better": True, "label": "prefill throughput",
                      "question": "prefill"},
    "engine_decode_tok_s": {"unit": "tok/s", "higher_is_better": True,
                            "label": "engine-reported decode throughput", "question": "decode"},
    "engine_prefill_tok_s": {"unit": "tok/s", "higher_is_better": True,
                             "label": "engine-reported prefill throughput", "question": "prefill"},
    "ttft_ms": {"unit": "ms", "higher_is_better": False, "label": "time to first token", "question": "prefill"},
    "e2e_ms": {"unit": "ms", "higher_is_better": False, "label": "end-to-end time", "question": "e2e"},
    "kv_bytes": {"unit": "bytes", "higher_is_better": False, "label": "KV cache size", "question": "kv memory",
                 "memory": True},
    "peak_rss_bytes": {"unit": "bytes", "higher_is_better": False, "label": "peak resident memory",
                       "question": "process memory", "memory": True},
}
SPEED_METRICS = tuple(m for m, v in METRICS.items() if not v.get("memory"))
MEMORY_METRICS = tuple(m for m, v in METRICS.items() if v.get("memory"))
QUESTIONS = {q: tuple(m for m, v in METRICS.items() if v["question"] == q)
             for q in dict.fromkeys(v["question"] for v in METRICS.values())}
DEFAULT_METRICS = ("decode_tok_s", "prefill_tok_s")
DEFAULT_SECONDARY = ("ttft_ms", "e2e_ms")
DEFAULT_MEMORY = ("kv_bytes", "peak_rss_bytes")


def check_metric_lists(metrics, secondary=(), memory=(), where: str = "stats") -> tuple[tuple, tuple, tuple]:
    """Check the primary, secondary and memory lists; a ``ValueError`` names the config key
    (``stats.metrics``, ``stats.secondary``, ``stats.memory``)."""
    metrics, secondary, memory = tuple(metrics), tuple(secondary), tuple(memory)
    if not metrics:
        raise ValueError(f"{where}.metrics: no primary metric listed")
    for key, names, allowed in (("metrics", metrics, SPEED_METRICS), ("secondary", secondary, SPEED_METRICS),
                                ("memory", memory, MEMORY_METRICS)):
        for name in names:
            if name not in allowed:
                raise ValueError(f"{where}.{key}: {name!r} is not one of {', '.join(allowed)}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{where}.{key}: {', '.join(dup)} listed more than once")
    seen: dict[str, str] = {}
    for name in metrics:
        q = METRICS[name]["question"]
        if q in seen:
            raise ValueError(
                f"{where}.metrics: {seen[q]} and {name} answer the same question ({q}); test one of them "
                f"and list the other under {where}.secondary, where it is shown but not tested again")
        seen[q] = name
    both = sorted(set(metrics) & set(secondary))
    if both:
        raise ValueError(f"{where}.secondary: {', '.join(both)} is already a primary metric ({where}.metrics)")
    return metrics, secondary, memory
