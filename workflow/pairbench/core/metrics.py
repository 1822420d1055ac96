"""The registry of metrics: unit, orientation, the question each one answers, and where a record
holds it. Everything else reads it: the measurements table's columns, the config's defaults
and the schemas' enums (a test checks those against :data:`METRICS`), the statistics, the plots
and the report.

Units live in the names (``decode_tok_s``, ``ttft_ms``, ``kv_bytes``). Two metrics answer one
*question* when one is a function of the other (prefill tok/s = length / TTFT) or they measure the
same thing from two sides (client and engine decode tok/s): a run tests at most one per question
(``stats.metrics``) and may show the others (``stats.secondary``) without testing them again.

Adding a metric (p99 inter-token latency, say) is one entry here, plus the line of the measuring
code that puts it into each steady record at ``record``.

Each metric has a *scope*: ``request`` (one steady request, measured one at a time) or ``level``
(one load level of a load run: many concurrent requests, :mod:`pairbench.analysis.loadlevel`, read
from the level record's ``metrics``). A run measures one scope only, so ``stats`` lists metrics of
one scope. A level's validity facts (achieved load, schedule lag, client CPU) are registry columns
too (``fact``), shown and disclosed, never tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pairbench.core.configsource import ConfigError


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    label: str
    question: str
    memory: bool = False
    record: tuple[str, ...] = ()  # its path in a record (default: its own name at the top)
    scope: str = "request"  # "request": a steady record's; "level": a load level record's
    fact: bool = False  # a level's validity fact (achieved load, lag, client CPU): a column, never tested
    percentile: int | None = None  # the latency percentile a level metric states (ttft_p90_ms: 90)

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


# The latency percentiles a load level may state as metrics (config load.percentiles is a subset).
PERCENTILES = (50, 90, 99)
SCOPES = ("request", "level")  # and "cost": COST_METRICS, never a record's
# A load level's latencies, each stated at percentiles (pairbench.analysis.loadlevel defines them)
LEVEL_LATENCIES = ("ttft", "itl", "tpot", "e2e")


def latency_metric(latency: str, q: float) -> str:
    """The name of a load level's latency percentile: ``latency_metric("ttft", 99) == "ttft_p99_ms"``
    (``p99_9`` for 99.9)."""
    return f"{latency}_p{q:g}_ms".replace(".", "_")


def _level(name: str, unit: str, higher: bool, label: str, question: str, fact: bool = False,
           percentile: int | None = None) -> Metric:
    return Metric(name, unit, higher, label, question, record=("metrics", name), scope="level", fact=fact,
                  percentile=percentile)


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
    # a load level (analysis/loadlevel.py defines each); the questions are a load run's own
    _level("output_tok_s", "tok/s", True, "output throughput (whole system)", "throughput"),
    _level("requests_s", "req/s", True, "request throughput", "throughput"),
    _level("goodput_rps", "req/s", True, "goodput (requests meeting the SLO)", "goodput"),
    _level("slo_attainment", "share", True, "SLO attainment", "goodput"),
    # per percentile one question; ITL and TPOT measure decode latency from two sides (gaps, means)
    *(_level(latency_metric(lat, q), "ms", False, f"p{q} {words}", f"{question} p{q}", percentile=q)
      for lat, words, question in zip(LEVEL_LATENCIES, ("time to first token", "inter-token latency",
                                                        "time per output token", "end-to-end latency"),
                                      ("ttft", "decode", "decode", "e2e"))
      for q in PERCENTILES),
    _level("achieved_concurrency", "streams", True, "achieved concurrency", "achieved load", fact=True),
    _level("achieved_rate_rps", "req/s", True, "achieved request rate", "achieved load", fact=True),
    _level("lag_p99_ms", "ms", False, "p99 schedule lag", "client", fact=True),
    _level("client_cpu_s", "s", False, "client CPU time", "client", fact=True),
    _level("client_cpu_share", "share", False, "client CPU share of a core", "client", fact=True),
)
NAMES = SimpleNamespace(**{name: name for name in METRICS})
"""The registry's names as attributes (``NAMES.ttft_ms == "ttft_ms"``): code that writes or reads a
metric names it through here, so a name the registry lacks fails where it is used (AttributeError)
instead of adding a field no table, schema or verdict knows."""
SPEED_METRICS = tuple(m for m, v in METRICS.items() if not v.memory and not v.fact)
MEMORY_METRICS = tuple(m for m, v in METRICS.items() if v.memory)
LEVEL_METRICS = tuple(m for m, v in METRICS.items() if v.scope == "level")
QUESTIONS = {q: tuple(m for m, v in METRICS.items() if v.question == q)
             for q in dict.fromkeys(v.question for v in METRICS.values())}
DEFAULT_METRICS = ("decode_tok_s", "prefill_tok_s")
DEFAULT_SECONDARY = ("ttft_ms", "e2e_ms")
DEFAULT_MEMORY = ("kv_bytes", "peak_rss_bytes")


def scope_of(names) -> str | None:
    """The scope of the first metric of *names* that the registry knows (None: none known)."""
    return next((METRICS[n].scope for n in names if n in METRICS), None)


def percentile_of(name: str) -> int | None:
    """The latency percentile the metric *name* states (``ttft_p90_ms`` → 90); None for any other name."""
    m = METRICS.get(name)
    return m.percentile if m else None


def load_defaults(percentiles, slo: bool = True) -> dict[str, tuple[str, ...]]:
    """A load run's default ``stats`` lists, for its ``load.percentiles``: output throughput and the
    highest percentile's TTFT tested (one per question: ``output_tok_s``, ``ttft_p99_ms`` with the
    default percentiles); request throughput, goodput (with an SLO) and the highest ITL and e2e
    percentiles shown."""
    top = max(percentiles)
    return {"metrics": ("output_tok_s", f"ttft_p{top}_ms"),
            "secondary": ("requests_s", *(("goodput_rps",) if slo else ()), f"itl_p{top}_ms", f"e2e_p{top}_ms"),
            "memory": ()}


# Metrics other modules ask for by their role (a name alone: NAMES), so that no module but this one
# spells a metric's name (tests/pairbench/test_registries.py checks): what an engine's own benchmark
# tool measures beside ours (engine-reported first, the closest to what the tool times), and a load
# level's achieved load by the run's load factor.
TOOL_COUNTERPARTS = {"prefill": (NAMES.engine_prefill_tok_s, NAMES.prefill_tok_s),
                     "decode": (NAMES.engine_decode_tok_s, NAMES.decode_tok_s)}
ACHIEVED_LOAD = {"concurrency": NAMES.achieved_concurrency, "rate": NAMES.achieved_rate_rps}

#: The cost channel's metrics (pairbench.measure.cost, docs/cost.md): counts per token under a
#: simulator, one fixed request per arm and condition, never a record's column. Their own registry,
#: not METRICS: a count has no per-request samples, so no table column, no interval and no place in
#: ``stats``; the cost verdict reads their exact ratio (pairbench.analysis.cost). Each sits beside the
#: wall-time metric of its question (COST_COUNTERPARTS).
COST_METRICS: dict[str, Metric] = _metrics(*(
    Metric(f"{phase}_{what}_per_tok", f"{what}/token", False, f"{words} per {phase} token (simulated)", phase,
           scope="cost")
    for phase in ("decode", "prefill")
    for what, words in (("instructions", "instructions"), ("cycles", "estimated cycles"))))
COST_NAMES = SimpleNamespace(**{name: name for name in COST_METRICS})
"""The cost channel's names as attributes (``COST_NAMES.decode_instructions_per_tok``), as :data:`NAMES`."""
COST_PHASES = ("decode", "prefill")
#: the wall-clock metrics a cost metric's phase is compared with, in order: the first one the run tests
#: (a primary metric, with a verdict) is the counterpart; the client's figure when the run tests both
COST_COUNTERPARTS = {"decode": (NAMES.decode_tok_s, NAMES.engine_decode_tok_s),
                     "prefill": (NAMES.prefill_tok_s, NAMES.engine_prefill_tok_s)}


def cost_metric(phase: str, what: str) -> str:
    """The cost channel's metric of *phase* (``decode``, ``prefill``) and *what* (``instructions``,
    ``cycles``): ``cost_metric("decode", "cycles") == COST_NAMES.decode_cycles_per_tok``."""
    name = f"{phase}_{what}_per_tok"
    if name not in COST_METRICS:
        raise KeyError(f"no cost metric for phase {phase!r} and {what!r}")
    return name


#: Level metrics that are 0 whenever no request met the SLO: a paired log ratio cannot hold them, so
#: they are shown (secondary), never tested
NOT_TESTABLE = ("goodput_rps", "slo_attainment")


def check_metric_lists(metrics, secondary=(), memory=(), where: str = "stats",
                       scope: str | None = None) -> tuple[tuple, tuple, tuple]:
    """Check the primary, secondary and memory lists; a :class:`~pairbench.core.configsource.ConfigError`
    (a ``ValueError``) carries the config key (``stats.metrics``, ``stats.secondary``, ``stats.memory``). Every tested or shown metric must be
    of one *scope* (default: the first primary metric's): ``level`` for a load run, ``request``
    otherwise; a load run has no memory metrics."""
    metrics, secondary, memory = tuple(metrics), tuple(secondary), tuple(memory)
    if not metrics:
        raise ConfigError((where, "metrics"), "no primary metric listed")
    for key, names, allowed in (("metrics", metrics, SPEED_METRICS), ("secondary", secondary, SPEED_METRICS),
                                ("memory", memory, MEMORY_METRICS)):
        for name in names:
            if name not in allowed:
                raise ConfigError((where, key), f"{name!r} is not one of {', '.join(allowed)}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError((where, key), f"{', '.join(dup)} listed more than once")
    scope = scope or scope_of(metrics)
    for key, names in (("metrics", metrics), ("secondary", secondary), ("memory", memory)):
        other = [n for n in names if METRICS[n].scope != scope]
        if other:
            run = "a load run (load:) measures load levels" if scope == "level" else \
                "a run without load: measures one request at a time"
            allowed = [m for m in SPEED_METRICS if METRICS[m].scope == scope] if key != "memory" else \
                [m for m in MEMORY_METRICS if METRICS[m].scope == scope]
            raise ConfigError((where, key), f"{', '.join(other)} cannot be measured here: {run}; "
                             f"{key} may list {', '.join(allowed) or 'nothing'}")
    seen: dict[str, str] = {}
    for name in metrics:
        q = METRICS[name].question
        if q in seen:
            raise ConfigError(
                (where, "metrics"), f"{seen[q]} and {name} answer the same question ({q}); test one of them "
                f"and list the other under {where}.secondary, where it is shown but not tested again")
        seen[q] = name
    both = sorted(set(metrics) & set(secondary))
    if both:
        raise ConfigError((where, "secondary"), f"{', '.join(both)} is already a primary metric ({where}.metrics)")
    return metrics, secondary, memory
