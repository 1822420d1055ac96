"""The registry of metrics: unit, orientation, the question each one answers, and where a steady
record holds it. Everything else reads it: the measurements table's columns, the config's defaults
and the schemas' enums (a test checks those against :data:`METRICS`), the statistics, the plots
and the report.

Units live in the names (``decode_tok_s``, ``ttft_ms``, ``kv_bytes``). Two metrics answer one
*question* when one is a function of the other (prefill tok/s = length / TTFT) or they measure the
same thing from two sides (client and engine decode tok/s): a run tests at most one per question
(``stats.metrics``) and may show the others (``stats.secondary``) without testing them again.

Adding a metric (p99 inter-token latency, say) is one entry here, plus the line of the measuring
code that puts it into each steady record at ``record``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    label: str
    question: str
    memory: bool = False
    record: tuple[str, ...] = ()  # its path in a steady record (default: its own name at the top)

    def value(self, record: dict) -> Any:
        """This metric's value in one steady record (None where it is not recorded)."""
        node: Any = record
        for key in self.record or (self.name,):
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node


def _metrics(*ms: Metric) -> dict[str, Metric]:
    return {m.name: m for m in ms}


METRICS: dict[str, Metric] = _metrics(
    Metric("decode_tok_s", "tok/s", True, "decode throughput", "decode"),
    Metric("prefill_tok_s", "tok/s", True, "prefill throughput", "prefill"),
    Metric("ttft_ms", "ms", False, "time to first token", "prefill"),
    Metric("e2e_ms", "ms", False, "end-to-end time", "e2e"),
    Metric("engine_decode_tok_s", "tok/s", True, "engine-reported decode throughput", "decode",
           record=("engine", "decode_tok_s")),
    Metric("engine_prefill_tok_s", "tok/s", True, "engine-reported prefill throughput", "prefill",
           record=("engine", "prefill_tok_s")),
    Metric("kv_bytes", "bytes", False, "KV cache size", "kv memory", memory=True),
    Metric("peak_rss_bytes", "bytes", False, "peak resident memory", "process memory", memory=True),
)
SPEED_METRICS = tuple(m for m, v in METRICS.items() if not v.memory)
MEMORY_METRICS = tuple(m for m, v in METRICS.items() if v.memory)
QUESTIONS = {q: tuple(m for m, v in METRICS.items() if v.question == q)
             for q in dict.fromkeys(v.question for v in METRICS.values())}
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
        q = METRICS[name].question
        if q in seen:
            raise ValueError(
                f"{where}.metrics: {seen[q]} and {name} answer the same question ({q}); test one of them "
                f"and list the other under {where}.secondary, where it is shown but not tested again")
        seen[q] = name
    both = sorted(set(metrics) & set(secondary))
    if both:
        raise ValueError(f"{where}.secondary: {', '.join(both)} is already a primary metric ({where}.metrics)")
    return metrics, secondary, memory
